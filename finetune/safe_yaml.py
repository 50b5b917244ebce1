"""YAML for recipes and overrides: PyYAML's safe loader, made strict about what it quietly accepts.

Three things plain `yaml.safe_load` lets through become one-line errors here:
- a key given twice in one mapping (YAML keeps the last one silently: a second `model:` once switched a
  run to random initialisation);
- aliases that expand to a huge document (the "billion laughs": a 1 kB recipe that is 10^9 values once
  expanded, which any later walk over it, an error message included, pays for);
- nesting deeper than any recipe needs (the composer is recursive and would hit Python's recursion limit).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_VALUES = 100_000  # values of the document with every alias expanded; real recipes have a few hundred
MAX_DEPTH = 64  # nested sections and lists; real recipes have 4


class YAMLProblem(ValueError):
    """What is wrong with a YAML text, with the 1-based line where known."""

    def __init__(self, problem: str, line: int | None = None):
        super().__init__(problem)
        self.problem, self.line = problem, line


class _StrictLoader(yaml.SafeLoader):
    """The safe loader, refusing duplicate keys within one mapping."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: its keys may be overridden here
                continue
            key, line = self.construct_object(key_node, deep=deep), key_node.start_mark.line + 1
            try:
                repeated = key in seen
            except TypeError:  # an unhashable key: the base class reports it with its own message
                break
            if repeated:
                lines = f"line {line}" if seen[key] == line else f"lines {seen[key]} and {line}"
                raise YAMLProblem(f"key '{key}' is given twice ({lines}); YAML would keep only the last one", line)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """Parse one YAML document strictly; raises YAMLProblem (one line, with its line number) on any problem."""
    loader = _StrictLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YAMLProblem(f"nested more than {MAX_DEPTH} levels deep") from None
        if node is None:
            return None
        _check_size(node)
        return loader.construct_document(node)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise YAMLProblem(f"invalid YAML: {problem}", mark.line + 1 if mark is not None else None) from None
    finally:
        loader.dispose()


def _check_size(root: Node) -> None:
    """Refuse documents nested past MAX_DEPTH or expanding (aliases included) to more than MAX_VALUES values."""
    # node id -> (values under it with aliases expanded, levels under it): a shared node is walked once
    measured: dict[int, tuple[int, int]] = {}

    def measure(node: Node) -> tuple[int, int]:
        if id(node) in measured:
            return measured[id(node)]
        total, height = 1, 0
        if not isinstance(node, ScalarNode):
            children = node.value if isinstance(node, SequenceNode) else [item for pair in node.value for item in pair]
            for child in children:
                child_total, child_height = measure(child)
                total, height = total + child_total, max(height, child_height + 1)
                if height > MAX_DEPTH:
                    raise YAMLProblem(f"nested more than {MAX_DEPTH} levels deep", node.start_mark.line + 1)
                if total > MAX_VALUES:
                    raise YAMLProblem(
                        f"the document expands to more than {MAX_VALUES:,} values (aliases that repeat aliases?)",
                        node.start_mark.line + 1,
                    )
        measured[id(node)] = total, height
        return total, height

    measure(root)
