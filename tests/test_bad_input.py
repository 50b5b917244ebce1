"""Bad input, tried systematically through the real CLI: every case exits 2 with one line naming the culprit.

Each row breaks one thing of an otherwise valid recipe or data folder: unknown keys, wrong types,
rates out of range, masking fractions past 1, missing files, unknown tasks and model families, and
malformed data files. For each, the command must exit with code 2, print exactly one `error:` line
naming the key, file or line, print no traceback, and leave no run directory behind (so nothing looks
like a finished run: no checkpoint, result.json or report).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable, NamedTuple

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from tests.conftest import (eval_recipe, finetune_recipe, pretrain_recipe, save_tiny_masked_lm, write_corpus,
                            write_task, write_yaml)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny random BERT with its WordPiece tokenizer: the finetune stage reads the data after the tokenizer."""
    folder = tmp_path_factory.mktemp("pretrained")
    return save_tiny_masked_lm(folder, layers=1, hidden=16)


class Paths(NamedTuple):
    """Where a case's inputs live: it may break any of them."""

    tmp: Path
    corpus: Path  # tmp/corpus/train.txt
    task: Path  # tmp/task: train.tsv, dev.tsv, test.tsv
    checkpoint: Path


# A change breaks the recipe dict and/or the files; it returns the recipe file to run when it is not the usual one.
Change = Callable[[dict[str, Any], Paths], Any]


def setting(dotted: str, value: Any) -> Change:
    """Set `a.b.c` in the recipe to `value`, creating sections as needed."""

    def change(data: dict[str, Any], paths: Paths) -> None:
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    return change


def writing(relative: str, content: bytes) -> Change:
    """Replace a data file (under tmp) with `content`."""

    def change(data: dict[str, Any], paths: Paths) -> None:
        (paths.tmp / relative).write_bytes(content)

    return change


def removing(relative: str) -> Change:
    def change(data: dict[str, Any], paths: Paths) -> None:
        (paths.tmp / relative).unlink()

    return change


def recipe_text(text: bytes) -> Change:
    """Run a recipe file with exactly this content instead of the dict."""

    def change(data: dict[str, Any], paths: Paths) -> Path:
        path = paths.tmp / "raw.yaml"
        path.write_bytes(text)
        return path

    return change


