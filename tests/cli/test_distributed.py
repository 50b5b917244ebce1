"""The same recipes on 2 CPU processes (torchrun, gloo): what `accelerate launch` does on several GPUs."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed

from finetune.data.corpus import read_documents
from finetune.data.tokenizers import train_wordpiece
from finetune.run_dir import read_metrics
from tests.conftest import (
    finetune_recipe,
    pretrain_recipe,
    save_tiny_masked_lm,
    two_processes,
    write_corpus,
    write_task,
    write_yaml,
)

pytestmark = [
    pytest.mark.skipif(
        not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
        reason="needs torch.distributed with gloo",
    ),
    pytest.mark.slow,  # ranks started by accelerate launch (make test-slow; CI runs it too)
]

# Runs the CLI under torchrun; reports each process's view so the test can check all of them.
LAUNCHER = textwrap.dedent("""
    import hashlib, json, sys
    import finetune.stages.pretrain as pretrain_stage
    import finetune.stages.pretrain_data as pretrain_data
    import finetune.kinds.fine_tuning as finetune_stage  # every task kind's accelerator is made there
    from finetune.cli import app

    make_accelerator, shared_tokenizer = pretrain_stage.make_accelerator, pretrain_data.shared_tokenizer
    process = {}

    def reporting_make_accelerator(*args, **kwargs):
        accelerator = make_accelerator(*args, **kwargs)
        process["index"] = accelerator.process_index
        print(f"NUM_PROCESSES {accelerator.num_processes} {accelerator.distributed_type}", flush=True)
        return accelerator

    def reporting_shared_tokenizer(*args, **kwargs):
        tokenizer = shared_tokenizer(*args, **kwargs)
        vocab = json.dumps(sorted(tokenizer.get_vocab().items()))
        print(f"VOCAB {process['index']} {hashlib.md5(vocab.encode()).hexdigest()}", flush=True)
        return tokenizer

    pretrain_stage.make_accelerator = finetune_stage.make_accelerator = reporting_make_accelerator
    pretrain_data.shared_tokenizer = reporting_shared_tokenizer
    app(sys.argv[1:], prog_name="finetune")
