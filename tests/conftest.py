"""Shared fixtures: tiny generated data in tmp_path and helpers that write recipe YAML files."""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

# Set before the tokenizers library is imported anywhere: no fork warnings, no extra threads.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the suite never downloads anything
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# No end-of-run plots (finetune/reporting/finish.py): about a second of matplotlib in each of the few hundred runs the
# suite makes, 40% of the time of tests/kinds and tests/stages. The tests about plots ask for them (`plots_drawn`).
os.environ.setdefault("FINETUNE_PLOTS", "0")
# Under pytest-xdist (`make test` runs `-n auto`) each worker gets an equal share of the cores, set before torch is
# imported and inherited by the CLI subprocesses a test starts: tiny models gain nothing from a second thread, and
# two workers of two threads each on two cores wait on each other's descheduled threads.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault(
        "OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    )

# Each test process (each xdist worker; the CLI subprocesses a test starts inherit it) copies the remote code of the
# checkpoints it loads into a folder of its own: transformers keys that copy by the checkpoint folder's last name, and
# many tests name theirs alike ("checkpoint", "mean"), so two processes loading at once wrote over each other's files
# in ~/.cache/huggingface/modules (seen as order-dependent failures of the remote-code tests).
os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix="finetune-tests-hf-modules-")
atexit.register(shutil.rmtree, os.environ["HF_MODULES_CACHE"], ignore_errors=True)

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _auto_classes_restored() -> Iterator[None]:
    """transformers' Auto classes as they were before the test. Loading a folder's remote code (sentence-transformers'
    `trust_remote_code=True`) registers the folder's copies of its classes for the rest of the process, so a later
    test's `AutoModelForSequenceClassification.from_pretrained` got that copy instead of the package's class: a
    failure that came and went with the tests' order."""
    configuration = sys.modules.get("transformers.models.auto.configuration_auto")
    modeling = sys.modules.get("transformers.models.auto.modeling_auto")
    if configuration is None or modeling is None:  # nothing registered yet (imported by the test: restored next time)
        yield
        return
    mappings = [configuration.CONFIG_MAPPING]
    mappings += [value for value in vars(modeling).values() if hasattr(value, "_extra_content")]
    saved = [dict(mapping._extra_content) for mapping in mappings]
    yield
    for mapping, content in zip(mappings, saved):
        mapping._extra_content.clear()
        mapping._extra_content.update(content)


@contextlib.contextmanager
def drawing_plots() -> Iterator[None]:
    """Runs made inside draw their end-of-run plots, as they do outside the suite (for a module's fixture)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FINETUNE_PLOTS", "1")
        yield


@pytest.fixture
def plots_drawn() -> Iterator[None]:
    """Runs in this test draw their end-of-run plots, as they do outside the suite."""
    with drawing_plots():
        yield


SUBJECTS = ["the film", "the plot", "the acting", "the music", "the ending", "the story", "the cast", "the script"]
POSITIVE = ["great", "lovely", "superb", "charming", "brilliant", "delightful"]
NEGATIVE = ["awful", "boring", "dreadful", "tedious", "clumsy", "dull"]
FILLERS = ["really", "very", "quite", "so", "truly"]


def make_sentence(rng: random.Random, positive: bool) -> str:
    """A short review-like sentence whose adjective carries the label."""
    adjective = rng.choice(POSITIVE if positive else NEGATIVE)
    return f"{rng.choice(SUBJECTS)} was {rng.choice(FILLERS)} {adjective} ."


def one_error_line(result) -> str:
    """The single `error:` line of a CLI run refused on user input (exit code 2, no traceback)."""
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    """Write a dict as YAML (the way a user writes a recipe)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def write_corpus(folder: Path, lines: int = 200) -> Path:
    """A text corpus of short generated lines (one document per line) in folder/train.txt."""
    rng = random.Random(1)
    documents = [make_sentence(rng, rng.random() < 0.5) for _ in range(lines)]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train.txt"
    path.write_text("\n".join(documents) + "\n", encoding="utf-8")
    return path


