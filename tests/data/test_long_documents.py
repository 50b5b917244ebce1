"""Examples longer than task.max_length: head_tail, chunks (windows whose logits are pooled), and whole documents for
the AWD-LSTM; in training, eval, predict and ensembles alike."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from accelerate import Accelerator
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from finetune.commands.evaluate import run_eval
from finetune.commands.predict import load_predictor
from finetune.data.examples import TaskExamples
from finetune.data.long_documents import (
    WINDOW_DOCUMENT,
    DocumentReading,
    ReadingError,
    classification_loss,
    head_tail_positions,
    pool_windows,
    window_positions,
    windowed_logits,
)
from finetune.data.reverse import reverse_segments
from finetune.data.task_batches import WindowCollator
from finetune.data.task_encoding import EncodedTask
from finetune.errors import UserError
from finetune.inference.predict import example_logits
from finetune.kinds.classification.fine_tuning import gradient_window_note
from finetune.models.heads import fitted_max_length
from finetune.recipes import load_recipe
from finetune.stages.finetune import run_finetune
from tests.conftest import (
    custom_task_section,
    eval_recipe,
    finetune_recipe,
    make_sentence,
    save_tiny_masked_lm,
    write_yaml,
)

BERT_LIKE = [None] + [0] * 20 + [None]  # [CLS] 20 text tokens [SEP]


# ---------------------------------------------------------------------------------------------
# Positions: what each mode keeps
# ---------------------------------------------------------------------------------------------


def test_head_tail_keeps_the_special_tokens_the_head_and_the_tail():
    # room for 8 text tokens: the first 3 (positions 1-3) and the last 5 (positions 16-20)
    assert head_tail_positions(BERT_LIKE, 10, 3) == [0, 1, 2, 3, 16, 17, 18, 19, 20, 21]
    assert head_tail_positions(BERT_LIKE, 30, 3) == list(range(22))  # short enough: untouched


def test_head_tail_of_a_pair_reads_its_two_texts_as_one():
    pair = [None, 0, 0, None] + [1] * 10 + [None]  # [CLS] a a [SEP] b*10 [SEP]
    # room 12 - 3 specials = 9: the first 4 text positions (both of a, two of b) and the last 5 of b
    assert head_tail_positions(pair, 12, 4) == [0, 1, 2, 3, 4, 5, 9, 10, 11, 12, 13, 14]


def test_a_head_that_leaves_no_tail_is_refused_with_its_value():
    with pytest.raises(ReadingError, match=r"^head 8 .* below 8\)$") as refused:  # the stage names task.long_documents
        head_tail_positions(BERT_LIKE, 10, 8)
    assert refused.value.value == 8


def test_windows_cover_the_document_the_last_ending_at_its_end():
    windows, count = window_positions(BERT_LIKE, 10, 2, max_chunks=8)
    # room 8, a new window every 6 text tokens; the last starts at text token 12 and ends at the last one
    assert count == 3
    assert windows == [[0, *range(1, 9), 21], [0, *range(7, 15), 21], [0, *range(13, 21), 21]]
    covered = sorted({position for window in windows for position in window})
    assert covered == list(range(22))


def test_max_chunks_keeps_windows_spread_from_first_to_last():
    windows, count = window_positions([None] + [0] * 100 + [None], 10, 0, max_chunks=3)
    assert count == 13 and len(windows) == 3
    assert windows[0][1] == 1 and windows[-1][-2] == 100  # the document's first and last text tokens are read
    assert windows[1][1] == 1 + 6 * 8  # the middle window of the 13


def test_an_overlap_that_leaves_no_new_tokens_is_refused_with_its_value():
    with pytest.raises(ReadingError, match=r"^overlap 8 leaves windows no new tokens") as refused:
        window_positions(BERT_LIKE, 10, 8, max_chunks=4)
    assert refused.value.value == 8


def test_pooling_is_the_mean_or_the_max_of_each_documents_windows():
    logits = torch.tensor([[1.0, 0.0], [3.0, -2.0], [0.5, 0.5], [-1.0, 4.0]], requires_grad=True)
    documents = torch.tensor([0, 0, 1, 1])
    mean = pool_windows(logits, documents, "mean")
    assert torch.allclose(mean, torch.tensor([[2.0, -1.0], [-0.25, 2.25]]))
    assert torch.equal(pool_windows(logits, documents, "max"), torch.tensor([[3.0, 0.0], [0.5, 4.0]]))
    classification_loss(mean, torch.tensor([0, 1])).backward()  # the loss reaches every window's logits
    assert (logits.grad.abs().sum(dim=1) > 0).all()


# ---------------------------------------------------------------------------------------------
# Encoding with a real tokenizer
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny BERT (32 positions) and its WordPiece tokenizer."""
    return save_tiny_masked_lm(tmp_path_factory.mktemp("long") / "bert")


