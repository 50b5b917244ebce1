"""Adding a task kind by docs/contributing.md's "Add a task kind" alone: a kind `ranking` written into a copy of the
package (its package finetune/kinds/ranking/ and its line in each of the two tables, nothing else edited), and the
toolkit picks it up: a recipe of kind ranking is read as its section, its spec finds its kind object, its Auto class
and head are found, `finetune recipes --keys` lists it, `finetune eval` runs its evaluation and `finetune predict` its
predictor, and the tree's rules (layers, kind lists) hold. The copy is imported in a fresh interpreter (the recipe
classes and the sections' union are built when the package is imported), and nothing is trained."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Step 1: finetune/kinds/ranking/, module by module as the guide lists them (a placeholder job: nothing trains here).
PACKAGE = {
    "__init__.py": '''
        """Task kind ranking: a relevance score per (query, passage) pair.

        No imports: see finetune/kinds/__init__.py."""
    ''',
    "recipe.py": '''
        """The task section of kind ranking: query and passage pairs with their relevance, in TSV files."""

        from __future__ import annotations

        from typing import ClassVar, Literal

        from pydantic import Field

        from finetune.kinds.recipe import OwnFilesSection, OwnHead
        from finetune.tasks.specs import TaskSpec

        FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}


        class RankingSection(OwnFilesSection):
            """A ranking task: each row a query, a passage and how relevant the passage is."""

            kind_name: ClassVar[str] = "ranking"
            auto_class_name: ClassVar[str] = "AutoModelForSequenceClassification"  # a cross-encoder
            reads: ClassVar[str] = "TSV files of query, passage and relevance"
            own_head: ClassVar[OwnHead | None] = OwnHead(
                "pools a text into one vector for a class; a ranker (task.kind ranking) scores a pair",
                "a ranker",
                "a ranker scores a pair with its family's own head",
            )

            kind: Literal["ranking"] = Field("ranking", description="ranking: a relevance score per query and passage")
            min_relevance: float = Field(0.0, description="kind ranking: a passage below this is not relevant")

            def spec(self) -> TaskSpec:
                return TaskSpec(
                    name=self.name,
                    text_columns=("query", "passage"),
                    label_column="relevance",
                    labels=None,
                    metrics=("pearson",),
                    files=dict(self.files or FILES),
                    kind=self.kind_name,
                    problem_type=None,
                )
    ''',
    "fine_tuning.py": '''
        """`finetune finetune` for task kind ranking (a placeholder: this test trains nothing)."""

        from __future__ import annotations

        from finetune.kinds.fine_tuning import TaskFineTuning


        class RankingFineTuning(TaskFineTuning):
            def read_task(self) -> tuple[int, int]:
                raise NotImplementedError

            def task_model(self):
                raise NotImplementedError

            def encoded_task(self, model):
                raise NotImplementedError

            def _loss(self, model, batch):
                raise NotImplementedError

            def evaluate(self):
                raise NotImplementedError
    ''',
    "predictor.py": '''
        """A ranker ready to predict: a score per (query, passage) pair (here: the words they share)."""

        from __future__ import annotations

        from collections.abc import Sequence
        from dataclasses import dataclass

        from finetune.data.examples import TaskExamples
        from finetune.kinds.predictor import TextPredictor
        from finetune.tasks.specs import TaskSpec


        @dataclass
        class RankingPredictor(TextPredictor):
            spec: TaskSpec

            def predict(self, inputs: Sequence[Sequence[str]]) -> list[dict]:
                texts = [tuple(pair) for pair in inputs]
                return self.predict_examples(TaskExamples(texts, None, [str(index) for index in range(len(texts))]))

            def predict_examples(self, examples: TaskExamples) -> list[dict]:
                return [{"score": float(len(set(q.split()) & set(p.split())))} for q, p in examples.texts]
    ''',
    "evaluation.py": '''
        """`finetune eval` of rankers (here: the report's frame alone)."""

        from __future__ import annotations

        from finetune.tasks.specs import TaskSpec


        def run_ranking_eval(recipe, spec: TaskSpec, accelerator) -> dict:
            return {"task": spec.name, "split": recipe.split, "metrics": list(spec.metrics), "results": {}}
    ''',
    "kind.py": '''
        """Task kind ranking: a relevance score per (query, passage) pair."""

        from __future__ import annotations

        from typing import Any

        from finetune.kinds.base import TaskKind
        from finetune.kinds.ranking.evaluation import run_ranking_eval
        from finetune.kinds.ranking.predictor import RankingPredictor
        from finetune.kinds.ranking.recipe import RankingSection
        from finetune.kinds.ranking.fine_tuning import RankingFineTuning
        from finetune.reporting.model_card import CardKind
        from finetune.tasks.specs import TaskSpec


        class RankingKind(TaskKind):
            name = "ranking"
            section = RankingSection
            fine_tuning_class = RankingFineTuning

            def evaluate(self, recipe, spec: TaskSpec, accelerator) -> dict:
                return run_ranking_eval(recipe, spec, accelerator)

            def predictor(
                self, folder: str, recipe, spec: TaskSpec, batch_size: int, max_length: int | None
            ) -> RankingPredictor:
                return RankingPredictor(spec)

            def output_table(self, spec: TaskSpec, rows: list[dict]) -> tuple[list[dict], list[str]]:
                return rows, [*spec.text_columns, "score"]

            def card(self, recipe, spec: TaskSpec, model_type: str, result: dict) -> CardKind:
                return CardKind(
                    "text-ranking", "ranker", self.section.auto_class_name, "", "pairs.tsv", "a query and a passage",
                    "a relevance score", "reads a query with its passage",
                )

            def profile_model(self, recipe, config) -> Any:
                return self.auto_class.from_config(config)

            def profile_description(self, recipe, num_labels: int) -> str:
                return "ranking, a relevance score per pair"


        RANKING = RankingKind()
    ''',
}

# Step 2: one line in each table (with its import), in the same order: (what is there, what it becomes).
TABLE_EDITS = {
    "finetune/kinds/registry.py": [
        ("import TOKENS\n", "import TOKENS\nfrom finetune.kinds.ranking.kind import RANKING\n"),
        ("    SPANS.name: SPANS,\n}", "    SPANS.name: SPANS,\n    RANKING.name: RANKING,\n}"),
    ],
    "finetune/recipes/task.py": [
        ("import TokensSection\n", "import TokensSection\nfrom finetune.kinds.ranking.recipe import RankingSection\n"),
        ("        SpansSection,\n    )", "        SpansSection,\n        RankingSection,\n    )"),
        ("ChoicesSection | SpansSection\n", "ChoicesSection | SpansSection | RankingSection\n"),
    ],
}

# What the fresh interpreter checks of the copy, printing one JSON object.
CHECKS = """
import ast, json, sys
from pathlib import Path
from transformers import AutoModelForSequenceClassification, BertConfig

from finetune.commands.evaluate import run_task_eval
from finetune.commands.predict import load_predictor, run_predict
from finetune.kinds.predictor import TaskPredictor
from finetune.kinds.registry import KINDS, kind_of
from finetune.models.task_heads import kinds_with_a_head
from finetune.recipes import TASK_SECTIONS, describe_keys, load_recipe
from finetune.recipes.finetune import FinetuneRecipe
from finetune.tasks.specs import task_spec
import tests.kinds.test_registry as registry_tests
import tests.project.test_architecture as architecture

folder, checkpoint, copy = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
recipe = load_recipe(folder / "finetune.yaml", check_paths=False)
spec = task_spec(recipe.task)
kind = kind_of(spec)
try:
    load_recipe(folder / "other_key.yaml", check_paths=False)
except Exception as error:
    refused = str(error)
rows = {row[0]: row for row in describe_keys(FinetuneRecipe)}
written = run_predict(checkpoint, str(folder / "pairs.tsv"), str(folder / "out.jsonl"))
report = run_task_eval(load_recipe(folder / "eval.yaml", check_paths=False), None)
# The contract, the two tables and the union mypy reads (the copy's), and the tree's rules on the copy.
registry_tests.test_every_kind_answers_the_contract()
registry_tests.test_the_recipes_sections_are_the_kinds_sections()
registry_tests.test_each_kind_s_auto_class_is_its_sections_and_names_its_head()
registry_tests.ROOT = copy
registry_tests.test_the_union_mypy_reads_is_the_recipes_sections()
architecture.PACKAGE = copy / "finetune"
architecture.test_imports_run_downwards_only()
architecture.test_the_kinds_are_listed_only_in_their_tables()
architecture.test_kind_names_are_compared_only_in_the_kinds_packages()
print(json.dumps({
    "package": sys.modules["finetune"].__file__,
    "section": type(recipe.task).__name__,
    "kinds": list(KINDS),
    "sections": list(TASK_SECTIONS),
    "spec_kind": spec.kind,
    "kind_is_registered": kind is KINDS["ranking"],
    "auto_class": kind.auto_class is AutoModelForSequenceClassification,
    "heads": kinds_with_a_head(BertConfig()),
    "refused": refused,
    "kind_row": rows["task.kind"][1:],
    "own_key": rows["task.min_relevance"][3],
    "predictor": isinstance(load_predictor(checkpoint), TaskPredictor),
    "written": written,
    "output": [json.loads(line) for line in (folder / "out.jsonl").read_text().splitlines()],
    "report": report,
}))
"""


def guide_steps() -> str:
    """The "Add a task kind" section of docs/contributing.md."""
    text = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    return text[text.index("## Add a task kind") : text.index("## Add a backbone family")]


def edit(path: Path, there: str, becomes: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(there) == 1, f"{path}: {there!r}"
    path.write_text(text.replace(there, becomes), encoding="utf-8")


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")  # JSON is YAML
    return path


def test_a_kind_added_by_the_guides_steps_alone_is_picked_up(tmp_path, monkeypatch):
    steps = guide_steps()
    # The guide names every file this test writes or edits: the kind's modules and the two tables.
    for name in PACKAGE:
        assert f"`{name}`" in steps, f"the guide does not name {name}"
    for table in TABLE_EDITS:
        assert table in steps, f"the guide does not name {table}"
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "finetune", copy / "finetune", ignore=shutil.ignore_patterns("__pycache__"))
    package = copy / "finetune" / "kinds" / "ranking"
    package.mkdir()
    for name, source in PACKAGE.items():
        (package / name).write_text(textwrap.dedent(source).lstrip("\n"), encoding="utf-8")
    for table, edits in TABLE_EDITS.items():
        for there, becomes in edits:
            edit(copy / table, there, becomes)

    work = tmp_path / "work"
    work.mkdir()
    task = {"name": "passages", "kind": "ranking", "data_dir": str(work)}
    run = {"stage": "finetune", "run_dir": str(work / "run"), "model": {"checkpoint": "bert-base-uncased"}}
    write_yaml(work / "finetune.yaml", {**run, "task": task})
    write_yaml(work / "other_key.yaml", {**run, "task": {**task, "doc_stride": 8}})
    checkpoint = work / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "bert"}), encoding="utf-8")
    write_yaml(checkpoint / "finetune_recipe.yaml", {**run, "task": task})
    write_yaml(work / "eval.yaml", {"stage": "eval", "run_dir": str(work / "eval"), "task": task, "models": {"m": "c"}})
    (work / "pairs.tsv").write_text("query\tpassage\nred fox\tthe red fox jumps\nblue sky\tgreen grass\n")

    monkeypatch.setenv("PYTHONPATH", f"{copy}{os.pathsep}{ROOT}")  # the copy first: its finetune, the tests' helpers
    found = subprocess.run(
        [sys.executable, "-c", CHECKS, str(work), str(checkpoint), str(copy)],
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
    )
    assert found.returncode == 0, found.stderr[-3000:]
    result = json.loads(found.stdout.strip().splitlines()[-1])
    assert result["package"].startswith(str(copy))
    assert result["section"] == "RankingSection" and result["spec_kind"] == "ranking" and result["kind_is_registered"]
    assert result["kinds"] == result["sections"] and result["kinds"][-1] == "ranking"
    assert result["auto_class"] and "ranking" in result["heads"]
    assert "task.doc_stride: not for kind ranking (a key of kind spans)" in result["refused"]
    kinds, _, meaning = result["kind_row"]
    assert kinds.endswith("|spans|ranking") and meaning.endswith("; ranking: a relevance score per query and passage")
    assert result["own_key"] == "(ranking) kind ranking: a passage below this is not relevant"
    assert result["predictor"] and result["written"] == 2
    assert result["output"] == [
        {"query": "red fox", "passage": "the red fox jumps", "score": 2.0},
        {"query": "blue sky", "passage": "green grass", "score": 0.0},
    ]
    assert result["report"] == {"task": "passages", "split": "dev", "metrics": ["pearson"], "results": {}}
