"""Backward language models and the bidirectional ensemble (ULMFiT section 3.3).

A backward LM trains on each document's ids reversed (`corpus.reverse: true`), its checkpoint says so in config.json,
every later stage reads text backwards for it, and `finetune eval` averages a forward and a backward classifier's
class probabilities. The ids are checked against the tokenizer's own, reversed here, not against the code's view.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertConfig, BertForSequenceClassification
from typer.testing import CliRunner

import finetune
import finetune.models.awd_lstm_classifier
from finetune.cli import app
from finetune.data.causal import BPTTBatches
from finetune.data.corpus import read_documents
from finetune.data.reverse import REVERSE_CONFIG_KEY, read_backwards
from finetune.data.streaming import StreamedBatches
from finetune.data.task_encoding import EncodedTask
from finetune.data.task_files import read_task_split
from finetune.data.token_arrays import DocumentStream, TokenizedDocuments, pack_blocks
from finetune.data.token_cache import encode, tokenize_files
from finetune.data.tokenizers import train_wordpiece
from finetune.glue.specs import GLUE_TASKS
from finetune.inference.ensemble import ensemble_outputs
from finetune.inference.predict import example_logits
from finetune.kinds.classification import fine_tuning as finetune_stage
from finetune.models.heads import label_config
from finetune.models.language_models import train_tokenizer
from finetune.recipes import TokenizerConfig, read_yaml, task_config
from finetune.stages import pretrain_data
from finetune.tasks.specs import task_spec
from finetune.training.checkpoints import HYPERPARAMETERS_FILE, save_checkpoint
from tests.conftest import custom_task_section, eval_recipe, pretrain_recipe, write_corpus, write_task, write_yaml
from tests.data.test_glue_data import write_glue_root
from tests.stages.test_ulmfit_flow import ulmfit_recipe

runner = CliRunner()
GPT2 = {"family": "gpt2", "layers": 1, "hidden": 16, "heads": 2, "intermediate": 32, "dropout": 0.0}


def assert_one_line_error(result, *fragments: str) -> None:
    """Exit code 2 and a single `error:` line naming every fragment, no traceback."""
    output = result.output.strip()
    assert result.exit_code == 2, result.output[-2000:]
    assert output.startswith("error: ") and "\n" not in output and "Traceback" not in output, output
    for fragment in fragments:
        assert fragment in output, f"{fragment!r} not in {output!r}"


@pytest.fixture(scope="module")
def byte_level_bpe(tmp_path_factory):
    documents = read_documents([write_corpus(tmp_path_factory.mktemp("bpe") / "corpus")])
    return train_tokenizer("gpt2", documents, TokenizerConfig(vocab_size=200, min_frequency=1, lowercase=False))


# ---------------------------------------------------------------------------------------------
# Pretraining text: each document reversed, the separator after it
# ---------------------------------------------------------------------------------------------


def test_documents_read_backwards_are_reversed_one_by_one_with_the_separator_kept():
    documents = TokenizedDocuments.from_lists([[1, 2, 3], [4, 5], [6]])
    backwards = read_backwards(documents)
    assert DocumentStream(backwards, 0).array().tolist() == [3, 2, 1, 0, 5, 4, 0, 6, 0]
    assert DocumentStream(documents, 0).array().tolist() == [1, 2, 3, 0, 4, 5, 0, 6, 0]  # the stored ids unchanged
    assert backwards.ids.tolist() == [1, 2, 3, 4, 5, 6]
    # A selection (the held-out split, an epoch's shuffle) keeps the direction.
    selected = backwards.select(np.array([2, 0]))
    assert DocumentStream(selected, 9).array().tolist() == [6, 9, 3, 2, 1, 9]
    assert selected.document(1).tolist() == [3, 2, 1]
    assert TokenizedDocuments.concatenate([selected]).ids.tolist() == [6, 3, 2, 1]
    # Packed blocks (bert, gpt2) and BPTT rows (awd_lstm) are cut from that stream.
    assert pack_blocks(backwards, 4, 0).tolist() == [[3, 2, 1, 0], [5, 4, 0, 6]]
    rows = BPTTBatches(backwards, 0, batch_size=1, bptt=3, seed=7, shuffle=True)
    order = np.random.default_rng((7, 0)).permutation(3)
    lists = [[1, 2, 3], [4, 5], [6]]
    assert rows.rows().tolist() == [[token for index in order for token in (*lists[index][::-1], 0)]]


def test_a_cached_corpus_is_stored_forwards_and_read_backwards(tmp_path, corpus_file, byte_level_bpe):
    """The cache has one entry for both directions: a backward run reads its forward ids reversed."""
    tokenize_files(byte_level_bpe, [corpus_file], tmp_path / "cache", show_progress=False)
    cached = tokenize_files(byte_level_bpe, [corpus_file], tmp_path / "cache", show_progress=False)  # a hit
    assert isinstance(cached.ids, np.memmap)
    forward = encode(byte_level_bpe, read_documents([corpus_file]))
    backwards = read_backwards(cached)
    assert [backwards.document(index).tolist() for index in range(len(forward))] == [ids[::-1] for ids in forward]
    assert [cached.document(index).tolist() for index in range(len(forward))] == forward


def test_a_streamed_corpus_is_read_backwards_too(byte_level_bpe, corpus_file):
    documents = read_documents([corpus_file])
    separator = byte_level_bpe.eos_token_id
    batches = StreamedBatches(
        lambda: iter(documents),
        byte_level_bpe,
        separator,
        block_size=8,
        batch_size=2,
        batches=2,
        seed=0,
        backwards=True,
    )
    first = next(iter(batches))
    stream = [token for ids in encode(byte_level_bpe, documents) for token in (*ids[::-1], separator)]
    assert first["input_ids"].tolist() == [stream[0:8], stream[9:17]]
    assert first["labels"].tolist() == [stream[1:9], stream[10:18]]


def test_a_backward_pretraining_run_and_its_checkpoint(tmp_path, corpus_file, monkeypatch):
    lines = read_documents([corpus_file])
    (tmp_path / "valid.txt").write_text("\n".join(lines[:20]) + "\n", encoding="utf-8")
    data = pretrain_recipe(corpus_file, tmp_path / "backward")
    data["model"] = dict(GPT2)
    data["corpus"].update(validation_files=[str(tmp_path / "valid.txt")], reverse=True, cache_dir=str(tmp_path))
    data["training"].update(max_steps=3)
    trained = {}
    original = pretrain_data.language_model_data

    def remember(*arguments, **keywords):
        trained["train"], trained["validation"] = original(*arguments, **keywords)
        return trained["train"], trained["validation"]

    monkeypatch.setattr(pretrain_data, "language_model_data", remember)
    result = runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "backward.yaml", data))])
    assert result.exit_code == 0, result.output
    checkpoint = tmp_path / "backward" / "checkpoint"
    assert json.loads((checkpoint / "config.json").read_text())[REVERSE_CONFIG_KEY] is True
    # The blocks trained on: every line's ids (the checkpoint's tokenizer) reversed, <|endoftext|> after each.
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    stream = [token for line in lines for token in (*tokenizer(line)["input_ids"][::-1], tokenizer.eos_token_id)]
    blocks = trained["train"].blocks.array()  # 17 tokens: 16 inputs and the last label
    assert blocks[:3].tolist() == [stream[index * 17 : (index + 1) * 17] for index in range(3)]

    # Continuing it: null follows the checkpoint (below: the ULMFiT flow); the other direction is refused.
    data["model"] = {"family": "gpt2", "checkpoint": str(checkpoint)}
    data["run_dir"] = str(tmp_path / "forward")
    result = runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "forward.yaml", data)), "corpus.reverse=false"])
    assert_one_line_error(result, "corpus.reverse", "reads text backwards")
    assert not (tmp_path / "forward").exists()


def test_a_masked_lm_is_never_backward(tmp_path, corpus_file):
    data = pretrain_recipe(corpus_file, tmp_path / "run")
    result = runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "recipe.yaml", data)), "corpus.reverse=true"])
    assert_one_line_error(result, "corpus.reverse", "bert")


# ---------------------------------------------------------------------------------------------
# Task text: each text segment reversed, the special tokens where they were
# ---------------------------------------------------------------------------------------------


def test_pairs_are_reversed_segment_by_segment(tmp_path):
    tokenizer = train_wordpiece(read_documents([write_corpus(tmp_path / "corpus")]), vocab_size=120, min_frequency=1)
    examples = read_task_split(GLUE_TASKS["stsb"], write_glue_root(tmp_path / "glue") / "STS-B", "dev")
    forward = EncodedTask(examples, tokenizer, 12)
    backward = EncodedTask(examples, tokenizer, 12, backwards=True)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    for index, (first, _second) in enumerate(examples.texts):
        ids = forward.encodings["input_ids"][index]
        # Truncation cuts the forward pair first, so both directions read the same tokens.
        boundary = ids.index(sep)
        a, b = ids[1:boundary], ids[boundary + 1 : -1]
        assert tokenizer(first, add_special_tokens=False)["input_ids"][: len(a)] == a
        assert backward.encodings["input_ids"][index] == [cls, *a[::-1], sep, *b[::-1], sep]
        assert backward.encodings["token_type_ids"][index] == forward.encodings["token_type_ids"][index]
        assert a[::-1] != a  # a reversal that changes something, or the test proves nothing


# ---------------------------------------------------------------------------------------------
# ULMFiT's flow with a backward LM, and the ensemble of a forward and a backward classifier
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def backward_flow(tmp_path_factory) -> dict:
    """The tiny ULMFiT flow with `general_lm.corpus.reverse: true`; what stage 2 trained on and the ids the
    classifier was fed are recorded."""
    folder = tmp_path_factory.mktemp("backward-flow")
    task = write_task(folder / "task")
    data = ulmfit_recipe(write_corpus(folder / "corpus"), task, folder / "flow")
    data["general_lm"]["corpus"]["reverse"] = True
    language_model_data, fed = [], []
    original_data, original_classifier = pretrain_data.language_model_data, finetune_stage.load_classifier

    def remember_data(*arguments, **keywords):
        language_model_data.append(original_data(*arguments, **keywords))
        return language_model_data[-1]

    def classifier_that_records_its_input(*arguments, **keywords):
        model = original_classifier(*arguments, **keywords)
        model.register_forward_pre_hook(
            lambda module, args, kwargs: fed.append((kwargs["input_ids"].clone(), kwargs["attention_mask"].clone())),
            with_kwargs=True,
        )
        return model

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pretrain_data, "language_model_data", remember_data)
        patch.setattr(finetune_stage, "load_classifier", classifier_that_records_its_input)
        result = runner.invoke(app, ["ulmfit", str(write_yaml(folder / "flow.yaml", data))])
    assert result.exit_code == 0, result.output
    return {
        "run": folder / "flow",
        "task": task,
        "folder": folder,
        "target_lm_data": language_model_data[1],
        "fed": fed,
    }


def texts_of(task: Path, *splits: str) -> list[str]:
    return [
        texts[0]
        for split in splits
        for texts in read_task_split(task_spec(task_config(**custom_task_section(task))), task, split).texts
    ]


def test_every_stage_of_a_backward_flow_reads_backwards(backward_flow):
    run = backward_flow["run"]
    for stage in ("1-general-lm", "2-target-lm", "3-classifier"):
        assert json.loads((run / stage / "checkpoint" / "config.json").read_text())[REVERSE_CONFIG_KEY] is True
    assert read_yaml(run / "2-target-lm" / "recipe.yaml")["corpus"]["reverse"] is None  # followed stage 1
    # Stage 2 trained on the task's text (its own, new vocabulary), each text reversed.
    tokenizer = AutoTokenizer.from_pretrained(run / "2-target-lm" / "checkpoint")
    reversed_texts = {
        tuple(tokenizer(text)["input_ids"][::-1]) for text in texts_of(backward_flow["task"], "train", "test")
    }
    read, document = set(), []
    for token in backward_flow["target_lm_data"][0].stream().array().tolist():  # the epoch's documents, separated
        if token == tokenizer.eos_token_id:
            read.add(tuple(document))
            document = []
        else:
            document.append(token)
    assert len(read) > 10 and read <= reversed_texts  # the validation texts were held out


def test_the_backward_classifier_is_fed_reversed_text(backward_flow):
    checkpoint = backward_flow["run"] / "3-classifier" / "checkpoint"
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    texts = texts_of(backward_flow["task"], "train", "dev")
    # Cut to task.max_length (16) before reversing: the longer sentences lose their end, not their start.
    forward = {tuple(tokenizer(text, truncation=True, max_length=16)["input_ids"]) for text in texts}
    assert any(len(ids) == 16 for ids in forward) and any(len(ids) < 16 for ids in forward)
    backward = {ids[::-1] for ids in forward}
    fed = {
        tuple(ids[mask.bool()].tolist())
        for input_ids, masks in backward_flow["fed"]
        for ids, mask in zip(input_ids, masks)
    }
    assert fed == backward and not fed & forward


@pytest.fixture(scope="module")
def bidirectional(backward_flow) -> dict:
    """The flow's backward classifier, and a forward one: the same weights without the key (reading forwards)."""
    backward = backward_flow["run"] / "3-classifier" / "checkpoint"
    forward = backward_flow["folder"] / "forward-classifier"
    shutil.copytree(backward, forward)
    config = json.loads((forward / "config.json").read_text())
    del config[REVERSE_CONFIG_KEY]
    (forward / "config.json").write_text(json.dumps(config))
    return {"forward": forward, "backward": backward, "task": backward_flow["task"]}