def long_review(rng: random.Random, positive: bool, sentences: int) -> str:
    return " ".join(make_sentence(rng, positive) for _ in range(sentences))


def examples_of(texts: list, labels=None) -> TaskExamples:
    return TaskExamples(
        [text if isinstance(text, tuple) else (text,) for text in texts],
        None if labels is None else np.array(labels),
        [str(i) for i in range(len(texts))],
    )


def test_head_tail_rows_are_the_whole_encodings_head_and_tail(checkpoint, capsys):
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    rng = random.Random(0)
    texts = [long_review(rng, True, 6), "the film was great ."]
    whole = tokenizer(texts)["input_ids"]
    encoded = EncodedTask(examples_of(texts), tokenizer, DocumentReading(16, "head_tail", head=5), name="dev")
    long, short = encoded.encodings["input_ids"]
    assert long == whole[0][:6] + whole[0][-10:] and len(long) == 16  # [CLS] + 5 head, 9 tail + [SEP]
    assert short == whole[1]
    note = capsys.readouterr().err
    assert "head_tail: 1 of the 2 dev examples (50%) are longer than task.max_length 16" in note
    assert f"longest {len(whole[0])}" in note


def test_chunks_make_documents_of_windows_and_keep_the_pair_template(checkpoint, capsys):
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    rng = random.Random(1)
    pairs = [("the plot was dull .", long_review(rng, False, 8)), ("great .", "the cast was superb .")]
    encoded = EncodedTask(
        examples_of(pairs, [0, 1]), tokenizer, DocumentReading(20, "chunks", overlap=4), name="training"
    )
    assert len(encoded) == 2 and len(encoded.windows[0]) > 2 and len(encoded.windows[1]) == 1
    sep = tokenizer.sep_token_id
    for row in encoded.windows[0]:
        ids = encoded.encodings["input_ids"][row]
        assert len(ids) <= 20 and ids[0] == tokenizer.cls_token_id and ids[-1] == sep
        assert ids.count(sep) == 2  # the pair's template in every window (the first text may be out of it)
        assert len(encoded.encodings["token_type_ids"][row]) == len(ids)
    item = encoded[0]
    assert item["labels"] == 0 and len(item["input_ids"]) == len(encoded.windows[0])
    batch = WindowCollator(tokenizer)([encoded[0], encoded[1]])
    windows = len(encoded.windows[0])
    assert batch[WINDOW_DOCUMENT].tolist() == [0] * windows + [1]
    assert batch["input_ids"].shape[0] == windows + 1 and batch["labels"].tolist() == [0, 1]
    assert "chunks: 1 of the 2 training examples (50%) are longer than task.max_length 20" in capsys.readouterr().err


def test_windows_read_backwards_are_each_window_reversed(checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    texts = [long_review(random.Random(2), True, 5)]
    reading = DocumentReading(14, "chunks", overlap=2)
    forward = EncodedTask(examples_of(texts), tokenizer, reading)
    backward = EncodedTask(examples_of(texts), tokenizer, reading, backwards=True)
    for ids, reversed_ids in zip(forward.encodings["input_ids"], backward.encodings["input_ids"]):
        segments = [None] + [0] * (len(ids) - 2) + [None]
        assert reversed_ids == reverse_segments(ids, segments)


def test_a_mode_other_than_truncate_needs_a_max_length(checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    with pytest.raises(UserError, match=r"mode chunks needs task.max_length"):
        EncodedTask(examples_of(["the film was great ."]), tokenizer, DocumentReading(None, "chunks"))
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2)
    # eval of a checkpoint without a saved recipe: the transformer's default length is fitted before encoding
    logits = example_logits(
        Accelerator(cpu=True),
        model,
        tokenizer,
        examples_of(["the film was great ."]),
        DocumentReading(None, "chunks"),
        4,
    )
    assert logits.shape == (1, 2)


def test_an_awd_lstm_reads_whole_documents_unless_max_length_is_set():
    from finetune.models.awd_lstm import AWDLSTMConfig
    from finetune.models.awd_lstm_classifier import AWDLSTMForSequenceClassification

    model = AWDLSTMForSequenceClassification(
        AWDLSTMConfig(vocab_size=30, embedding_size=8, hidden_size=12, num_layers=2, pad_token_id=1, num_labels=2)
    )
    assert fitted_max_length(None, model) is None and fitted_max_length(300, model) == 300
    note = gradient_window_note(model.config, [100, 2000, 300])
    assert "reads every token of the 3 training examples (median 300, longest 2,000 tokens), 70 at a time" in note
    assert "last 1,400 tokens of each (1 documents are longer" in note


def test_a_transformer_left_without_max_length_reads_128_tokens_or_its_positions(checkpoint):
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2)
    assert fitted_max_length(None, model) == 32  # the tiny BERT has 32 positions: fewer than 128


