"""`ngram_floor`: a causal pretraining run counts an n-gram model on its own tokens and reports its loss as a floor."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.run_dir import read_metrics
from tests.conftest import pretrain_recipe, write_yaml
from tests.models.test_ngram import assert_one_error_line

runner = CliRunner()


def run(tmp_path, corpus_file, name: str, model: dict, **top) -> list[dict]:
    data = pretrain_recipe(corpus_file, tmp_path / name)
    data["model"] = model
    data.update(top)
    result = runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / f"{name}.yaml", data))])
    assert result.exit_code == 0, result.output
    return read_metrics(tmp_path / name / "metrics.jsonl")


@pytest.mark.parametrize(
    "model",
    [
        {"family": "gpt2", "layers": 1, "hidden": 16, "heads": 2},
        {"family": "awd_lstm", "embedding_size": 8, "hidden": 12, "layers": 1},
    ],
    ids=["gpt2", "awd_lstm"],
)
@pytest.mark.usefixtures("plots_drawn")
def test_the_floor_is_the_ngram_familys_own_score_on_the_same_tokens(tmp_path, corpus_file, model):
    """The floor a gpt2 / awd_lstm run logs equals what `model.family: ngram` scores on the same corpus."""
    records = run(tmp_path, corpus_file, "network", model, ngram_floor=2)
    [floor] = [record for record in records if record["phase"] == "floor"]
    phases = [record["phase"] for record in records]
    assert phases.index("floor") < phases.index("train")  # counted and logged before the network trains
    [counted] = run(tmp_path, corpus_file, "counted", {"family": "ngram", "order": 2})
    assert floor["model"] == "ngram-2"
    for key in ("validation_loss", "validation_perplexity", "next_token_accuracy"):
        assert floor[key] == pytest.approx(counted[key], rel=1e-6), key
    card = (tmp_path / "network" / "checkpoint" / "README.md").read_text()
    assert (
        f"ngram-2 Kneser-Ney model counted on the same training tokens scores validation loss "
        f"{floor['validation_loss']:.4f}" in card
    )
    assert (tmp_path / "network" / "plots" / "loss.png").is_file()


def test_without_the_key_there_is_no_floor(tmp_path, corpus_file):
    records = run(tmp_path, corpus_file, "plain", {"family": "gpt2", "layers": 1, "hidden": 16, "heads": 2})
    assert not [record for record in records if record["phase"] == "floor"]
    assert "Floor:" not in (tmp_path / "plain" / "checkpoint" / "README.md").read_text()


@pytest.mark.parametrize(
    "model, named",
    [
        ({"family": "bert", "layers": 1, "hidden": 16, "heads": 2}, ("ngram_floor", "causal families", "not bert")),
        ({"family": "ngram"}, ("ngram_floor", "not ngram")),
    ],
)
def test_a_floor_outside_the_causal_families_is_one_line_exit_2(tmp_path, corpus_file, model, named):
    data = pretrain_recipe(corpus_file, tmp_path / "run")
    data["model"] = model
    data["ngram_floor"] = 3
    result = runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "recipe.yaml", data))])
    assert_one_error_line(result, named)
    assert not (tmp_path / "run").exists()