""")


def torchrun(tmp_path: Path, *arguments: str, launcher_source: str = LAUNCHER) -> subprocess.CompletedProcess:
    """`launcher_source` (a script taking the CLI's arguments) on 2 CPU processes, one thread each."""
    return two_processes(tmp_path, launcher_source, *arguments)


def check_two_processes(result: subprocess.CompletedProcess) -> None:
    output = result.stdout + result.stderr
    assert re.findall(r"NUM_PROCESSES (\d+) \S*MULTI_CPU", output) == ["2", "2"], output[-3000:]


def test_pretrain_on_two_processes(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    data = pretrain_recipe(corpus, tmp_path / "run")
    data["training"]["max_steps"] = 4
    result = torchrun(tmp_path, "pretrain", str(write_yaml(tmp_path / "pretrain.yaml", data)))
    output = result.stdout + result.stderr
    check_two_processes(result)
    # Every process must tokenize the corpus identically, or their token ids mean different things.
    vocabularies = dict(re.findall(r"VOCAB (\d) ([0-9a-f]+)", output))
    assert len(vocabularies) == 2 and len(set(vocabularies.values())) == 1, (
        f"the processes trained different tokenizers: {vocabularies}"
    )
    assert result.returncode == 0, output[-3000:]
    train = [record for record in read_metrics(tmp_path / "run" / "metrics.jsonl") if record["phase"] == "train"]
    assert train[-1]["step"] == 4


def test_finetune_with_gradual_unfreezing_on_two_processes(tmp_path):
    checkpoint = save_tiny_masked_lm(tmp_path / "pretrained")
    data = finetune_recipe(checkpoint, write_task(tmp_path / "task"), tmp_path / "run")
    result = torchrun(tmp_path, "finetune", str(write_yaml(tmp_path / "finetune.yaml", data)))
    output = result.stdout + result.stderr
    check_two_processes(result)
    assert result.returncode == 0, output[-3000:]
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["trainable_groups"] for r in records if r["phase"] == "unfreeze"] == [1, 2]
    # 40 examples over 2 processes of 8 per batch: 3 steps per epoch, written once (by the main process).
    assert [r["step"] for r in records if r["phase"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert (tmp_path / "run" / "checkpoint" / "model.safetensors").is_file()


def test_awd_lstm_on_two_processes_matches_one_process_with_the_same_global_batch(tmp_path):
    """BPTT streams split by process: 2 x 4 rows train the same model as 1 x 8 rows (dropouts off, same data)."""
    from safetensors.torch import load_file

    from finetune.data.tokenizers import train_byte_level_bpe
    from finetune.recipes import load_recipe
    from finetune.stages.pretrain import run_pretrain

    corpus = write_corpus(tmp_path / "corpus", lines=300)
    tokenizer = train_byte_level_bpe(read_documents([corpus]), vocab_size=300, min_frequency=1)
    tokenizer.save_pretrained(tmp_path / "tokenizer")

    def recipe(run_dir: Path, batch_size: int) -> dict:
        data = pretrain_recipe(corpus, run_dir)
        data["model"] = {
            "family": "awd_lstm",
            "embedding_size": 16,
            "hidden": 24,
            "layers": 2,
            "output_dropout": 0,
            "hidden_dropout": 0,
            "input_dropout": 0,
            "embedding_dropout": 0,
            "weight_dropout": 0,
        }
        data["tokenizer"] = {"path": str(tmp_path / "tokenizer")}
        data["training"].update({"batch_size": batch_size, "max_steps": 6})
        return data

    single = load_recipe(write_yaml(tmp_path / "single.yaml", recipe(tmp_path / "single", 8)))
    run_pretrain(single)
    result = torchrun(tmp_path, "pretrain", str(write_yaml(tmp_path / "double.yaml", recipe(tmp_path / "double", 4))))
    check_two_processes(result)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]

    def final_validation_loss(run_dir: Path) -> float:
        return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "eval"][-1]["validation_loss"]

    assert final_validation_loss(tmp_path / "double") == pytest.approx(
        final_validation_loss(tmp_path / "single"), rel=1e-5
    )
    single_weights = load_file(tmp_path / "single" / "checkpoint" / "model.safetensors")
    double_weights = load_file(tmp_path / "double" / "checkpoint" / "model.safetensors")
    for name, weight in single_weights.items():
        assert torch.allclose(weight, double_weights[name], atol=1e-6), name


# Runs CLI commands (separated by "+") one after the other under torchrun, in one start-up, and reports every
# file each process opens for writing: the main process alone may write into a run directory.
TRACKING_LAUNCHER = textwrap.dedent("""
    import builtins, io, itertools, os, sys
    from accelerate import PartialState
    from finetune.cli import app

    rank, real_open = os.environ.get("RANK", "0"), builtins.open

    def tracking_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and any(flag in mode for flag in "wax+"):
            print(f"WRITE {rank} {os.path.abspath(file)}", flush=True)
        return real_open(file, mode, *args, **kwargs)

    builtins.open = io.open = tracking_open
    state = PartialState(cpu=True)  # the process group every stage's Accelerator joins
    print(f"NUM_PROCESSES {state.num_processes} {state.distributed_type}", flush=True)
    for plus, command in itertools.groupby(sys.argv[1:], key=lambda argument: argument == "+"):
        if not plus and app(list(command), prog_name="finetune", standalone_mode=False):
            sys.exit(1)
""")


def torchrun_tracking_writes(tmp_path: Path, *arguments: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run `finetune ARGUMENTS` (commands separated by "+") on 2 processes; the result and process 1's writes."""
    result = torchrun(tmp_path, *arguments, launcher_source=TRACKING_LAUNCHER)
    check_two_processes(result)
    # Exit code 0, not only every output written: a worker aborted at teardown (finetune.training.driver's
    # leave_process_group) fails the launch.
    assert result.returncode == 0, (result.stdout + result.stderr)[-30000:]
    return result, re.findall(r"^WRITE 1 (.+)$", result.stdout, flags=re.MULTILINE)


# Stated in docs/gpus-and-clusters.md: with dropout off, N processes x batch B follow the loss
# curve of 1 process x batch N*B to this relative tolerance (only the order of float sums differs).
LOSS_TOLERANCE = 1e-5


def test_finetune_and_eval_on_two_processes_match_one_process(tmp_path):
    """Same global batch and seed: the same loss curve, weights, dev scores and predictions as on one process.

    33 training examples in steps of 16 leave a last step of 1 example: on 2 processes one of them runs a
    zero-weight padding batch, and nothing is repeated. 23 dev examples are not a multiple of 2 x the eval
    batch: accelerate's gather_for_metrics must drop the rows it repeated to even out the processes.
    """
    from safetensors.torch import load_file

    from finetune.commands.evaluate import run_eval
    from finetune.recipes import load_recipe
    from finetune.stages.finetune import run_finetune
    from tests.conftest import eval_recipe

    pretrained = save_tiny_masked_lm(tmp_path / "pretrained", dropout=0.0)
    task = write_task(tmp_path / "task", train_rows=33, dev_rows=23)

    def finetune_data(name: str, batch_size: int) -> dict:
        data = finetune_recipe(pretrained, task, tmp_path / name)
        data["classifier_dropout"] = 0.0
        data["training"]["batch_size"] = batch_size
        return data

    # eval: the same checkpoint scored on 1 and on 2 processes must give the same scores and predictions.
    models = {"single": str(tmp_path / "single" / "checkpoint")}

    def eval_data(name: str) -> dict:
        data = eval_recipe(task, tmp_path / name, models)  # batch 16: 2 x 16 does not divide the 23 dev examples
        data["write_predictions"] = True
        return data

    run_finetune(load_recipe(write_yaml(tmp_path / "single.yaml", finetune_data("single", 16))))
    run_eval(load_recipe(write_yaml(tmp_path / "eval-single.yaml", eval_data("eval-single"))))
    result, written = torchrun_tracking_writes(
        tmp_path,
        "finetune",
        str(write_yaml(tmp_path / "double.yaml", finetune_data("double", 8))),
        "+",
        "eval",
        str(write_yaml(tmp_path / "eval-double.yaml", eval_data("eval-double"))),
    )
    # The model computes its real tokens only (training.skip_padding), its forward called by DDP's.
    assert "the model computes their real tokens only" in result.stdout + result.stderr
    run_dirs = (str(tmp_path / "double"), str(tmp_path / "eval-double"))
    assert not [path for path in written if path.startswith(run_dirs)], f"process 1 wrote into a run_dir: {written}"

    single, double = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("single", "double"))
    assert len(double) == len({json.dumps(record, sort_keys=True) for record in double}), "a record was logged twice"
    for phase in ("train", "eval"):
        steps = [[record["step"] for record in records if record["phase"] == phase] for records in (single, double)]
        assert steps[0] == steps[1] and steps[0], phase
    train = [[record for record in records if record["phase"] == "train"] for records in (single, double)]
    assert [record["step"] for record in train[0]] == [1, 2, 3, 4, 5, 6]  # 3 steps an epoch: 16 + 16 + 1
    for one, two in zip(*train):
        assert two["loss"] == pytest.approx(one["loss"], rel=LOSS_TOLERANCE), f"step {one['step']}"
        assert two["lr"] == pytest.approx(one["lr"])
    evaluations = [[record for record in records if record["phase"] == "eval"] for records in (single, double)]
    for one, two in zip(*evaluations):
        assert (two["dev_accuracy"], two["dev_f1"]) == (one["dev_accuracy"], one["dev_f1"])
        assert two["validation_loss"] == pytest.approx(one["validation_loss"], rel=LOSS_TOLERANCE)
    single_weights = load_file(tmp_path / "single" / "checkpoint" / "model.safetensors")
    double_weights = load_file(tmp_path / "double" / "checkpoint" / "model.safetensors")
    for name, weight in single_weights.items():
        assert torch.allclose(weight, double_weights[name], rtol=LOSS_TOLERANCE, atol=1e-6), name

    reports = [json.loads((tmp_path / name / "report.json").read_text()) for name in ("eval-single", "eval-double")]
    assert reports[0]["results"] == reports[1]["results"] and reports[0]["examples"] == 23
    predictions = [
        (tmp_path / name / "predictions" / "single.tsv").read_text().splitlines()
        for name in ("eval-single", "eval-double")
    ]
    assert predictions[0] == predictions[1], "2 processes predicted other rows (or repeated some)"
    assert [row.split("\t")[0] for row in predictions[1][1:]] == [str(index) for index in range(23)]


def test_masked_lm_pretraining_on_two_processes_matches_one_process(tmp_path):
    """bert blocks: 2 x 4 a step train as 1 x 8, and the validation loss counts every block once.

    The ~10 validation blocks in batches of 4 do not split evenly over 2 processes: blocks repeated to even
    them out would count twice and move the validation loss away from the one-process figure.
    """
    from safetensors.torch import load_file

    from finetune.recipes import load_recipe
    from finetune.stages.pretrain import run_pretrain

    corpus = write_corpus(tmp_path / "corpus")
    # A saved tokenizer: WordPiece training is not deterministic (huggingface/tokenizers#1794).
    train_wordpiece(read_documents([corpus]), vocab_size=200, min_frequency=1).save_pretrained(tmp_path / "tokenizer")

    def recipe(name: str, batch_size: int) -> Path:
        data = pretrain_recipe(corpus, tmp_path / name)
        data["tokenizer"] = {"path": str(tmp_path / "tokenizer")}
        data["training"].update({"batch_size": batch_size, "log_every": 1})
        data["eval_every"] = 5
        return write_yaml(tmp_path / f"{name}.yaml", data)

    run_pretrain(load_recipe(recipe("single", 8)))
    _, written = torchrun_tracking_writes(tmp_path, "pretrain", str(recipe("double", 4)))
    assert not [path for path in written if path.startswith(str(tmp_path / "double"))], written

    single, double = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("single", "double"))
    assert [(r["phase"], r["step"]) for r in single] == [(r["phase"], r["step"]) for r in double]
    evaluations = 0
    for one, two in zip(single, double):
        key = "loss" if one["phase"] == "train" else "validation_loss"
        assert two[key] == pytest.approx(one[key], rel=LOSS_TOLERANCE), (one["phase"], one["step"])
        evaluations += one["phase"] == "eval"
    assert evaluations >= 2
    single_weights = load_file(tmp_path / "single" / "checkpoint" / "model.safetensors")
    double_weights = load_file(tmp_path / "double" / "checkpoint" / "model.safetensors")
    for name, weight in single_weights.items():
        assert torch.allclose(weight, double_weights[name], rtol=LOSS_TOLERANCE, atol=1e-6), name


