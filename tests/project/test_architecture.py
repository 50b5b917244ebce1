"""The package's shape: layers that import only downwards, no import cycle, no file over 450 lines and no function
over 60.

The layers, top to bottom (docs/architecture.md). A module may import its own package and the layers below; packages
side by side in one layer (a | b) import neither each other nor anything above:
    finetune, __main__                     the package's shortcuts to the API; `python -m finetune`
    cli | api                              the command line (one thin wrapper per command) | the Python API
    commands                               what runs without training (a command may use a stage's helpers)
    stages                                 what trains (one module per stage; never imports a command)
    kinds                                  the task kinds' objects, stages and evaluations (kinds/K/kind.py, ...);
                                           a kind's recipe, data, metrics, model and training modules sit in the
                                           layers of their role (package_of)
    inference                              running a trained model
    training                               the loop, optimisers, schedules, checkpoints
    reporting                              plots, cards, trackers, comparisons
    glue | models                          GLUE's conventions, report, evaluate metric, submissions | what is trained
    data                                   what is read
    run_dir                                where a run writes
    recipes                                what a run is told
    glue.specs | run_lock                  GLUE's task table (TaskSpecs: data) | a run folder's lock
    tasks                                  the task record (TaskSpec) and the metrics every kind shares
    errors | console | safe_yaml | _version   foundations

A task kind's package (finetune/kinds/K/) spans layers: each of its modules sits in the layer of its role, named by
the module's last name (ROLE_LAYERS), as if it were a module of that role's package: K.recipe with the recipes,
K.data with data, K.model with models, K.metrics and K.spec with tasks, K.training with the loop; the rest (K.kind,
K.stage, K.evaluation, K.predictor) in the kinds layer. So `recipes -> kinds.K.recipe` and `kinds.recipe ->
recipes.base` are imports within one package's layer, the one exception by design; nothing else imports upwards or
sideways.
"""

from __future__ import annotations

import ast
from pathlib import Path

from finetune.kinds.registry import KINDS
from finetune.models.families import FAMILIES

PACKAGE = Path(__file__).resolve().parents[2] / "finetune"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its file (late imports inside functions included)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
                targets.update(name for name in names if name in modules)
                if node.module in modules and not all(name in modules for name in names):
                    targets.add(node.module)  # a name defined in the module itself, not only its submodules
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names if alias.name in modules)
        # A package importing its own submodules (to register them) is not a cycle back into itself.
        graph[name] = {target for target in targets if target != name and not target.startswith(name + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle as a list of modules (first repeated at the end), or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state:
                found = visit(target, path + [target])
                if found:
                    return found
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return []


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 50 and "finetune.stages.finetune" in graph["finetune.cli"] | {
        target for targets in graph.values() for target in targets
    }
    assert find_cycle(graph) == []


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


LAYERS = [
    {"finetune", "finetune.__main__"},
    {"finetune.cli", "finetune.api"},
    {"finetune.commands"},
    {"finetune.stages"},
    {"finetune.kinds"},
    {"finetune.inference"},
    {"finetune.training"},
    {"finetune.reporting"},
    {"finetune.glue", "finetune.models"},
    {"finetune.data"},
    {"finetune.run_dir"},
    {"finetune.recipes"},
    {"finetune.glue.specs", "finetune.run_lock"},
    {"finetune.tasks"},
    {"finetune.errors", "finetune.console", "finetune.safe_yaml", "finetune._version"},
]


# A task kind's module by its role (its last name): the package whose layer it belongs to, whatever package it is in.
ROLE_LAYERS = {"recipe": "finetune.recipes", "data": "finetune.data", "metrics": "finetune.tasks"}
ROLE_LAYERS |= {"model": "finetune.models", "training": "finetune.training", "spec": "finetune.tasks"}


def package_of(module: str) -> str:
    """The entry of LAYERS that `module` belongs to: the longest one that is it or holds it (glue.specs before glue;
    "finetune" is the package's own __init__ alone); a module of finetune.kinds named after a role belongs to that
    role's package (ROLE_LAYERS)."""
    if module.startswith("finetune.kinds.") and module.rpartition(".")[2] in ROLE_LAYERS:
        return ROLE_LAYERS[module.rpartition(".")[2]]
    matches = [
        prefix
        for layer in LAYERS
        for prefix in layer
        if module == prefix or (prefix != "finetune" and module.startswith(prefix + "."))
    ]
    assert matches, f"{module} is in no layer: add it to LAYERS (and to the picture in docs/architecture.md)"
    return max(matches, key=len)


def layer_of(module: str) -> int:
    """The index of the layer of `module` (0 at the top): that of its package (package_of)."""
    package = package_of(module)
    return next(index for index, layer in enumerate(LAYERS) if package in layer)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a layer above the importing module's."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if layer_of(target) < layer_of(module)
    )


def sideways_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of another package in the importing module's own layer: packages side by side import neither."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if layer_of(target) == layer_of(module) and package_of(target) != package_of(module)
    )