def write_task(folder: Path, train_rows: int = 40, dev_rows: int = 24, test_rows: int = 10) -> Path:
    """A GLUE-layout task folder: train.tsv / dev.tsv (`sentence\\tlabel`, 0/1) and test.tsv (`index\\tsentence`)."""
    rng = random.Random(2)
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train_rows), ("dev", dev_rows)):
        rows = ["sentence\tlabel"]
        for index in range(count):
            positive = index % 2 == 0
            rows.append(f"{make_sentence(rng, positive)}\t{int(positive)}")
        (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    test = ["index\tsentence"] + [f"{index}\t{make_sentence(rng, index % 2 == 0)}" for index in range(test_rows)]
    (folder / "test.tsv").write_text("\n".join(test) + "\n", encoding="utf-8")
    return folder


@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    """200 short generated lines in tmp_path/corpus/train.txt."""
    return write_corpus(tmp_path / "corpus")


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    """A GLUE-layout task folder in tmp_path/task (40 train, 24 dev, 10 test rows)."""
    return write_task(tmp_path / "task")


def custom_task_section(data_dir: Path, max_length: int = 16) -> dict[str, Any]:
    """A recipe `task` section for the generated task (a custom, non-GLUE task)."""
    return {
        "name": "tiny-sentiment",
        "data_dir": str(data_dir),
        "text_columns": ["sentence"],
        "label_column": "label",
        "labels": ["0", "1"],
        "metrics": ["accuracy", "f1"],
        "max_length": max_length,
    }


def fixed_wordpiece(lines: list[str], vocab_size: int):
    """A lowercase WordPiece tokenizer of `lines` that is the same in every process: its characters (alone and as
    ##continuations), then its most frequent words, ties broken alphabetically. The trainer (train_wordpiece) breaks
    ties in hash-map order, so a tiny model built on a trained one was a different model in each test run, and what
    it learnt (or how closely two routes agreed) passed or failed by chance."""
    from collections import Counter

    from tokenizers import normalizers, pre_tokenizers

    from finetune.data.tokenizers import WORDPIECE_SPECIAL_TOKENS, wordpiece_of_vocabulary

    normalize, split = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = Counter(word for line in lines for word, _ in split.pre_tokenize_str(normalize.normalize_str(line)))
    characters = sorted({character for word in words for character in word})
    pieces = [*characters, *(f"##{character}" for character in characters)]
    room = vocab_size - len(WORDPIECE_SPECIAL_TOKENS) - len(pieces)
    frequent = [word for word, _ in sorted(words.items(), key=lambda item: (-item[1], item[0])) if len(word) > 1]
    return wordpiece_of_vocabulary([*pieces, *frequent[: max(room, 0)]])


def save_tiny_masked_lm(
    folder: Path, layers: int = 2, hidden: int = 32, dropout: float = 0.1, max_positions: int = 32
) -> Path:
    """A tiny randomly initialised BERT masked LM with a WordPiece tokenizer trained on generated text, saved as a
    checkpoint in `folder/checkpoint` (seeded: the same arguments give the same weights)."""
    import torch

    from finetune.data.corpus import read_documents
    from finetune.models.masked_lm import build_masked_lm
    from finetune.recipes import MaskedLMModelConfig
    from finetune.training.checkpoints import save_checkpoint

    tokenizer = fixed_wordpiece(read_documents([write_corpus(folder / "corpus")]), vocab_size=200)
    torch.manual_seed(0)
    config = MaskedLMModelConfig(layers=layers, hidden=hidden, heads=2, intermediate=2 * hidden, dropout=dropout)
    model = build_masked_lm(config, len(tokenizer), max_positions=max_positions, pad_token_id=tokenizer.pad_token_id)
    return save_checkpoint(model, tokenizer, folder / "checkpoint")


def assert_split_trains_like_whole(checkpoint: Path, tmp_path: Path, monkeypatch, recipe) -> None:
    """Two runs of `recipe(run_dir)`, without and with training.split_by_length (shuffled batches, the model's own
    forward), save the same weights; every batch is cut wherever lengths differ (no fixed cost a pass), and some
    batch is cut."""
    from finetune.data.task_batches import length_pieces

    cuts = []

    def every_length_apart(lengths: list[int]) -> list:
        cuts.append(len(pieces := length_pieces(lengths, 0)))
        return pieces

    monkeypatch.setattr("finetune.kinds.fine_tuning.length_pieces", every_length_apart)
    # skip_padding off: a model that computes its real tokens only keeps its batches whole.
    whole, in_pieces = ({"split_by_length": split, "skip_padding": False} for split in (False, True))
    assert_runs_save_the_same_weights(checkpoint, tmp_path, recipe, {"whole": whole, "split": in_pieces})
    assert max(cuts) > 1, "no batch was cut: the comparison would prove nothing"


def assert_unpadded_trains_like_padded(checkpoint: Path, tmp_path: Path, monkeypatch, recipe) -> None:
    """Two runs of `recipe(run_dir)` on shuffled batches, with the model's own forward and with the route that
    computes the real tokens only (training.skip_padding), save the same weights; the route is taken in training."""
    import finetune.models.packed_bert as packed_bert

    trained = []

    def counting(bert, *args):
        trained.append(bert.training)
        return encoder(bert, *args)

    encoder = packed_bert.packed_encoder
    monkeypatch.setattr(packed_bert, "packed_encoder", counting)
    variants = {"padded": {"skip_padding": False}, "unpadded": {"skip_padding": True}}
    assert_runs_save_the_same_weights(checkpoint, tmp_path, recipe, variants)
    assert any(trained), "the route was never taken in training: the comparison would prove nothing"


def assert_runs_save_the_same_weights(checkpoint: Path, tmp_path: Path, recipe, variants: dict[str, dict]) -> None:
    """Runs of `recipe(run_dir)` on shuffled batches without gradient clipping, one per variant (its training keys),
    save the same weights (atol 1e-6), which training changed from `checkpoint`'s."""
    import torch
    from safetensors.torch import load_file

    from finetune.recipes import load_recipe
    from finetune.stages.finetune import run_finetune

    weights = []
    for name, keys in variants.items():
        data = recipe(tmp_path / f"run-{name}")
        data["training"].update({"group_by_length": False, "max_grad_norm": None, **keys})
        checkpoint_dir = run_finetune(load_recipe(write_yaml(tmp_path / f"{name}.yaml", data)))
        weights.append(load_file(checkpoint_dir / "model.safetensors"))
    assert any(
        not torch.equal(weight, load_file(checkpoint / "model.safetensors").get(name, weight + 1))
        for name, weight in weights[0].items()
    ), "training changed nothing: the comparison would prove nothing"
    first, *others = weights
    for other in others:
        for name, weight in first.items():
            assert torch.allclose(weight, other[name], atol=1e-6, rtol=1e-5), (name, (weight - other[name]).abs().max())


def finetune_where_a_user_would(folder: Path, recipe_name: str, recipe_text: str) -> Path:
    """`finetune finetune RECIPE` run in `folder` as a newcomer runs it there (relative paths, a tiny masked LM at
    folder/lm/checkpoint, the recipe file written as given); the folder, once the run succeeded."""
    from typer.testing import CliRunner

    from finetune.cli import app

    save_tiny_masked_lm(folder / "lm", layers=1, hidden=16)
    (folder / recipe_name).write_text(recipe_text, encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        result = CliRunner().invoke(app, ["finetune", recipe_name])
    assert result.exit_code == 0, result.output
    return folder


def pretrain_recipe(corpus: Path, run_dir: Path) -> dict[str, Any]:
    """A tiny, valid pretrain recipe (hidden 32, 2 layers, 2 heads, vocab ~200, blocks of 16, 10 steps)."""
    return {
        "stage": "pretrain",
        "description": "tiny test pretraining",
        "run_dir": str(run_dir),
        "seed": 0,
        "model": {"family": "bert", "layers": 2, "hidden": 32, "heads": 2, "intermediate": 64, "dropout": 0.0},
        "tokenizer": {"vocab_size": 200, "min_frequency": 1},
        "corpus": {"train_files": [str(corpus)], "validation_fraction": 0.1, "block_size": 16, "cache_dir": None},
        "training": {"epochs": 1, "max_steps": 10, "batch_size": 8, "lr": 1e-3, "log_every": 2, "device": "cpu"},
    }


def finetune_recipe(checkpoint: Path, task: Path, run_dir: Path) -> dict[str, Any]:
    """A tiny, valid finetune recipe: 2 epochs, STLR, discriminative LRs, gradual unfreezing."""
    return {
        "stage": "finetune",
        "description": "tiny test fine-tuning",
        "run_dir": str(run_dir),
        "seed": 0,
        "model": {"checkpoint": str(checkpoint), "init": "pretrained"},
        "task": custom_task_section(task),
        "training": {"epochs": 2, "batch_size": 8, "lr": 2e-3, "log_every": 1, "device": "cpu"},
        "schedule": {"kind": "stlr", "cut_frac": 0.1, "ratio": 32},
        "discriminative": {"factor": 2.6},
        "unfreezing": {"mode": "gradual", "initial_groups": 1, "groups_per_epoch": 1},
    }


def eval_recipe(task: Path, run_dir: Path, models: dict[str, str]) -> dict[str, Any]:
    """A tiny eval recipe scoring `models` on the dev split."""
    return {
        "stage": "eval",
        "run_dir": str(run_dir),
        "task": custom_task_section(task),
        "split": "dev",
        "models": models,
        "batch_size": 16,
        "device": "cpu",
    }


@pytest.fixture
def pretrain_recipe_data(tmp_path: Path, corpus_file: Path) -> dict[str, Any]:
    """A tiny, valid pretrain recipe as a dict, run_dir inside tmp_path."""
    return pretrain_recipe(corpus_file, tmp_path / "runs" / "pretrain")


@pytest.fixture
def finetune_recipe_data(tmp_path: Path, task_dir: Path) -> dict[str, Any]:
    """A tiny, valid finetune recipe as a dict; its checkpoint folder does not exist."""
    return finetune_recipe(tmp_path / "runs" / "pretrain" / "checkpoint", task_dir, tmp_path / "runs" / "finetune")


@pytest.fixture
def eval_recipe_data(tmp_path: Path, task_dir: Path) -> dict[str, Any]:
    """A tiny eval recipe as a dict; its model folder does not exist."""
    return eval_recipe(task_dir, tmp_path / "runs" / "eval", {"model": str(tmp_path / "runs" / "ft" / "checkpoint")})


@pytest.fixture
def write_recipe(tmp_path: Path) -> Callable[..., Path]:
    """Write a recipe dict to tmp_path/recipes/<name>.yaml and return the path."""

    def write(data: dict[str, Any], name: str = "recipe") -> Path:
        return write_yaml(tmp_path / "recipes" / f"{name}.yaml", data)

    return write


@contextlib.contextmanager
def interrupted_at_step(
    step: int, error: type[BaseException] = KeyboardInterrupt, phase: str | None = None
) -> Iterator[None]:
    """Inside the block, training raises `error` right after saving its periodic checkpoint of `step` (of `phase`,
    e.g. head_warmup, where given: a phase before the training counts its own steps), as a run killed there would
    stop; the block expects that error, and the training loop is itself again after it."""
    from finetune.training import loop as loop_module

    original_init = loop_module.TrainingLoop.__init__

    def init_that_interrupts(self, *arguments, **keywords):
        original_init(self, *arguments, **keywords)
        save = self.save_checkpoint

        def save_then_stop(progress):
            folder = save(progress)
            if progress.step == step and phase in (None, progress.phase):
                raise error
            return folder

        self.save_checkpoint = save_then_stop

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop_module.TrainingLoop, "__init__", init_that_interrupts)
        with pytest.raises(error):
            yield


def two_processes(
    tmp_path: Path, launcher_source: str, *arguments: str, timeout: float = 240
) -> subprocess.CompletedProcess:
    """`launcher_source` (a script taking `arguments`) on 2 CPU processes under torchrun (gloo, one thread each), run
    in `tmp_path`; its output captured, never raising on failure (the caller's assertion shows the output)."""
    launcher = tmp_path / "launch.py"
    launcher.write_text(launcher_source, encoding="utf-8")
    environment = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": str(REPO_ROOT)}  # fmt: skip
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(launcher)]
    return subprocess.run(
        [*command, *arguments], capture_output=True, text=True, timeout=timeout, env=environment, cwd=tmp_path,
        check=False,
    )  # fmt: skip