def test_a_head_warmup_on_two_processes_matches_one_process(tmp_path):
    """A BERT saved without its masked-LM head, continued: the head's warm-up (its parameters alone trainable after
    DDP wrapped the model) and the training after it, 2 x 4 a step as 1 x 8: the same records and weights."""
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    from finetune.recipes import load_recipe
    from finetune.stages.pretrain import run_pretrain

    corpus = write_corpus(tmp_path / "corpus")
    tokenizer = train_wordpiece(read_documents([corpus]), vocab_size=200, min_frequency=1)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    BertModel(config).save_pretrained(tmp_path / "encoder")
    tokenizer.save_pretrained(tmp_path / "encoder")

    def recipe(name: str, batch_size: int) -> Path:
        data = pretrain_recipe(corpus, tmp_path / name)
        data["model"] = {"family": "bert", "checkpoint": str(tmp_path / "encoder"), "dropout": 0.0}
        data["training"].update({"batch_size": batch_size, "log_every": 1, "max_steps": 4})
        data["head_warmup"] = {"steps": 4}
        return write_yaml(tmp_path / f"{name}.yaml", data)

    run_pretrain(load_recipe(recipe("single", 8)))
    result, _ = torchrun_tracking_writes(tmp_path, "pretrain", str(recipe("double", 4)))
    assert "head_warmup: 4 steps of the fresh masked-LM head alone" in result.stdout + result.stderr
    single, double = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("single", "double"))
    phases = [(record["phase"], record["step"]) for record in single]
    assert phases == [(record["phase"], record["step"]) for record in double]
    assert phases[:4] == [("head_warmup", step) for step in range(1, 5)]
    for one, two in zip(single, double):
        key = "validation_loss" if one["phase"] == "eval" else "loss"
        assert two[key] == pytest.approx(one[key], rel=LOSS_TOLERANCE), (one["phase"], one["step"])
    single_weights = load_file(tmp_path / "single" / "checkpoint" / "model.safetensors")
    double_weights = load_file(tmp_path / "double" / "checkpoint" / "model.safetensors")
    # Adam divides each gradient by its own size: an element whose gradient is near zero moves by its float noise
    # (seen: 1.5e-6 in one element of 8,192); 1e-5 is a hundredth of a step at lr 1e-3.
    for name, weight in single_weights.items():
        assert torch.allclose(weight, double_weights[name], rtol=LOSS_TOLERANCE, atol=1e-5), name