def test_imports_run_downwards_only():
    graph = import_graph()
    assert upward_imports(graph) == []
    assert sideways_imports(graph) == []
    assert set().union(*LAYERS) <= set(graph), "a package in LAYERS that is no module of finetune/"
    # The scan sees real imports, late ones included: the task sections check task names against the GLUE table, a
    # command uses a stage's helpers (eval summarises seeds as the stages do), the recipes import each kind's section.
    assert "finetune.glue.specs" in graph["finetune.kinds.recipe"]
    assert "finetune.stages.seeds" in graph["finetune.commands.evaluate"]
    assert "finetune.kinds.classification.recipe" in graph["finetune.recipes.task"]
    assert "finetune.recipes.base" in graph["finetune.kinds.recipe"]


def test_an_upward_import_is_reported():
    assert upward_imports({"finetune.recipes.base": {"finetune.glue.submission", "finetune.glue.specs"}}) == [
        "finetune.recipes.base -> finetune.glue.submission"
    ]
    # Packages that shared a layer are ordered: data reads below GLUE and the models, the recipes below the run
    # folder, a stage never imports a command, the loop never a predictor.
    graph = {
        "finetune.data.task_files": {"finetune.glue.submission", "finetune.models.heads", "finetune.tasks.specs"},
        "finetune.recipes.given": {"finetune.run_dir", "finetune.run_lock"},
        "finetune.stages.seeds": {"finetune.commands.evaluate"},
        "finetune.training.loop": {"finetune.inference.predict", "finetune.reporting.trackers"},
    }
    assert upward_imports(graph) == [
        "finetune.data.task_files -> finetune.glue.submission",
        "finetune.data.task_files -> finetune.models.heads",
        "finetune.recipes.given -> finetune.run_dir",
        "finetune.stages.seeds -> finetune.commands.evaluate",
        "finetune.training.loop -> finetune.inference.predict",
    ]


def test_a_sideways_import_is_reported_and_a_kinds_role_module_is_in_its_roles_package():
    graph = {
        "finetune.models.heads": {"finetune.glue.submission"},
        "finetune.run_lock": {"finetune.glue.specs"},
        "finetune.cli": {"finetune.api"},
        "finetune.recipes.task": {"finetune.kinds.tokens.recipe"},
        "finetune.kinds.recipe": {"finetune.recipes.base"},
        "finetune.kinds.tokens.training": {"finetune.training.checkpoints", "finetune.kinds.tokens.data"},
    }
    assert sideways_imports(graph) == [
        "finetune.cli -> finetune.api",
        "finetune.models.heads -> finetune.glue.submission",
        "finetune.run_lock -> finetune.glue.specs",
    ]
    assert upward_imports(graph) == []
    assert layer_of("finetune.kinds.tokens.metrics") == layer_of("finetune.tasks.metrics")
    assert layer_of("finetune.kinds.tokens.fine_tuning") == layer_of("finetune.kinds")
    assert upward_imports({"finetune.kinds.tokens.recipe": {"finetune.kinds.tokens.kind"}}) == [
        "finetune.kinds.tokens.recipe -> finetune.kinds.tokens.kind"
    ]