def member_probabilities(checkpoint: Path, texts: list[str], backwards: bool) -> np.ndarray:
    """A classifier's class probabilities, one text at a time (no padding), reversed here by hand."""
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    rows = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, truncation=True, max_length=16)["input_ids"]
            logits = model(input_ids=torch.tensor([ids[::-1] if backwards else ids])).logits
            rows.append(torch.softmax(logits.double(), dim=-1)[0].numpy())
    return np.stack(rows)


def test_eval_reads_a_backward_classifier_backwards_and_averages_the_probabilities(bidirectional, tmp_path):
    texts = texts_of(bidirectional["task"], "dev")
    forward = member_probabilities(bidirectional["forward"], texts, backwards=False)
    backward = member_probabilities(bidirectional["backward"], texts, backwards=True)
    assert not np.allclose(forward, backward, atol=1e-4)  # the two readings differ, so the checks below can fail
    spec = task_spec(task_config(**custom_task_section(bidirectional["task"])))
    examples = read_task_split(spec, bidirectional["task"], "dev")

    def logits_of(checkpoint: Path) -> np.ndarray:  # what eval computes (batched, padded)
        model = AutoModelForSequenceClassification.from_pretrained(checkpoint)
        return example_logits(Accelerator(cpu=True), model, AutoTokenizer.from_pretrained(checkpoint), examples, 16, 8)

    member_logits = [logits_of(bidirectional["forward"]), logits_of(bidirectional["backward"])]
    np.testing.assert_allclose(torch.softmax(torch.from_numpy(member_logits[1]), -1).numpy(), backward, atol=1e-5)
    predicted = finetune.predict(str(bidirectional["backward"]), texts)  # `finetune predict` reads backwards too
    np.testing.assert_allclose(
        [[row["probabilities"][label] for label in spec.labels] for row in predicted], backward, atol=1e-5
    )
    averaged = (forward + backward) / 2
    np.testing.assert_allclose(ensemble_outputs(spec, member_logits), averaged, atol=1e-5)

    data = eval_recipe(bidirectional["task"], tmp_path / "eval", {"backward": str(bidirectional["backward"])})
    data.update(
        ensembles={"bidirectional": [str(bidirectional["forward"]), str(bidirectional["backward"])]},
        write_predictions=True,
    )
    result = runner.invoke(app, ["eval", str(write_yaml(tmp_path / "eval.yaml", data))])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    labels = examples.labels

    def accuracy(probabilities: np.ndarray) -> float:
        return float((probabilities.argmax(axis=1) == labels).mean())

    ensemble = report["results"]["bidirectional"]
    assert ensemble["accuracy"] == pytest.approx(accuracy(averaged))
    assert [member["accuracy"] for member in ensemble["members"]] == pytest.approx(
        [accuracy(forward), accuracy(backward)]
    )
    assert report["results"]["backward"]["accuracy"] == pytest.approx(accuracy(backward))
    written = (tmp_path / "eval" / "predictions" / "bidirectional.tsv").read_text().splitlines()[1:]
    assert [line.split("\t")[1] for line in written] == [spec.labels[index] for index in averaged.argmax(axis=1)]
    table = (tmp_path / "eval" / "report.md").read_text()
    assert f"| bidirectional: {bidirectional['forward']} |" in table and "| bidirectional (ensemble of 2) |" in table