# ---------------------------------------------------------------------------------------------
# Through the stages: finetune, eval (models and ensembles) and predict agree with the windows
# ---------------------------------------------------------------------------------------------


def write_long_task(folder: Path) -> Path:
    """Reviews of 1-6 sentences whose label every sentence carries: most are longer than 24 tokens."""
    rng = random.Random(3)
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", 24), ("dev", 12)):
        rows = ["sentence\tlabel"] + [
            f"{long_review(rng, index % 2 == 0, rng.randint(1, 6))}\t{int(index % 2 == 0)}" for index in range(count)
        ]
        (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def chunks_run(checkpoint, tmp_path_factory) -> tuple[Path, Path]:
    """A classifier fine-tuned with chunks (windows of 24 tokens, max pooling) and its task folder."""
    tmp = tmp_path_factory.mktemp("chunks")
    task = write_long_task(tmp / "task")
    data = finetune_recipe(checkpoint, task, tmp / "run")
    data["task"] = {
        **custom_task_section(task, max_length=24),
        "long_documents": {"mode": "chunks", "overlap": 6, "max_chunks": 3, "pool": "max"},
    }
    data["training"].update({"epochs": 2, "batch_size": 4})
    return run_finetune(load_recipe(write_yaml(tmp / "recipe.yaml", data))), task


def manual_logits(checkpoint: Path, texts: list[str], reading: DocumentReading) -> np.ndarray:
    """Each document's windows through the model one at a time, pooled by hand."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    encoded = EncodedTask(examples_of(texts), tokenizer, reading)
    rows = []
    with torch.no_grad():
        for windows in encoded.windows:
            logits = torch.cat(
                [
                    model(
                        input_ids=torch.tensor([encoded.encodings["input_ids"][row]]),
                        token_type_ids=torch.tensor([encoded.encodings["token_type_ids"][row]]),
                    ).logits
                    for row in windows
                ]
            )
            rows.append(logits.max(dim=0).values if reading.pool == "max" else logits.mean(dim=0))
    return torch.stack(rows).numpy()


def test_finetune_with_chunks_saves_the_reading_and_eval_predict_and_ensembles_use_it(chunks_run, tmp_path, capsys):
    checkpoint, task = chunks_run
    saved = yaml.safe_load((checkpoint / "finetune_recipe.yaml").read_text(encoding="utf-8"))
    assert saved["task"]["long_documents"] == {
        "mode": "chunks",
        "head": None,
        "overlap": 6,
        "max_chunks": 3,
        "pool": "max",
    }
    dev_texts = [line.split("\t")[0] for line in (task / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    expected = manual_logits(checkpoint, dev_texts, DocumentReading(24, "chunks", overlap=6, max_chunks=3, pool="max"))

    # eval, without any reading in its recipe: the checkpoint's own
    data = eval_recipe(task, tmp_path / "eval", {"chunked": str(checkpoint)})
    copy = shutil.copytree(checkpoint, tmp_path / "copy")  # an ensemble of two equal members: the same outputs
    data["ensembles"] = {"twice": [str(checkpoint), str(copy)]}
    capsys.readouterr()
    report = run_eval(load_recipe(write_yaml(tmp_path / "eval.yaml", data)))
    said = capsys.readouterr().err
    assert said.count("task.long_documents chunks:") == 2  # each checkpoint read as trained, each once
    predictions = expected.argmax(axis=1)
    labels = np.array(
        [int(line.split("\t")[1]) for line in (task / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    )
    accuracy = float((predictions == labels).mean())
    assert json.loads((tmp_path / "eval" / "report.json").read_text(encoding="utf-8")) == report
    rows = report["results"]
    assert rows["chunked"]["accuracy"] == pytest.approx(accuracy)
    assert rows["twice"]["accuracy"] == pytest.approx(accuracy)

    # predict: the same probabilities as the windows pooled by hand
    predictor = load_predictor(str(checkpoint))
    assert predictor.reading.mode == "chunks" and predictor.reading.pool == "max"
    probabilities = np.array(
        [[result["probabilities"][label] for label in ("0", "1")] for result in predictor.predict(dev_texts)]
    )
    assert np.allclose(probabilities, torch.softmax(torch.from_numpy(expected).double(), dim=-1).numpy(), atol=1e-5)


def test_example_logits_pool_whole_documents_across_batches(chunks_run):
    checkpoint, task = chunks_run
    texts = [line.split("\t")[0] for line in (task / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    reading = DocumentReading(24, "chunks", overlap=6, max_chunks=3, pool="mean")
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    for batch_size in (1, 5):  # a document's windows always travel together
        logits = example_logits(Accelerator(cpu=True), model, tokenizer, examples_of(texts), reading, batch_size)
        assert np.allclose(logits, manual_logits(checkpoint, texts, reading), atol=1e-5)


def test_the_training_loss_is_taken_on_each_documents_pooled_logits(checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2).eval()
    rng = random.Random(4)
    encoded = EncodedTask(
        examples_of([long_review(rng, True, 5), long_review(rng, False, 2)], [1, 0]),
        tokenizer,
        DocumentReading(20, "chunks", overlap=4),
    )
    batch = WindowCollator(tokenizer)([encoded[0], encoded[1]])
    pooled = windowed_logits(model, batch, "mean")
    rows = model(**{key: value for key, value in batch.items() if key not in ("labels", WINDOW_DOCUMENT)}).logits
    first = rows[: len(encoded.windows[0])].mean(dim=0)
    assert torch.allclose(pooled[0], first, atol=1e-6) and torch.allclose(pooled[1], rows[-1], atol=1e-6)
    expected = torch.nn.functional.cross_entropy(torch.stack([first, rows[-1]]), torch.tensor([1, 0]))
    assert torch.allclose(classification_loss(pooled, batch["labels"]), expected, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# The recipe: keys, shorthand, defaults written into the saved recipe
# ---------------------------------------------------------------------------------------------


def test_the_mode_alone_is_a_section_and_keys_of_another_mode_are_refused(checkpoint, tmp_path):
    task = write_long_task(tmp_path / "task")
    data = finetune_recipe(checkpoint, task, tmp_path / "run")
    data["task"]["long_documents"] = "head_tail"
    assert load_recipe(write_yaml(tmp_path / "a.yaml", data)).task.long_documents.mode == "head_tail"
    data["task"]["long_documents"] = {"mode": "head_tail", "max_chunks": 4}
    with pytest.raises(UserError, match="max_chunks is read in mode chunks only"):
        load_recipe(write_yaml(tmp_path / "b.yaml", data))


def test_a_transformer_recipe_without_max_length_is_saved_with_128(checkpoint, tmp_path):
    task = write_long_task(tmp_path / "task")
    data = finetune_recipe(checkpoint, task, tmp_path / "run")
    del data["task"]["max_length"]
    data["training"].update({"epochs": 1, "max_steps": 1})
    saved = run_finetune(load_recipe(write_yaml(tmp_path / "recipe.yaml", data)))
    recipe = yaml.safe_load((saved / "finetune_recipe.yaml").read_text(encoding="utf-8"))
    assert recipe["task"]["max_length"] == 128  # fitted to the tiny model's 32 positions when read


def test_an_edited_saved_reading_is_a_one_line_error(chunks_run, tmp_path):
    from finetune.training.checkpoints import checkpoint_reading

    checkpoint, _ = chunks_run
    edited = shutil.copytree(checkpoint, tmp_path / "edited")
    recipe = yaml.safe_load((edited / "finetune_recipe.yaml").read_text(encoding="utf-8"))
    recipe["task"]["long_documents"]["pool"] = "median"
    (edited / "finetune_recipe.yaml").write_text(yaml.safe_dump(recipe), encoding="utf-8")
    with pytest.raises(UserError, match=r"finetune_recipe.yaml: task.long_documents: Input should be 'mean' or 'max'"):
        checkpoint_reading(edited)
    assert checkpoint_reading(checkpoint, max_length=40).max_length == 40  # what eval asks for wins