def function_lengths(paths) -> dict[str, int]:
    """'module:Class.function' -> lines, for every function of the given files (methods and nested functions named by
    what holds them, so that two classes' __init__ are two entries)."""
    lengths = {}

    def visit(node: ast.AST, prefix: str, module: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lengths[f"{module}:{name}"] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.", module)
            else:
                visit(child, prefix, module)

    for path in paths:
        visit(ast.parse(path.read_text(encoding="utf-8")), "", module_name(path))
    return lengths


def test_no_function_is_longer_than_sixty_lines():
    """The run's life cycle is the driver's, the step the loop's, a command's work its module's: what any function
    adds stays short enough to read in one screen."""
    lengths = function_lengths(PACKAGE.rglob("*.py"))
    assert "finetune.training.loop:TrainingLoop.train_epoch" in lengths
    assert "finetune.kinds.fine_tuning:TaskFineTuning.setup" in lengths and "finetune.cli:main" in lengths
    assert {name: lines for name, lines in lengths.items() if lines > 60} == {}


MAX_FILE_LINES = 450


def long_files(paths, root: Path = PACKAGE.parent) -> dict[str, int]:
    """'finetune/...py' (relative to `root`) -> lines, for the given files over MAX_FILE_LINES."""
    counts = {path.relative_to(root).as_posix(): len(path.read_text(encoding="utf-8").splitlines()) for path in paths}
    return {name: lines for name, lines in counts.items() if lines > MAX_FILE_LINES}


def test_no_file_is_longer_than_450_lines():
    """A module holds one role; past 450 lines it holds several, and splits by them (docs/architecture.md)."""
    assert long_files(PACKAGE.rglob("*.py")) == {}


def test_a_long_file_is_found(tmp_path):
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_FILE_LINES, encoding="utf-8")
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_FILE_LINES + 1), encoding="utf-8")
    assert long_files(sorted(tmp_path.glob("*.py")), tmp_path) == {"long.py": MAX_FILE_LINES + 1}


def names_used(path: Path) -> set[str]:
    return {node.id for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(node, ast.Name)} | {
        node.attr for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(node, ast.Attribute)
    }


def test_the_training_state_is_written_and_read_in_one_place():
    """progress.json and the per-process tensors: written by TrainingState.write and read by read_training_state
    (training/state.py), which alone knows the format and migrates older ones; the rest only passes the state on."""
    # Called by load_training_state alone (with accelerate's part of the state and the attachments).
    callers = {module_name(path) for path in PACKAGE.rglob("*.py") if "read_training_state" in names_used(path)}
    assert callers == {"finetune.training.checkpoints"}
    progress_users = {module_name(path) for path in PACKAGE.rglob("*.py") if "PROGRESS_FILE" in names_used(path)}
    # checkpoints.py only asks whether the file is there (a complete periodic checkpoint).
    assert progress_users == {"finetune.training.state", "finetune.training.checkpoints"}
    tensor_files = {
        module_name(path) for path in PACKAGE.rglob("*.py") if "process_tensors_" in path.read_text(encoding="utf-8")
    }
    assert tensor_files == {"finetune.training.state"}


# ---------------------------------------------------------------------------------------------
# Model families: asked of their objects in models/families.py, not compared as strings
# ---------------------------------------------------------------------------------------------

FAMILY_NAMES = set(FAMILIES)  # the families' table is the one list of them
# Files that still compare family names, with how many comparisons: each a debt, never a place to add one.
FAMILY_COMPARISONS_ALLOWED: dict[str, int] = {}  # none: a file that must compare one says why here