def test_probabilities_are_averaged_not_logits():
    """Three members of two classes, where the mean logit and the mean probability disagree."""
    spec = GLUE_TASKS["sst2"]
    members = [np.array([[0.0, 10.0]]), np.array([[3.0, 0.0]]), np.array([[3.0, 0.0]])]
    outputs = ensemble_outputs(spec, members)
    expected = np.mean(
        [torch.softmax(torch.tensor(member, dtype=torch.float64), -1).numpy() for member in members], axis=0
    )
    np.testing.assert_allclose(outputs, expected, rtol=1e-6)
    assert outputs.argmax() == 0 and np.mean(members, axis=0).argmax() == 1
    scores = [np.array([[1.0], [4.5]]), np.array([[2.0], [0.5]])]
    np.testing.assert_allclose(ensemble_outputs(GLUE_TASKS["stsb"], scores), [[1.5], [2.5]])


def test_bad_ensembles_are_one_line(bidirectional, tmp_path):
    forward, backward = str(bidirectional["forward"]), str(bidirectional["backward"])
    other_task = tmp_path / "other-task"
    shutil.copytree(bidirectional["forward"], other_task)
    saved = read_yaml(other_task / HYPERPARAMETERS_FILE)
    saved["task"]["name"] = "another-task"
    write_yaml(other_task / HYPERPARAMETERS_FILE, saved)
    three_labels = tmp_path / "three-labels"
    three_labels_classifier(three_labels)
    cases = {
        "ensembles.both": {"both": [forward, str(other_task)]},  # the members' saved recipes name other tasks
        f"{three_labels}": {"both": [forward, str(three_labels)]},  # predicts labels the task does not have
    }
    for named, ensembles in cases.items():
        data = eval_recipe(bidirectional["task"], tmp_path / "eval", {"backward": backward})
        data["ensembles"] = ensembles
        result = runner.invoke(app, ["eval", str(write_yaml(tmp_path / "eval.yaml", data))])
        assert_one_line_error(result, "ensembles.both", named)
        assert not (tmp_path / "eval").exists()
    recipe = write_yaml(
        tmp_path / "eval.yaml", eval_recipe(bidirectional["task"], tmp_path / "eval", {"both": backward})
    )
    for overrides, named in (
        ([f"ensembles={{both: [{forward}]}}"], ("ensembles.both", "at least two")),
        ([f"ensembles={{both: [{forward}, {forward}]}}"], ("ensembles.both", "listed twice")),
        ([f"ensembles={{both: [{forward}, {backward}]}}"], ("ensembles.both", "models has a row")),
        (["models=null", "ensembles=null"], ("models", "ensembles")),
    ):
        assert_one_line_error(runner.invoke(app, ["eval", str(recipe), *overrides]), *named)


