"""Bad input, tried systematically through the real CLI: every case exits 2 with one line naming the culprit.

Each row breaks one thing of an otherwise valid recipe or data folder: unknown keys, wrong types,
rates out of range, masking fractions past 1, missing files, unknown tasks and model families, and
malformed data files. For each, the command must exit with code 2, print exactly one `error:` line
naming the key, file or line, print no traceback, and leave no run directory behind (so nothing looks
like a finished run: no checkpoint, result.json or report).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml
from typer.testing import CliRunner

from finetune.cli import app
from finetune.data.tokenizers import train_wordpiece
from tests.conftest import (
    eval_recipe,
    finetune_recipe,
    pretrain_recipe,
    save_tiny_masked_lm,
    write_corpus,
    write_task,
    write_yaml,
)
from tests.stages.test_intermediate_flow import intermediate_recipe
from tests.stages.test_ulmfit_flow import ulmfit_recipe


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


def regression_task_scoring(score: str) -> Change:
    """The task as a regression (no labels), with `score` as the score of train.tsv line 3."""

    def change(data: dict[str, Any], paths: Paths) -> None:
        data["task"].pop("labels")
        data["task"]["metrics"] = ["pearson"]
        lines = (paths.task / "train.tsv").read_text(encoding="utf-8").splitlines()
        lines[2] = lines[2].rsplit("\t", 1)[0] + "\t" + score
        (paths.task / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")

    return change


regression_task_with_a_word_for_a_score = regression_task_scoring("high")


def modified_checkpoint(name: str, modify: Callable[[Path], None]) -> Change:
    """A copy of the tiny checkpoint in tmp/`name`, changed by `modify(folder)`, as the model to train or evaluate."""

    def change(data: dict[str, Any], paths: Paths) -> None:
        folder = paths.tmp / name
        shutil.copytree(paths.checkpoint, folder)
        modify(folder)
        if "models" in data:
            data["models"] = {"model": str(folder)}
        else:
            data["model"]["checkpoint"] = str(folder)

    return change


def config_as_a_list(folder: Path) -> None:
    (folder / "config.json").write_text("[1, 2]\n", encoding="utf-8")


def config_not_json(folder: Path) -> None:
    (folder / "config.json").write_text('{"model_type": "bert"\n"hidden_size": 16}\n', encoding="utf-8")


def empty_weights(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"")


def weights_cut_in_half(folder: Path) -> None:
    weights = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(weights[: len(weights) // 2])


def config_twice_as_wide(folder: Path) -> None:
    """config.json says hidden 32; the weights stay 16 wide."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.update(hidden_size=32, intermediate_size=64)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")


def corpus_of_unknown_characters(data: dict[str, Any], paths: Paths) -> None:
    """CJK text for the checkpoint's tokenizer, which learnt only the English test sentences: every token is [UNK]."""
    paths.corpus.write_text("一二三 四五\n" * 50, encoding="utf-8")
    data["tokenizer"] = {"path": str(paths.checkpoint)}


def tokenizer_trained_on_zero_width_text(data: dict[str, Any], paths: Paths) -> None:
    """A WordPiece tokenizer trained on zero-width characters (which it normalises away): it knows no token."""
    folder = paths.tmp / "zero-width-tokenizer"
    train_wordpiece(["\u200b\u200c\ufeff"] * 50, vocab_size=200, min_frequency=1).save_pretrained(folder)
    data["tokenizer"] = {"path": str(folder)}


def validating_on(text: bytes) -> Change:
    """A validation file of `text` beside the corpus."""

    def change(data: dict[str, Any], paths: Paths) -> None:
        (paths.tmp / "corpus" / "valid.txt").write_bytes(text)
        data["corpus"]["validation_files"] = [str(paths.tmp / "corpus" / "valid.txt")]

    return change


def corpus_as_paragraphs_of_a_task(data: dict[str, Any], paths: Paths) -> None:
    """The ULMFiT target-LM corpus (a task's texts) with a document key that only text files have."""
    from tests.conftest import custom_task_section

    data["corpus"] = {"task": custom_task_section(paths.task), "document": "paragraph", "cache_dir": None}


def recipe_and(extra_text: str) -> Change:
    """The case's recipe as YAML text with `extra_text` appended: what a dict cannot hold (repeated keys, anchors)."""

    def change(data: dict[str, Any], paths: Paths) -> Path:
        path = paths.tmp / "raw.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False) + extra_text, encoding="utf-8")
        return path

    return change


# 10 strings, each anchor 10 copies of the one before: 10^9 strings once expanded, in a few hundred bytes.
BILLION_LAUGHS = (
    "laughs:\n"
    + "".join(
        f"  - &a{level} [{', '.join(['lol'] * 10 if level == 0 else [f'*a{level - 1}'] * 10)}]\n" for level in range(9)
    )
    + "training:\n  log_with: [*a8, *a8]\n"
)