# LAUNCHER, printing how many pieces each split batch was cut into.
COUNTING_PIECES = LAUNCHER.replace(
    "app(sys.argv[1:]",
    textwrap.dedent("""
        length_pieces = finetune_stage.length_pieces

        def counting_pieces(lengths):
            pieces = length_pieces(lengths)
            print(f"PIECES {len(pieces)}", flush=True)
            return pieces

        finetune_stage.length_pieces = counting_pieces
    """)
    + "app(sys.argv[1:]",
)


def test_batches_split_by_length_on_two_processes_train_like_whole_ones_on_one(tmp_path):
    """Batches of 2 x 8 cut into pieces on 2 processes: the weights of whole batches of 16 on one (dropout off)."""
    from safetensors.torch import load_file

    from finetune.recipes import load_recipe
    from finetune.stages.finetune import run_finetune

    pretrained = save_tiny_masked_lm(tmp_path / "pretrained", dropout=0.0, max_positions=64)
    task = tmp_path / "task"
    task.mkdir()
    rows = ["sentence\tlabel"]
    for index in range(32):  # short and long sentences: a batch of both pads the short ones far
        positive = index % 2 == 0
        adjective = "great" if positive else "dull"
        middle = " very really quite truly so" * (8 if index % 3 == 0 else 0)
        rows.append(f"the film was{middle} {adjective} .\t{int(positive)}")
    for split in ("train", "dev"):
        (task / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")

    def finetune_data(name: str, batch_size: int, split: bool) -> Path:
        data = finetune_recipe(pretrained, task, tmp_path / name)
        data["task"]["max_length"] = 64
        data["classifier_dropout"] = 0.0
        data["training"].update(
            {
                "batch_size": batch_size,
                "group_by_length": False,
                "split_by_length": split,
                "max_grad_norm": None,
                "skip_padding": False,  # a model that computes its real tokens only keeps its batches whole
            }
        )
        return write_yaml(tmp_path / f"{name}.yaml", data)

    run_finetune(load_recipe(finetune_data("single", 16, split=False)))
    result = torchrun(
        tmp_path, "finetune", str(finetune_data("double", 8, split=True)), launcher_source=COUNTING_PIECES
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    check_two_processes(result)
    assert "PIECES 2" in result.stdout, "no batch was cut: the comparison would prove nothing"
    single, double = (load_file(tmp_path / name / "checkpoint" / "model.safetensors") for name in ("single", "double"))
    for name, weight in single.items():
        assert torch.allclose(weight, double[name], rtol=LOSS_TOLERANCE, atol=1e-6), name