def unknown_family_checkpoint(data: dict[str, Any], paths: Paths) -> None:
    """The tiny checkpoint's tokenizer beside a config.json whose model type transformers does not have."""
    folder = paths.tmp / "strange-model"
    shutil.copytree(paths.checkpoint, folder, ignore=shutil.ignore_patterns("config.json", "*.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "made-up-family"}), encoding="utf-8")
    data["model"]["checkpoint"] = str(folder)


def checkpoint_without_tokenizer(data: dict[str, Any], paths: Paths) -> None:
    """The tiny checkpoint's model files only: no tokenizer to read the task with."""
    folder = paths.tmp / "no-tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(paths.checkpoint / name, folder / name)
    data["model"]["checkpoint"] = str(folder)


def regression_task_with_a_word_for_a_score(data: dict[str, Any], paths: Paths) -> None:
    data["task"].pop("labels")
    data["task"]["metrics"] = ["pearson"]
    lines = (paths.task / "train.tsv").read_text(encoding="utf-8").splitlines()
    lines[2] = lines[2].rsplit("\t", 1)[0] + "\thigh"
    (paths.task / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")


GOOD_ROW = b"the film was great .\t1\n"


class Case(NamedTuple):
    stage: str
    change: Change
    named: tuple[str, ...]  # fragments the error line must contain
    overrides: tuple[str, ...] = ()


CASES = {
    # Unknown keys
    "unknown top-level key": Case("pretrain", setting("learning_rate", 0.1), ("learning_rate", "unknown key")),
    "unknown nested key": Case("finetune", setting("training.learning_rate", 0.1),
                               ("training.learning_rate", "unknown key")),
    "unknown eval key": Case("eval", setting("modles", {"a": "b"}), ("modles", "unknown key")),
    "unknown key in an override": Case("finetune", setting("seed", 0), ("schedule.warmup", "unknown key"),
                                       ("schedule.warmup=0.1",)),
    # Wrong types
    "epochs not a number": Case("pretrain", setting("training.epochs", "three"), ("training.epochs", "three")),
    "lr not a number": Case("finetune", setting("training.lr", "fast"), ("training.lr", "fast")),
    "labels not a list": Case("finetune", setting("task.labels", "0,1"), ("task.labels",)),
    "trust_remote_code not a boolean": Case("finetune", setting("model.trust_remote_code", "yes please"),
                                            ("model.trust_remote_code",)),
    "section given as a scalar": Case("finetune", setting("training", 5), ("training",)),
    # Rates: zero, negative, out of range
    "zero lr": Case("pretrain", setting("training.lr", 0), ("training.lr", "greater than 0")),
    "negative lr": Case("finetune", setting("training.lr", -1e-3), ("training.lr", "greater than 0")),
    "negative lr in an override": Case("finetune", setting("seed", 0), ("training.lr",), ("training.lr=-0.1",)),
    "zero batch size": Case("finetune", setting("training.batch_size", 0), ("training.batch_size",)),
    "negative weight decay": Case("finetune", setting("training.weight_decay", -0.1), ("training.weight_decay",)),
    "cut_frac of 1": Case("finetune", setting("schedule.cut_frac", 1.0), ("schedule.cut_frac",)),
    "zero masking rate": Case("pretrain", setting("masking.probability", 0), ("masking.probability",)),
    "masking rate past 1": Case("pretrain", setting("masking.probability", 1.5), ("masking.probability",)),
    "negative mask fraction": Case("pretrain", setting("masking.mask_fraction", -0.1), ("masking.mask_fraction",)),
    "mask + random fractions past 1": Case(
        "pretrain", lambda data, paths: data.update(masking={"mask_fraction": 0.8, "random_fraction": 0.3}),
        ("masking", "mask_fraction + random_fraction", "exceeds 1")),
    "dropout of 1": Case("pretrain", setting("model.dropout", 1.0), ("model.dropout", "less than 1")),
    "negative awd_lstm dropout": Case(
        "pretrain", setting("model", {"family": "awd_lstm", "weight_dropout": -0.2}), ("model.weight_dropout",)),
    "classifier dropout past 1": Case("finetune", setting("classifier_dropout", 1.5), ("classifier_dropout",)),
    "unknown pooling": Case("finetune", setting("pooling", "max"), ("pooling",)),
    # Missing files
    "missing recipe file": Case("finetune", lambda data, paths: paths.tmp / "absent.yaml", ("absent.yaml",)),
    "missing corpus": Case("pretrain", lambda data, paths: data["corpus"].update(
        train_files=[str(paths.tmp / "nope.txt")]), ("corpus.train_files", "nope.txt")),
    "missing task folder": Case("finetune", lambda data, paths: data["task"].update(
        data_dir=str(paths.tmp / "no-task")), ("task.data_dir", "no-task")),
    "missing dev file": Case("finetune", removing("task/dev.tsv"), ("dev.tsv",)),
    "missing checkpoint": Case("finetune", lambda data, paths: data["model"].update(
        checkpoint=str(paths.tmp / "no-checkpoint")), ("model.checkpoint", "no-checkpoint")),
    "missing model to evaluate": Case("eval", lambda data, paths: data.update(
        models={"mine": str(paths.tmp / "no-model")}), ("models.mine", "no-model")),
    "missing checkpoint to continue": Case("pretrain", setting("model", {"checkpoint": "missing/model/folder"}),
                                           ("model.checkpoint", "missing/model/folder")),
    # Unknown tasks and model families
    "unknown task": Case("finetune", lambda data, paths: data.update(
        task={"name": "sst3", "data_dir": str(paths.task)}), ("task", "sst3")),
    "unknown GLUE task to evaluate": Case("eval", lambda data, paths: data.update(
        task=None, models=None, tasks={"sst3": str(paths.checkpoint)}, glue_dir=str(paths.tmp)), ("tasks.sst3",)),
    "unknown model family": Case("pretrain", setting("model.family", "lstm"), ("model.family", "lstm")),
    "checkpoint of an unknown model family": Case("finetune", unknown_family_checkpoint,
                                                  ("model.checkpoint", "strange-model", "model_type")),
    "checkpoint without a tokenizer": Case("finetune", checkpoint_without_tokenizer,
                                           ("model.checkpoint", "no-tokenizer", "tokenizer")),
    # Malformed recipe files
    "invalid YAML": Case("finetune", recipe_text(b"stage: finetune\ntraining: [1, 2\n"), ("raw.yaml", "invalid YAML")),
    "recipe not UTF-8": Case("finetune", recipe_text(b"stage: finetune\ndescription: caf\xe9\n"),
                             ("raw.yaml", "UTF-8")),
    "recipe not a mapping": Case("finetune", recipe_text(b"- stage: finetune\n"), ("raw.yaml", "mapping")),
    # Malformed data files
    "TSV row with a missing column": Case("finetune", writing(
        "task/train.tsv", b"sentence\tlabel\n" + GOOD_ROW * 2 + b"no label here\n" + GOOD_ROW),
        ("train.tsv line 4", "expected 2", "found 1")),
    "TSV row with an extra column": Case("finetune", writing(
        "task/dev.tsv", b"sentence\tlabel\n" + GOOD_ROW + b"a\t1\textra\n"), ("dev.tsv line 3", "found 3")),
    "bad label": Case("finetune", writing("task/train.tsv", b"sentence\tlabel\n" + GOOD_ROW + b"meh .\tmaybe\n"),
                      ("train.tsv line 3", "maybe")),
    "bad label in the evaluated split": Case("eval", writing(
        "task/dev.tsv", b"sentence\tlabel\nfine .\t2\n"), ("dev.tsv line 2", "'2'")),
    "regression score not a number": Case("finetune", regression_task_with_a_word_for_a_score,
                                          ("train.tsv line 3", "high", "not a number")),
    "empty TSV": Case("finetune", writing("task/dev.tsv", b""), ("dev.tsv", "empty")),
    "TSV with only a header": Case("finetune", writing("task/train.tsv", b"sentence\tlabel\n"),
                                   ("train.tsv", "no examples")),
    "TSV missing a text column": Case("finetune", writing("task/train.tsv", b"text\tlabel\n" + GOOD_ROW),
                                      ("train.tsv", "sentence")),
    "TSV not UTF-8": Case("finetune", writing(
        "task/train.tsv", b"sentence\tlabel\n" + GOOD_ROW * 3 + b"caf\xe9 .\t1\n"), ("train.tsv", "line 5", "UTF-8")),
    "corpus not UTF-8": Case("pretrain", writing("corpus/train.txt", b"fine text\nmore\nbad \xff byte\n"),
                             ("train.txt line 3", "UTF-8")),
    "empty corpus": Case("pretrain", writing("corpus/train.txt", b"\n\n"), ("train.txt", "no text")),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_bad_input_is_one_line_and_exit_code_2(case: Case, tmp_path: Path, checkpoint: Path):
    paths = Paths(tmp_path, write_corpus(tmp_path / "corpus"), write_task(tmp_path / "task"), checkpoint)
    run_dir = tmp_path / "run"
    data = {
        "pretrain": lambda: pretrain_recipe(paths.corpus, run_dir),
        "finetune": lambda: finetune_recipe(checkpoint, paths.task, run_dir),
        "eval": lambda: eval_recipe(paths.task, run_dir, {"model": str(checkpoint)}),
    }[case.stage]()
    recipe = case.change(data, paths) or write_yaml(tmp_path / "recipe.yaml", data)

    result = CliRunner().invoke(app, [case.stage, str(recipe), *case.overrides])

    output = result.output.strip()
    assert result.exit_code == 2, f"exit code {result.exit_code}: {result.output[-2000:]}"
    assert "Traceback" not in result.output, result.output[-2000:]
    assert output.startswith("error: ") and "\n" not in output, f"not one error line: {output!r}"
    for fragment in case.named:
        assert fragment in output, f"{fragment!r} not named in {output!r}"
    assert not run_dir.exists(), f"the failed run left {sorted(p.name for p in run_dir.iterdir())} in its run_dir"