def encoder_decoder_checkpoint(data: dict[str, Any], paths: Paths) -> None:
    """A tiny T5 checkpoint (an encoder-decoder, whose layers fine-tuning cannot order in one stack) with the
    tokenizer."""
    from transformers import T5Config, T5Model

    folder = paths.tmp / "t5"
    shutil.copytree(paths.checkpoint, folder, ignore=shutil.ignore_patterns("config.json", "*.safetensors"))
    config = T5Config(vocab_size=400, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
    T5Model(config).save_pretrained(folder)
    data["model"]["checkpoint"] = str(folder)


GOOD_ROW = b"the film was great .\t1\n"


def both(*changes: Change) -> Change:
    """Every one of `changes`, in turn."""

    def change(data: dict[str, Any], paths: Paths) -> None:
        for each in changes:
            each(data, paths)

    return change


def one_row_of_class(label: str) -> Change:
    """train.tsv with a single row of class `label` (its other rows dropped)."""

    def change(data: dict[str, Any], paths: Paths) -> None:
        header, *rows = (paths.task / "train.tsv").read_text(encoding="utf-8").splitlines()
        ours = [row for row in rows if row.endswith(f"\t{label}")]
        kept = [row for row in rows if not row.endswith(f"\t{label}")] + ours[:1]
        (paths.task / "train.tsv").write_text("\n".join([header, *kept]) + "\n", encoding="utf-8")

    return change


class Case(NamedTuple):
    stage: str
    change: Change
    named: tuple[str, ...]  # fragments the error line must contain
    overrides: tuple[str, ...] = ()


CASES = {
    # Unknown keys
    "unknown top-level key": Case("pretrain", setting("learning_rate", 0.1), ("learning_rate", "unknown key")),
    "unknown nested key": Case(
        "finetune", setting("training.learning_rate", 0.1), ("training.learning_rate", "unknown key")
    ),
    "unknown eval key": Case("eval", setting("modles", {"a": "b"}), ("modles", "unknown key")),
    "unknown key in an override": Case(
        "finetune", setting("seed", 0), ("schedule.warmup", "unknown key"), ("schedule.warmup=0.1",)
    ),
    # Wrong types
    "epochs not a number": Case("pretrain", setting("training.epochs", "three"), ("training.epochs", "three")),
    "lr not a number": Case("finetune", setting("training.lr", "fast"), ("training.lr", "fast")),
    "labels not a list": Case("finetune", setting("task.labels", "0,1"), ("task.labels",)),
    "trust_remote_code not a boolean": Case(
        "finetune", setting("model.trust_remote_code", "yes please"), ("model.trust_remote_code",)
    ),
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
        "pretrain",
        lambda data, paths: data.update(masking={"mask_fraction": 0.8, "random_fraction": 0.3}),
        ("masking", "mask_fraction + random_fraction", "exceeds 1"),
    ),
    "dropout of 1": Case("pretrain", setting("model.dropout", 1.0), ("model.dropout", "less than 1")),
    "negative awd_lstm dropout": Case(
        "pretrain", setting("model", {"family": "awd_lstm", "weight_dropout": -0.2}), ("model.weight_dropout",)
    ),
    "negative activation regularization": Case(
        "pretrain",
        setting("model", {"family": "awd_lstm", "activation_regularization": -2.0}),
        ("model.activation_regularization", "greater than or equal to 0"),
    ),
    "temporal activation regularization nan": Case(
        "pretrain",
        setting("model", {"family": "awd_lstm", "temporal_activation_regularization": float("nan")}),
        ("model.temporal_activation_regularization", "finite"),
    ),
    "activation regularization on a transformer": Case(
        "pretrain", setting("model.activation_regularization", 2.0), ("model.activation_regularization", "unknown key")
    ),
    "unfreezing every_steps and every_fraction": Case(
        "finetune",
        setting("unfreezing", {"every_steps": 10, "every_fraction": 0.1}),
        ("unfreezing.every_steps", "unfreezing.every_fraction", "keep one"),
    ),
    "unfreezing every_steps and schedule": Case(
        "finetune",
        setting("unfreezing", {"every_steps": 10, "schedule": [1, 2]}),
        ("unfreezing.every_steps", "unfreezing.schedule"),
    ),
    "unfreezing every_fraction of 0": Case(
        "finetune", setting("unfreezing", {"every_fraction": 0}), ("unfreezing.every_fraction", "greater than 0")
    ),
    "unfreezing every_fraction of 1.5": Case(
        "finetune",
        setting("unfreezing", {"every_fraction": 1.5}),
        ("unfreezing.every_fraction", "less than or equal to 1"),
    ),
    "unfreezing every_steps of 0": Case(
        "finetune", setting("unfreezing", {"every_steps": 0}), ("unfreezing.every_steps", "greater than 0")
    ),
    "groups_per_epoch with every_steps": Case(
        "finetune", setting("unfreezing.every_steps", 10), ("unfreezing.groups_per_epoch", "unfreezing.every_steps")
    ),
    "every_fraction with unfreezing off": Case(
        "finetune",
        setting("unfreezing", {"mode": "none", "every_fraction": 0.2}),
        ("unfreezing.every_fraction", "mode gradual"),
    ),
    "classifier dropout past 1": Case("finetune", setting("classifier_dropout", 1.5), ("classifier_dropout",)),
    "unknown pooling": Case("finetune", setting("pooling", "max"), ("pooling",)),
    "classifier AR on a transformer": Case(
        "finetune",
        setting("model.activation_regularization", 2.0),
        ("model.activation_regularization", "AWD-LSTM", "'bert' model"),
    ),
    "negative classifier TAR": Case(
        "finetune",
        setting("model.temporal_activation_regularization", -1),
        ("model.temporal_activation_regularization", "greater than or equal to 0"),
    ),
    # Missing files
    "missing recipe file": Case("finetune", lambda data, paths: paths.tmp / "absent.yaml", ("absent.yaml",)),
    "missing corpus": Case(
        "pretrain",
        lambda data, paths: data["corpus"].update(train_files=[str(paths.tmp / "nope.txt")]),
        ("corpus.train_files", "nope.txt"),
    ),
    "missing task folder": Case(
        "finetune",
        lambda data, paths: data["task"].update(data_dir=str(paths.tmp / "no-task")),
        ("task.data_dir", "no-task"),
    ),
    "missing dev file": Case("finetune", removing("task/dev.tsv"), ("dev.tsv",)),
    "missing checkpoint": Case(
        "finetune",
        lambda data, paths: data["model"].update(checkpoint=str(paths.tmp / "no-checkpoint")),
        ("model.checkpoint", "no-checkpoint"),
    ),
    "missing model to evaluate": Case(
        "eval",
        lambda data, paths: data.update(models={"mine": str(paths.tmp / "no-model")}),
        ("models.mine", "no-model"),
    ),
    "missing checkpoint to continue": Case(
        "pretrain",
        setting("model", {"checkpoint": "missing/model/folder"}),
        ("model.checkpoint", "missing/model/folder"),
    ),
    # Unknown tasks and model families
    "unknown task": Case(
        "finetune",
        lambda data, paths: data.update(task={"name": "sst3", "data_dir": str(paths.task)}),
        ("task", "sst3"),
    ),
    "unknown GLUE task to evaluate": Case(
        "eval",
        lambda data, paths: data.update(
            task=None, models=None, tasks={"sst3": str(paths.checkpoint)}, glue_dir=str(paths.tmp)
        ),
        ("tasks.sst3",),
    ),
    "unknown model family": Case("pretrain", setting("model.family", "lstm"), ("model.family", "lstm")),
    "checkpoint of an unknown model family": Case(
        "finetune", unknown_family_checkpoint, ("model.checkpoint", "strange-model", "model_type")
    ),
    "checkpoint without a tokenizer": Case(
        "finetune", checkpoint_without_tokenizer, ("model.checkpoint", "no-tokenizer", "tokenizer")
    ),
    # Malformed recipe files
    "invalid YAML": Case("finetune", recipe_text(b"stage: finetune\ntraining: [1, 2\n"), ("raw.yaml", "invalid YAML")),
    "recipe not UTF-8": Case(
        "finetune", recipe_text(b"stage: finetune\ndescription: caf\xe9\n"), ("raw.yaml", "UTF-8")
    ),
    "recipe not a mapping": Case("finetune", recipe_text(b"- stage: finetune\n"), ("raw.yaml", "mapping")),
    # Values out of any sensible range (a traceback, or a crash, before)
    "negative seed": Case("pretrain", setting("seed", -1), ("seed", "greater than or equal to 0")),
    "seed past 2**32": Case("finetune", setting("seed", 2**32), ("seed", "less than 4294967296")),
    "negative seed in seeds": Case("finetune", setting("seeds", [1, -1]), ("seeds.1",)),
    "adam beta past 1": Case("pretrain", setting("training.adam_betas", [1.5, 0.999]), ("training.adam_betas.0",)),
    "adam beta nan": Case(
        "finetune", setting("training.adam_betas", [float("nan"), 0.999]), ("training.adam_betas.0", "finite")
    ),
    "lr inf": Case("finetune", setting("seed", 0), ("training.lr", "finite"), ("training.lr=.inf",)),
    "lr 1e999": Case("pretrain", setting("training.lr", "1e999"), ("training.lr", "finite")),
    "dropout nan": Case("pretrain", setting("model.dropout", float("nan")), ("model.dropout", "finite")),
    "hidden size of a million": Case(
        "pretrain", setting("model.hidden", 1048576), ("model.hidden=1048576", "billion parameters", "GiB")
    ),
    "vocabulary of 1e11": Case(
        "pretrain",
        setting("tokenizer.vocab_size", 100_000_000_000),
        ("tokenizer.vocab_size", "less than or equal to 1048576"),
    ),
    "task label listed twice": Case("finetune", setting("task.labels", ["0", "1", "1"]), ("task.labels", "'1'")),
    "text column listed twice": Case(
        "finetune", setting("task.text_columns", ["sentence", "sentence"]), ("task.text_columns", "'sentence'")
    ),
    "encoder-decoder family": Case(
        "finetune", encoder_decoder_checkpoint, ("model.checkpoint", "'t5'", "encoder-decoder", "llama")
    ),
    "missing label column": Case(
        "finetune", writing("task/train.tsv", b"sentence\n" + b"the film was great .\n" * 4), ("train.tsv", "label")
    ),
    # Custom tasks: files found by what is there, labels as the files write them, several text columns
    "two train files": Case(
        "finetune",
        writing("task/train.csv", b"sentence,label\ngood .,1\n"),
        ("train.csv", "train.tsv", "both train files"),
    ),
    "dev file without the label column": Case(
        "finetune",
        writing("task/dev.tsv", b"sentence\n" + b"fine .\n" * 3),
        ("dev.tsv", "no 'label' column", "score against"),
    ),
    "decimal labels": Case("finetune", setting("task.labels", [0.0, 1.0]), ("task.labels", "0.0", "quote")),
    "a pair of three columns": Case(
        "finetune",
        lambda data, paths: data["task"].update(text_columns=["sentence", "a", "b"], pair=True),
        ("task", "pair: true needs 2 text_columns, not 3"),
    ),
    "template column not in the file": Case(
        "finetune",
        lambda data, paths: data["task"].update(text_columns=None, text="{sentence} ({topic})"),
        ("train.tsv", "missing column(s) topic"),
    ),
    "label name for no label": Case(
        "finetune", setting("task.label_names", {2: "great"}), ("task", "label_names", "'2' is not one of the labels")
    ),
    # Paths of the wrong kind, or where nothing can be written
    "folder as a training file": Case(
        "pretrain",
        lambda data, paths: data["corpus"].update(train_files=[str(paths.corpus.parent)]),
        ("corpus.train_files", "is a folder, not a file"),
    ),
    "file as the task folder": Case(
        "finetune",
        lambda data, paths: data["task"].update(data_dir=str(paths.task / "train.tsv")),
        ("task.data_dir", "is a file, not a folder"),
    ),
    "file as the cache folder": Case(
        "pretrain",
        lambda data, paths: data["corpus"].update(cache_dir=str(paths.corpus)),
        ("corpus.cache_dir", "is a file, not a folder"),
    ),
    "file as the run_dir": Case(
        "finetune",
        lambda data, paths: data.update(run_dir=str(paths.task / "dev.tsv")),
        ("run_dir", "dev.tsv is a file"),
    ),
    "run_dir inside a file": Case(
        "eval",
        lambda data, paths: data.update(run_dir=str(paths.task / "dev.tsv" / "r")),
        ("run_dir", "which is a file"),
    ),
    # Recipe text: repeated keys, bombs, nesting, overrides
    "key given twice": Case(
        "finetune",
        recipe_and("model:\n  checkpoint: elsewhere\n  init: random\n"),
        ("raw.yaml line", "key 'model' is given twice"),
    ),
    "nested key given twice": Case(
        "pretrain",
        recipe_and("schedule:\n  kind: linear\n  kind: constant\n"),
        ("raw.yaml line", "key 'kind' is given twice"),
    ),
    "billion laughs": Case("finetune", recipe_and(BILLION_LAUGHS), ("raw.yaml line", "expands to more than")),
    "YAML nested 1,000 deep": Case(
        "finetune", recipe_and("deep: " + "[" * 1000 + "]" * 1000 + "\n"), ("raw.yaml", "nested more than")
    ),
    # `x/[oops` is valid YAML (a plain string) and names that folder; `[oops` opens a list it never closes.
    "override that is not YAML": Case(
        "finetune", setting("seed", 0), ("run_dir=[oops", "not valid YAML", "run_dir='[oops'"), ("run_dir=[oops",)
    ),
    "override with a key twice": Case(
        "finetune", setting("seed", 0), ("training", "given twice"), ("training={lr: 1, lr: 2}",)
    ),
    # Malformed data files
    "TSV row with a missing column": Case(
        "finetune",
        writing("task/train.tsv", b"sentence\tlabel\n" + GOOD_ROW * 2 + b"no label here\n" + GOOD_ROW),
        ("train.tsv line 4", "expected 2", "found 1"),
    ),
    "TSV row with an extra column": Case(
        "finetune",
        writing("task/dev.tsv", b"sentence\tlabel\n" + GOOD_ROW + b"a\t1\textra\n"),
        ("dev.tsv line 3", "found 3"),
    ),
    "bad label": Case(
        "finetune",
        writing("task/train.tsv", b"sentence\tlabel\n" + GOOD_ROW + b"meh .\tmaybe\n"),
        ("train.tsv line 3", "maybe"),
    ),
    "bad label in the evaluated split": Case(
        "eval", writing("task/dev.tsv", b"sentence\tlabel\nfine .\t2\n"), ("dev.tsv line 2", "'2'")
    ),
    "regression score not a number": Case(
        "finetune", regression_task_with_a_word_for_a_score, ("train.tsv line 3", "high", "not a number")
    ),
    "empty TSV": Case("finetune", writing("task/dev.tsv", b""), ("dev.tsv", "empty")),
    "TSV with only a header": Case(
        "finetune", writing("task/train.tsv", b"sentence\tlabel\n"), ("train.tsv", "no examples")
    ),
    "TSV missing a text column": Case(
        "finetune", writing("task/train.tsv", b"text\tlabel\n" + GOOD_ROW), ("train.tsv", "sentence")
    ),
    "TSV not UTF-8": Case(
        "finetune",
        writing("task/train.tsv", b"sentence\tlabel\n" + GOOD_ROW * 3 + b"caf\xe9 .\t1\n"),
        ("train.tsv", "line 5", "UTF-8"),
    ),
    "corpus not UTF-8": Case(
        "pretrain", writing("corpus/train.txt", b"fine text\nmore\nbad \xff byte\n"), ("train.txt line 3", "UTF-8")
    ),
    "empty corpus": Case("pretrain", writing("corpus/train.txt", b"\n\n"), ("train.txt", "no text")),
    # Text too short for the run's blocks, by its size before any tokenising (by its tokens: test_pretrain_families)
    "validation text shorter than a block": Case(
        "pretrain",
        validating_on(b"end\n"),
        ("valid.txt", "4 bytes", "at most 9 tokens", "one block of 15 tokens", "corpus.block_size 16"),
    ),
    "batch larger than the corpus": Case(
        "pretrain",
        setting("training.batch_size", 5000),
        ("train.txt", "bytes give at most", "5000 blocks of 15 tokens", "training.batch_size 5000"),
    ),
    "a single file as the only document": Case(
        "pretrain",
        setting("corpus.document", "file"),
        ("corpus.document: file", "train.txt holds a single document", "corpus.validation_files"),
    ),
    "paragraphs of a task's texts": Case(
        "pretrain", corpus_as_paragraphs_of_a_task, ("corpus: document: paragraph reads text files", "remove it")
    ),
    # Data files and checkpoints
    "checkpoint config.json a list": Case(
        "finetune",
        modified_checkpoint("list-config", config_as_a_list),
        ("model.checkpoint", "list-config/config.json line 1", "expected a JSON object, found list"),
    ),
    "evaluated model's config.json a list": Case(
        "eval",
        modified_checkpoint("list-config", config_as_a_list),
        ("models.model", "list-config/config.json line 1", "expected a JSON object"),
    ),
    "checkpoint config.json not JSON": Case(
        "finetune",
        modified_checkpoint("bad-config", config_not_json),
        ("model.checkpoint", "bad-config/config.json line 2", "not valid JSON"),
    ),
    "0-byte checkpoint weights": Case(
        "finetune",
        modified_checkpoint("empty-weights", empty_weights),
        ("model.checkpoint", "empty-weights/model.safetensors", "not a complete safetensors file"),
    ),
    "truncated checkpoint weights": Case(
        "finetune",
        modified_checkpoint("cut-weights", weights_cut_in_half),
        ("model.checkpoint", "cut-weights/model.safetensors", "not a complete safetensors file"),
    ),
    "truncated weights of the evaluated model": Case(
        "eval",
        modified_checkpoint("cut-weights", weights_cut_in_half),
        ("models.model", "cut-weights/model.safetensors", "not a complete safetensors file"),
    ),
    "config.json wider than the weights": Case(
        "finetune",
        modified_checkpoint("wide-config", config_twice_as_wide),
        ("model.checkpoint", "wide-config", "bert.embeddings.word_embeddings.weight", "[78, 16]", "[78, 32]"),
    ),
    "config.json of the evaluated model wider than its weights": Case(
        "eval",
        modified_checkpoint("wide-config", config_twice_as_wide),
        ("models.model", "wide-config", "bert.embeddings.word_embeddings.weight"),
    ),
    "TSV field of 10 MB": Case(
        "finetune",
        writing("task/train.tsv", b"sentence\tlabel\n" + GOOD_ROW * 2 + b"x" * 10_000_000 + b"\t1\n" + GOOD_ROW),
        ("train.tsv line 4", "longer than 131,072 characters"),
    ),
    "TSV header naming a column twice": Case(
        "finetune",
        writing("task/train.tsv", b"sentence\tsentence\tlabel\n" + b"good .\tfine .\t1\n"),
        ("train.tsv line 1", "'sentence'", "2 times"),
    ),
    "regression score NaN": Case(
        "finetune", regression_task_scoring("nan"), ("train.tsv line 3", "'nan'", "not a finite number")
    ),
    "regression score inf": Case(
        "finetune", regression_task_scoring("inf"), ("train.tsv line 3", "'inf'", "not a finite number")
    ),
    "regression score -inf": Case(
        "finetune", regression_task_scoring("-inf"), ("train.tsv line 3", "'-inf'", "not a finite number")
    ),
    "regression score 1e999": Case(
        "finetune", regression_task_scoring("1e999"), ("train.tsv line 3", "'1e999'", "not a finite number")
    ),
    "corpus of zero-width characters": Case(
        "pretrain",
        writing("corpus/train.txt", "\u200b\u200c\ufeff\n".encode() * 50),
        ("train.txt", "no text", "invisible"),
    ),
    "corpus the tokenizer knows no character of": Case(
        "pretrain", corpus_of_unknown_characters, ("no known tokens", "[UNK]", "一二三")
    ),
    "tokenizer trained on zero-width text": Case(
        "pretrain", tokenizer_trained_on_zero_width_text, ("no known tokens",)
    ),
    # `finetune ulmfit`: each section validated as its stage's recipe, the flow's wiring not given twice
    "unknown key in a ulmfit section": Case(
        "ulmfit", setting("classifier.training.bogus", 1), ("classifier.training.bogus", "unknown key")
    ),
    "unknown ulmfit key in an override": Case(
        "ulmfit", setting("seed", 0), ("target_lm.training.lrr", "unknown key"), ("target_lm.training.lrr=0.1",)
    ),
    "ulmfit section with a run_dir": Case(
        "ulmfit", setting("target_lm.run_dir", "elsewhere"), ("target_lm.run_dir", "2-target-lm", "remove it")
    ),
    "ulmfit section with the checkpoint the flow wires": Case(
        "ulmfit", setting("classifier.model.checkpoint", "mine"), ("classifier.model.checkpoint", "remove it")
    ),
    "ulmfit section with its own overwrite": Case(
        "ulmfit", setting("general_lm.overwrite", True), ("general_lm.overwrite", "remove it")
    ),
    "missing general LM checkpoint": Case(
        "ulmfit", setting("general_lm", {"checkpoint": "no/such/lm"}), ("general_lm.checkpoint", "no/such/lm")
    ),
    "general LM checkpoint and a recipe": Case(
        "ulmfit",
        lambda data, paths: data["general_lm"].update(checkpoint=str(paths.checkpoint)),
        ("general_lm", "not both"),
    ),
    # found by the flow's early checks before stage 1 trains, or by stage 1 after the flow's folder exists
    "ulmfit dev file without the label column": Case(
        "ulmfit", writing("task/dev.tsv", b"sentence\n" + b"fine .\n" * 3), ("dev.tsv", "no 'label' column")
    ),
    "ulmfit task given at the top and in the classifier": Case(
        "ulmfit",
        lambda data, paths: data.update(task=data["target_lm"]["corpus"].pop("task")),
        ("classifier.task", "top-level task", "one place"),
    ),
    "bad label in the ulmfit classifier's dev file": Case(
        "ulmfit",
        writing("task/dev.tsv", b"sentence\tlabel\n" + GOOD_ROW + b"meh .\tmaybe\n"),
        ("dev.tsv line 3", "maybe"),
    ),
    "empty corpus of the ulmfit general LM": Case(
        "ulmfit", writing("corpus/train.txt", b"\n\n"), ("train.txt", "no text")
    ),
    # `finetune intermediate`: each section validated as a finetune recipe, the flow's wiring not given twice
    "unknown key in an intermediate section": Case(
        "intermediate", setting("target.training.bogus", 1), ("target.training.bogus", "unknown key")
    ),
    "intermediate section with a run_dir": Case(
        "intermediate", setting("target.run_dir", "elsewhere"), ("target.run_dir", "2-target", "remove it")
    ),
    "intermediate target with the checkpoint the flow wires": Case(
        "intermediate", setting("target.model.checkpoint", "mine"), ("target.model.checkpoint", "remove it")
    ),
    "intermediate stage of several seeds": Case(
        "intermediate", setting("intermediate.seeds", [0, 1]), ("intermediate.seeds", "one intermediate checkpoint")
    ),
    "intermediate compare not a boolean": Case("intermediate", setting("compare", "sometimes"), ("compare",)),
    "bad label in the target's dev file, found before stage 1 trains": Case(
        "intermediate",
        writing("task/dev.tsv", b"sentence\tlabel\n" + GOOD_ROW + b"meh .\tmaybe\n"),
        ("dev.tsv line 3", "maybe"),
    ),
    # Few labels (issue 57): task.labels_per_class, draw and draws
    "draws without labels_per_class": Case("finetune", setting("draws", 2), ("draws", "set task.labels_per_class")),
    "draw without labels_per_class": Case("finetune", setting("draw", 1), ("draw", "set labels_per_class")),
    "labels_per_class 0": Case(
        "finetune", setting("task.labels_per_class", 0), ("task.labels_per_class", "1 or more", "got 0")
    ),
    "labels_per_class on a kind without classes": Case(
        "finetune",
        both(regression_task_scoring("2.5"), setting("task.labels_per_class", 4)),
        ("task.labels_per_class", "not for kind regression", "a key of kind classification, multilabel"),
    ),
    "a class of one training row when labels_per_class asks for more": Case(
        "finetune",
        both(one_row_of_class("1"), setting("task.labels_per_class", 4)),
        ("task.labels_per_class", "class '1' has 1 training row", "labels_per_class: 1"),
    ),
    "a class of one training row before draws": Case(
        "finetune",
        both(one_row_of_class("1"), setting("task.labels_per_class", 4), setting("draws", 3)),
        ("task.labels_per_class", "class '1' has 1 training row"),
    ),
    "draws that would all take every training row": Case(
        "finetune",
        both(setting("task.labels_per_class", 20), setting("draws", 2)),
        ("draws", "every draw would take all 40 training rows", "lower labels_per_class, or set draws: 1"),
    ),
    "a label not in the recipe with labels_per_class": Case(
        "finetune",
        both(
            writing("task/train.tsv", b"sentence\tlabel\n" + GOOD_ROW + b"meh .\tmaybe\n"),
            setting("task.labels_per_class", 1),
        ),
        ("train.tsv line 3", "maybe"),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_bad_input_is_one_line_and_exit_code_2(case: Case, tmp_path: Path, checkpoint: Path):
    paths = Paths(tmp_path, write_corpus(tmp_path / "corpus"), write_task(tmp_path / "task"), checkpoint)
    run_dir = tmp_path / "run"
    data = {
        "pretrain": lambda: pretrain_recipe(paths.corpus, run_dir),
        "finetune": lambda: finetune_recipe(checkpoint, paths.task, run_dir),
        "eval": lambda: eval_recipe(paths.task, run_dir, {"model": str(checkpoint)}),
        "ulmfit": lambda: ulmfit_recipe(paths.corpus, paths.task, run_dir),
        "intermediate": lambda: intermediate_recipe(checkpoint, paths.task, paths.task, run_dir),
    }[case.stage]()
    recipe = case.change(data, paths) or write_yaml(tmp_path / "recipe.yaml", data)
    before = listing(tmp_path)

    result = CliRunner().invoke(app, [case.stage, str(recipe), *case.overrides])

    output = result.output.strip()
    assert result.exit_code == 2, f"exit code {result.exit_code}: {result.output[-2000:]}"
    assert "Traceback" not in result.output, result.output[-2000:]
    assert output.startswith("error: ") and "\n" not in output, f"not one error line: {output[:2000]!r}"
    assert len(output) < 1000, f"an error line of {len(output):,} characters"
    for fragment in case.named:
        assert fragment in output, f"{fragment!r} not named in {output!r}"
    assert not run_dir.exists(), f"the failed run left {sorted(p.name for p in run_dir.iterdir())} in its run_dir"
    assert listing(tmp_path) == before, "the failed command created, changed or deleted files"


def listing(folder: Path) -> dict[str, tuple[bool, int, int]]:
    """Every path under `folder` with whether it is a folder, its size and modification time."""
    return {
        str(path.relative_to(folder)): (path.is_dir(), path.stat().st_size, path.stat().st_mtime_ns)
        for path in folder.rglob("*")
    }


# The commands that read what runs wrote: an archive to validate, a run directory to plot.


def archive_with(
    tmp: Path, change: Callable[[bytearray, zipfile.ZipInfo, int], None], compression: int = zipfile.ZIP_DEFLATED
) -> Path:
    """tmp/submission.zip holding a CoLA.tsv, whose bytes `change(data, its info, where its data starts)` edits."""
    path = tmp / "submission.zip"
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        archive.writestr("CoLA.tsv", "index\tprediction\n" + "".join(f"{index}\t1\n" for index in range(1063)))
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("CoLA.tsv")
    data = bytearray(path.read_bytes())
    name_length, extra_length = (
        int.from_bytes(data[info.header_offset + at : info.header_offset + at + 2], "little") for at in (26, 28)
    )  # the local header's own lengths
    change(data, info, info.header_offset + 30 + name_length + extra_length)
    path.write_bytes(bytes(data))
    return path


def corrupt_member(compression: int) -> Callable[[Path], list[str]]:
    """One byte of CoLA.tsv's data flipped: stored, its CRC no longer matches; deflated, it no longer inflates."""

    def flip(data: bytearray, info: zipfile.ZipInfo, start: int) -> None:
        data[start + info.compress_size // 2] ^= 0xFF

    return lambda tmp: ["validate-submission", str(archive_with(tmp, flip, compression))]


def encrypted_member(tmp: Path) -> list[str]:
    """CoLA.tsv marked as encrypted (general-purpose flag bit 0) in its local and central headers."""

    def mark_encrypted(data: bytearray, info: zipfile.ZipInfo, start: int) -> None:
        data[info.header_offset + 6] |= 0x1
        data[data.index(b"PK\x01\x02") + 8] |= 0x1

    return ["validate-submission", str(archive_with(tmp, mark_encrypted))]


def metrics_line(content: bytes) -> Callable[[Path], list[str]]:
    """`finetune plot` on a run whose metrics.jsonl has `content` as its line 2."""

    def arguments(tmp: Path) -> list[str]:
        run_dir = tmp / "run"
        run_dir.mkdir()
        (run_dir / "metrics.jsonl").write_bytes(b'{"phase": "train", "step": 1, "loss": 2.5}\n' + content + b"\n")
        return ["plot", str(run_dir)]

    return arguments


class CommandCase(NamedTuple):
    arguments: Callable[[Path], list[str]]  # writes the inputs under tmp_path; returns the command line
    named: tuple[str, ...]  # fragments the error line must contain


# An archive's unreadable member is one of its problems: reported beside the others, exit code 1 (not valid).
ARCHIVE_CASES = {
    "archive member with a bad CRC": CommandCase(
        corrupt_member(zipfile.ZIP_STORED), ("problem: CoLA.tsv: member CoLA.tsv", "corrupt", "Bad CRC-32")
    ),
    "archive member with corrupt compressed bytes": CommandCase(
        corrupt_member(zipfile.ZIP_DEFLATED), ("problem: CoLA.tsv: member CoLA.tsv", "corrupt")
    ),
    "encrypted archive member": CommandCase(encrypted_member, ("problem: CoLA.tsv: member CoLA.tsv", "encrypted")),
}


def runs_of_other_dev_rows(tmp: Path) -> list[str]:
    """`runs compare` of two finished finetune runs (their files written here) whose dev rows differ at row 1."""
    for name, keys in (("a", ["k0", "k1", "k2"]), ("b", ["k0", "kX", "k2"])):
        run_dir = tmp / name
        run_dir.mkdir()
        (run_dir / "recipe.yaml").write_text(f"stage: finetune\nrun_dir: {run_dir}\n", encoding="utf-8")
        (run_dir / "metrics.jsonl").write_text('{"phase": "eval", "step": 1, "dev_accuracy": 1.0}\n', encoding="utf-8")
        scores = {"dev_accuracy": 1.0}
        result = {"main_metric": "accuracy", "saved": "best", "best": scores, "last": scores}
        (run_dir / "result.json").write_text(json.dumps(result), encoding="utf-8")
        rows = [
            {"row": index, "key": key, "label": "1", "predicted": "1", "probabilities": {"0": 0.2, "1": 0.8}}
            for index, key in enumerate(keys)
        ]
        (run_dir / "dev_predictions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return ["runs", "compare", str(tmp / "a"), str(tmp / "b")]


COMMAND_CASES = {
    "runs compare of runs on different dev rows": CommandCase(
        runs_of_other_dev_rows, ("runs compare", "different dev rows", "dev row 1 differs", "task.dev_split")
    ),
    "metrics line a JSON list": CommandCase(
        metrics_line(b"[1, 2]"), ("metrics.jsonl line 2", "expected a JSON object, found list")
    ),
    "metrics line a JSON number": CommandCase(
        metrics_line(b"3"), ("metrics.jsonl line 2", "expected a JSON object, found int")
    ),
    "metrics line not JSON": CommandCase(metrics_line(b'{"step": 2,'), ("metrics.jsonl line 2", "not JSON")),
}


@pytest.mark.parametrize("case", COMMAND_CASES.values(), ids=COMMAND_CASES.keys())
def test_bad_input_to_other_commands_is_one_line_and_exit_code_2(case: CommandCase, tmp_path: Path):
    arguments = case.arguments(tmp_path)
    before = sorted(tmp_path.rglob("*"))

    result = CliRunner().invoke(app, arguments)

    output = result.output.strip()
    assert result.exit_code == 2, f"exit code {result.exit_code}: {result.output[-2000:]}"
    assert "Traceback" not in result.output, result.output[-2000:]
    assert output.startswith("error: ") and "\n" not in output, f"not one error line: {output!r}"
    for fragment in case.named:
        assert fragment in output, f"{fragment!r} not named in {output!r}"
    assert sorted(tmp_path.rglob("*")) == before, "the command created or deleted files"


def test_run_dir_in_a_folder_that_cannot_be_written(tmp_path):
    """One line naming run_dir and the folder, before any work. Root (as on CI) may write into any folder but an
    immutable one, so as root the folder is made immutable (chattr +i); otherwise it loses its write permission."""
    corpus = write_corpus(tmp_path / "corpus")
    locked = tmp_path / "locked"
    locked.mkdir()
    recipe = write_yaml(tmp_path / "recipe.yaml", pretrain_recipe(corpus, locked / "runs" / "one"))
    as_root = os.geteuid() == 0
    if as_root:
        made = (
            subprocess.run(["chattr", "+i", str(locked)], capture_output=True, text=True, check=False)
            if shutil.which("chattr")
            else None
        )
        if made is None or made.returncode != 0:
            pytest.skip(
                "running as root, and this file system cannot make a folder immutable (chattr +i): root "
                "could write into any folder here"
            )
    else:
        locked.chmod(0o555)
    try:
        result = CliRunner().invoke(app, ["pretrain", str(recipe)])
    finally:
        if as_root:
            subprocess.run(["chattr", "-i", str(locked)], check=True)
        else:
            locked.chmod(0o755)
    error = result.output.strip()
    assert result.exit_code == 2, error[-2000:]
    assert error.startswith("error: ") and "\n" not in error and "Traceback" not in error, error
    assert "run_dir" in error and f"{locked} is not writable" in error, error
    assert list(locked.iterdir()) == []


@pytest.mark.parametrize("case", ARCHIVE_CASES.values(), ids=ARCHIVE_CASES.keys())
def test_an_unreadable_archive_member_is_a_problem_and_exit_code_1(case: CommandCase, tmp_path: Path):
    arguments = case.arguments(tmp_path)
    before = sorted(tmp_path.rglob("*"))

    result = CliRunner().invoke(app, arguments)

    assert result.exit_code == 1, f"exit code {result.exit_code}: {result.output[-2000:]}"
    assert "Traceback" not in result.output, result.output[-2000:]
    assert "CoLA.tsv: not read (see its problem below)" in result.output
    assert result.output.strip().endswith("submission.zip: not valid"), result.output
    for fragment in case.named:
        assert fragment in result.output, f"{fragment!r} not named in {result.output!r}"
    assert sorted(tmp_path.rglob("*")) == before, "the command created or deleted files"