# Fixtures that several test modules use (module-scoped ones are built once per module, as before).


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A tiny randomly initialised BERT masked LM with a WordPiece tokenizer, saved as a checkpoint."""
    folder = tmp_path_factory.mktemp("pretrained")
    return save_tiny_masked_lm(folder)


@pytest.fixture(scope="module")
def pretrained_without_dropout(tmp_path_factory) -> Path:
    """The tiny checkpoint with dropout off, so that runs differing only in batching can be compared exactly."""
    folder = tmp_path_factory.mktemp("no-dropout")
    return save_tiny_masked_lm(folder, dropout=0.0)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, Path]:
    """One saved tokenizer per kind, so that runs compared with each other use the same ids."""
    from finetune.data.corpus import read_documents
    from finetune.models.language_models import train_tokenizer
    from finetune.recipes import TokenizerConfig

    folder = tmp_path_factory.mktemp("tokenizers")
    documents = read_documents([write_corpus(folder / "corpus", lines=300)])
    saved = {}
    for family in ("bert", "gpt2"):
        tokenizer = train_tokenizer(
            family, documents, TokenizerConfig(vocab_size=200, min_frequency=1, lowercase=family == "bert")
        )
        tokenizer.save_pretrained(folder / family)
        saved[family] = folder / family
    saved["awd_lstm"] = saved["gpt2"]
    return saved


@pytest.fixture
def fake_hub(monkeypatch):
    """`datasets.load_dataset` answering nyu-mll/glue with the hub's columns and integer labels."""
    import datasets

    def split(columns: dict, labels: list, ids: list[int] | None = None) -> datasets.Dataset:
        rows = len(labels)
        return datasets.Dataset.from_dict(
            {
                **{name: [f"{name} {index}" for index in range(rows)] for name in columns},
                "label": labels,
                "idx": ids or list(range(rows)),
            }
        )

    pair = ("premise", "hypothesis")
    configs = {
        # hub order: 0 entailment, 1 neutral, 2 contradiction; the test splits are labelled -1
        "mnli": datasets.DatasetDict(
            {
                "train": split(pair, [0, 1]),
                "validation_matched": split(pair, [0, 1, 2]),
                "validation_mismatched": split(pair, [2, 2]),
                "test_matched": split(pair, [-1, -1], [7, 8]),
                "test_mismatched": split(pair, [-1]),
            }
        ),
        "ax": datasets.DatasetDict({"test": split(pair, [-1, -1, -1])}),
        "stsb": datasets.DatasetDict(
            {
                "validation": split(("sentence1", "sentence2"), [4.5, 0.25]),
                "test": split(("sentence1", "sentence2"), [-1.0]),
            }
        ),
        "rte": datasets.DatasetDict({"validation": split(("sentence1", "sentence2"), [1, 0, 0])}),
    }
    calls = []

    def load_dataset(path, name=None, **kwargs):
        calls.append((path, name))
        if name not in configs:
            raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)")
        return configs[name]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls
