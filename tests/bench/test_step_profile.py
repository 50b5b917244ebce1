"""bench/step_profile.py on a tiny model: our pretraining stage, run by the package's driver, profiled over the
steps after its warm-up, its self time placed in categories that add up to the step."""

from __future__ import annotations

import sys

import pytest

from finetune.recipes import load_recipe
from finetune.stages.pretrain import Pretraining
from tests.conftest import REPO_ROOT, write_corpus

sys.path.insert(0, str(REPO_ROOT / "bench"))

import step_profile  # bench/ scripts are top-level modules
from _op_categories import CATEGORIES, DROPOUT, EMBEDDING_BACKWARD, LAYER_NORM, OPTIMIZER, PRODUCTS, RECURRENCE
from _products import masked_lm_products

WARMUP, STEPS = 1, 2


def tiny_recipe(tmp_path, recipe: str, family_overrides: list[str], lines: int = 120):
    corpus = write_corpus(tmp_path / "corpus", lines=lines)
    validation = write_corpus(tmp_path / "validation", lines=20)
    return load_recipe(
        REPO_ROOT / "recipes" / recipe,
        [
            f"run_dir={tmp_path / 'run'}",
            f"corpus.train_files=[{corpus}]",
            f"corpus.validation_files=[{validation}]",
            "tokenizer.vocab_size=200",
            "corpus.block_size=16",
            "training.batch_size=4",
            f"training.max_steps={WARMUP + STEPS + 1}",
            f"training.log_every={WARMUP + STEPS + 1}",
            *family_overrides,
        ],
    )


def test_a_tiny_masked_lm_step_is_profiled_into_categories(tmp_path):
    recipe = tiny_recipe(
        tmp_path,
        "quickstart/pretrain.yaml",
        ["model.layers=1", "model.hidden=16", "model.heads=2", "model.dropout=0.1"],
    )
    products = lambda rows: masked_lm_products(1, 16, 2, 16, 4, 200, round(rows))
    workload = step_profile.Workload("tiny BERT", "tokens", Pretraining, (recipe,), products)
    record = step_profile.profile_workload(workload, WARMUP, STEPS, top=5)

    categories = record["categories_ms"]
    assert list(categories) == list(CATEGORIES)
    for category in (PRODUCTS, LAYER_NORM, DROPOUT, EMBEDDING_BACKWARD, OPTIMIZER):
        assert categories[category] > 0, category
    assert categories[RECURRENCE] == 0
    # The categories and the time between ops make up the profiled step.
    assert sum(categories.values()) + record["between_ops_ms"] == pytest.approx(record["step_ms"], abs=0.2)
    assert record["steps_profiled"] == STEPS and record["unprofiled_step_ms"] is None  # warm-up 1: its first only
    assert 0 < record["loss_terms_per_step"] < 4 * 16  # the masked tokens of a step of 4 blocks of 16
    assert record["products_floor_ms"] > 0
    assert record["outside_products_ms"] == pytest.approx(record["step_ms"] - record["products_floor_ms"], abs=0.2)
    assert len(record["top_ops"]) == 5
    assert (tmp_path / "run" / "checkpoint" / "config.json").is_file()  # the stage ran to its end as usual

    table = step_profile.markdown("tiny", "tiny BERT", record)
    assert "| matrix products |" in table and "outside the products" in table


def test_the_awd_lstms_dropouts_and_recurrence_are_found(tmp_path):
    recipe = tiny_recipe(
        tmp_path,
        "pretrain/awd-lstm-wikitext2.yaml",
        [
            "model.embedding_size=8",
            "model.hidden=16",
            "model.layers=2",
            "training.batch_size=2",
            "ngram_floor=null",
            "checkpoint_every=null",
        ],
    )
    workload = step_profile.Workload("tiny AWD-LSTM", "tokens", Pretraining, (recipe,))
    record = step_profile.profile_workload(workload, WARMUP, STEPS, top=5)
    assert record["categories_ms"][RECURRENCE] > 0
    assert record["categories_ms"][DROPOUT] > 0  # RNNDropout's mask multiplied in by hand, labelled while profiled
    assert "products_floor_ms" not in record  # no floor for the LSTM


def test_a_profile_that_would_hold_an_epochs_end_stops_the_benchmark(tmp_path):
    # 20 short lines give fewer batches than the 4 steps: the end-of-epoch evaluation would fall inside the profile.
    recipe = tiny_recipe(tmp_path, "quickstart/pretrain.yaml", ["model.layers=1", "model.hidden=16"], lines=20)
    workload = step_profile.Workload("tiny BERT", "tokens", Pretraining, (recipe,))
    with pytest.raises(SystemExit, match="an epoch ended inside the profile"):
        step_profile.profile_workload(workload, WARMUP, STEPS)