def three_labels_classifier(folder: Path) -> None:
    """A tiny BERT classifier of three labels, saved with its tokenizer."""
    tokenizer = train_wordpiece(
        read_documents([write_corpus(folder.parent / "corpus")]), vocab_size=120, min_frequency=1
    )
    spec = task_spec(
        task_config(
            name="three",
            data_dir=str(folder.parent),
            text_columns=["sentence"],
            label_column="label",
            labels=["a", "b", "c"],
        )
    )
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        intermediate_size=8,
        max_position_embeddings=64,
        **label_config(spec),
    )
    save_checkpoint(BertForSequenceClassification(config), tokenizer, folder)


# ---------------------------------------------------------------------------------------------
# GLUE: an ensemble is the task's score and its submission
# ---------------------------------------------------------------------------------------------


def constant_classifier(tokenizer, spec, bias: list[float], folder: Path) -> str:
    """A tiny BERT classifier whose outputs are `bias` for every input."""
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        intermediate_size=8,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        **label_config(spec),
    )
    model = BertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor(bias))
    return str(save_checkpoint(model, tokenizer, folder))


def test_a_glue_ensemble_is_scored_and_submitted(tmp_path):
    tokenizer = train_wordpiece(read_documents([write_corpus(tmp_path / "corpus")]), vocab_size=120, min_frequency=1)
    members = {"sst2": [[1.0, 0.0], [0.0, 3.0]], "stsb": [[2.0], [4.5]]}
    checkpoints = {
        name: [
            constant_classifier(tokenizer, GLUE_TASKS[name], bias, tmp_path / f"{name}-{index}")
            for index, bias in enumerate(biases)
        ]
        for name, biases in members.items()
    }
    data = {
        "stage": "eval",
        "run_dir": str(tmp_path / "run"),
        "glue_dir": str(write_glue_root(tmp_path / "glue")),
        "tasks": {name: {"ensemble": paths} for name, paths in checkpoints.items()},
        "batch_size": 4,
        "device": "cpu",
        "max_length": 16,
        "submission": True,
        "allow_incomplete": True,
    }
    result = runner.invoke(app, ["eval", str(write_yaml(tmp_path / "eval.yaml", data))])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    stsb = report["tasks"]["stsb"]
    assert [member["checkpoint"] for member in stsb["members"]] == checkpoints["stsb"]
    assert stsb["runs"] == [{"ensemble": checkpoints["stsb"], "pearson": 0.0, "spearman": 0.0}]
    with zipfile.ZipFile(tmp_path / "run" / "submission.zip") as archive:
        scores = archive.read("STS-B.tsv").decode().splitlines()[1:]
        classes = archive.read("SST-2.tsv").decode().splitlines()[1:]
    assert {line.split("\t")[1] for line in scores} == {"3.250"}  # the mean of 2.0 and 4.5
    # p(1) = (sigmoid(-1) + sigmoid(3)) / 2 = (0.269 + 0.953) / 2 > 0.5: class 1, which the first member never says
    assert {line.split("\t")[1] for line in classes} == {"1"}
    files = report["submission"]["files"]
    assert files["SST-2.tsv"]["checkpoint"] == "ensemble of " + " + ".join(checkpoints["sst2"])
    assert "## Ensembles" in (tmp_path / "run" / "report.md").read_text()

    data["tasks"]["sst2"] = {"checkpoints": checkpoints["sst2"][:1], "ensemble": checkpoints["sst2"]}
    result = runner.invoke(app, ["eval", str(write_yaml(tmp_path / "eval.yaml", data))])
    assert_one_line_error(result, "tasks.sst2", "not both")