def family_comparisons(source: str, names: set[str] = FAMILY_NAMES) -> list[int]:
    """Lines of `source` with a comparison (==, !=, in, not in, ...) against one of `names` (family names) or a
    literal tuple, list or set holding one (the count tools/code_shape.py reports)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        constants = [operand for operand in operands if isinstance(operand, ast.Constant)]
        constants += [
            element
            for operand in operands
            if isinstance(operand, (ast.Tuple, ast.List, ast.Set))
            for element in operand.elts
            if isinstance(element, ast.Constant)
        ]
        if any(constant.value in names for constant in constants):
            lines.append(node.lineno)
    return lines


def test_family_names_are_compared_only_in_the_family_registry():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).as_posix()
        if relative == "finetune/models/families.py":
            continue
        lines = family_comparisons(path.read_text(encoding="utf-8"))
        if len(lines) > FAMILY_COMPARISONS_ALLOWED.get(relative, 0):
            found[relative] = lines
    assert found == {}, (
        "compare no family name outside finetune/models/families.py: ask the family object "
        f"(family_of(recipe.model), family_of_model_type(config.model_type)) instead: {found}"
    )


def test_a_family_comparison_is_counted():
    source = 'if family == "bert": pass\nif x.model_type not in ("gpt2", "awd_lstm"): pass\nif y == "roberta": pass\n'
    assert family_comparisons(source) == [1, 2]


# ---------------------------------------------------------------------------------------------
# Task kinds: asked of their objects (finetune/kinds/registry.py), not compared as strings
# ---------------------------------------------------------------------------------------------

KIND_NAMES = set(KINDS)  # the kinds' table is the one list of them; this test asks it
# Each kind's package (finetune/kinds/K/), where its kind object's class is written.
KIND_PACKAGES = {type(kind).__module__.rpartition(".")[0] for kind in KINDS.values()}
# The two tables that list every kind: the kind objects, and the recipes' sections with the union mypy reads, which
# the recipes layer keeps because it cannot import the kind objects (tests/kinds/test_registry.py keeps them in step).
KIND_TABLES = {"finetune.kinds.registry", "finetune.recipes.task"}
# Not task kinds, and not flagged: a schedule's kind (stlr, linear: training/schedules.py) is no kind name. Hugging
# Face's problem_type values ("regression", "single_label_classification", ...) are named once, as constants, in
# tasks/specs.py (REGRESSION_PROBLEM, ...): a comparison with such a constant is no comparison with a literal, which
# is what this rule counts, and the spec's problem_type is what the kind set, not its name.


def test_kind_names_are_compared_only_in_the_kinds_packages():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).as_posix()
        if relative.startswith("finetune/kinds/"):
            continue
        lines = family_comparisons(path.read_text(encoding="utf-8"), KIND_NAMES)
        if lines:
            found[relative] = lines
    assert found == {}, (
        "compare no task kind name outside finetune/kinds/: ask the kind object (kind_of(spec), "
        f"kind_named(recipe.task.kind)) or a spec's attribute its kind set (is_regression, label_sets): {found}"
    )


def test_a_kind_comparison_is_counted():
    source = (
        'if spec.kind == "spans": pass\n'
        'if task.kind in ("tokens", "choices"): pass\n'
        'if schedule.kind == "stlr": pass\n'
        "if config.problem_type == REGRESSION_PROBLEM: pass\n"
        'unit = "tokens" if exact else "tokens at most"\n'
    )
    assert family_comparisons(source, KIND_NAMES) == [1, 2]


def kind_lists(source: str, names: set[str]) -> list[int]:
    """Lines of `source` with a literal tuple, list, set or dict (its keys) that holds two or more of `names` (kind
    names): a list of kinds written by hand."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        elements = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if not isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) or elements is None:
            continue
        spelled = {element.value for element in elements if isinstance(element, ast.Constant)} & names
        if len(spelled) > 1:
            lines.append(node.lineno)
    return lines


def kinds_imported(targets: set[str], packages: set[str]) -> set[str]:
    """The kinds' packages (of `packages`) a module imports from."""
    return {package for package in packages for target in targets if target.startswith(package + ".")}


def test_the_kinds_are_listed_only_in_their_tables():
    """Everywhere but the two tables asks the kind object (kind_of(spec): its Auto class, predictor, evaluation, spec
    fields, ...) or the recipes' table of sections; a module that imports two kinds' packages (a union of their
    predictors) or writes two kind names in one literal (a mapping per kind) lists kinds a new one must join."""
    graph = import_graph()
    assert {f"finetune.kinds.{name}" for name in KIND_NAMES} == KIND_PACKAGES  # a kind's package is named after it
    assert kinds_imported(graph["finetune.kinds.registry"], KIND_PACKAGES) == KIND_PACKAGES  # the scan sees them
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        if module in KIND_TABLES or any(
            module == package or module.startswith(package + ".") for package in KIND_PACKAGES
        ):
            continue  # a kind's package may import the kind it extends (multilabel: classification's)
        imported = kinds_imported(graph[module], KIND_PACKAGES)
        lines = kind_lists(path.read_text(encoding="utf-8"), KIND_NAMES)
        if len(imported) > 1 or lines:
            found[module] = sorted(imported) if len(imported) > 1 else lines
    assert found == {}, (
        "list no task kinds outside finetune/kinds/registry.py's KINDS and recipes/task.py's TASK_SECTIONS: ask the "
        f"kind object (kind_of(spec), kind_named(name)) or a section's attribute instead: {found}"
    )


def test_a_list_of_kinds_is_found():
    source = (
        'HEADS = {"classification": 1, "tokens": 2}\n'
        'if kind in ("spans", "stlr"): pass\n'
        'RUNS = [("tokens", "choices")]\n'
        'unit = ("tokens", "words")\n'
    )
    assert kind_lists(source, KIND_NAMES) == [1, 3]
    targets = {"finetune.kinds.tokens.predictor", "finetune.kinds.choices.data", "finetune.kinds.registry"}
    assert kinds_imported(targets, KIND_PACKAGES) == {"finetune.kinds.tokens", "finetune.kinds.choices"}
