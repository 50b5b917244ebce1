"""Continued pretraining (`finetune pretrain` with model.checkpoint) of every encoder and decoder family transformers
gives a language-model head, on tiny offline checkpoints (tests/tiny_families.py): runs, reloads, routes, refusals,
resume, streaming, generate and score."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer, ElectraForPreTraining
from typer.testing import CliRunner

from finetune.cli import app
from finetune.data.masking import MaskingRule
from finetune.errors import UserError, recipe_key
from finetune.models.auto_lm import MASKED_LM_HEADS, AutoMaskedLM, AutoNextTokenLM, usable_positions
from finetune.models.backbones import layer_groups
from finetune.models.families import AUTO_CAUSAL_LM, AUTO_MASKED_LM, BERT, GPT2, family_of
from finetune.recipes import load_recipe
from finetune.recipes.language_models import MODEL_SECTIONS
from finetune.recipes.pretrain import MaskingConfig
from finetune.stages import pretrain as pretrain_stage
from finetune.stages.pretrain import run_pretrain
from finetune.tasks.specs import IGNORE_INDEX
from tests.conftest import interrupted_at_step, one_error_line, pretrain_recipe, write_corpus, write_yaml
from tests.stages.test_pretrain_families import comparable_metrics
from tests.tiny_families import (
    CAUSAL_FAMILIES,
    LAYERS,
    MASKED_FAMILIES,
    save_tiny_checkpoint,
    tiny_config,
    tiny_text,
    tiny_tokenizer,
)

runner = CliRunner()


def objective(model_type: str) -> str:
    """The recipe's model.family that continues a checkpoint of `model_type`."""
    return "gpt2" if model_type in CAUSAL_FAMILIES else "bert"


def auto_class(model_type: str):
    return AutoModelForCausalLM if model_type in CAUSAL_FAMILIES else AutoModelForMaskedLM


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A folder for this module's checkpoints and runs, with the generated corpus in corpus/train.txt."""
    folder = tmp_path_factory.mktemp("continued")
    write_corpus(folder / "corpus")
    return folder


@pytest.fixture(scope="module")
def checkpoint(workspace):
    """model_type -> a tiny checkpoint of that family (saved once)."""

    def saved(model_type: str) -> Path:
        folder = workspace / "checkpoints" / model_type
        return folder if folder.is_dir() else save_tiny_checkpoint(folder, model_type)

    return saved


def continued_recipe(workspace: Path, model_type: str, checkpoint: Path, run: str, **model) -> dict:
    """Two steps of continued pretraining of `checkpoint` on the generated corpus, blocks of 16."""
    data = pretrain_recipe(workspace / "corpus" / "train.txt", workspace / "runs" / run)
    data["model"] = {"family": objective(model_type), "checkpoint": str(checkpoint), **model}
    data["training"].update(max_steps=2)
    return data


@pytest.fixture(autouse=True)
def no_plots(monkeypatch):
    """The runs' PNG plots (a second each) are tests/reporting/test_plots.py's: not drawn here."""
    monkeypatch.setattr("finetune.reporting.finish.write_plots_or_warn", lambda run_dir: [])


@pytest.fixture(scope="module")
def continued(workspace, checkpoint):
    """model_type -> (run folder, the trained model as the run saved it): two steps through the CLI, run once."""
    runs: dict[str, tuple[Path, torch.nn.Module]] = {}

    def run(model_type: str) -> tuple[Path, torch.nn.Module]:
        if model_type not in runs:
            data = continued_recipe(workspace, model_type, checkpoint(model_type), model_type, dropout=0.1)
            saved = []
            original = pretrain_stage.save_language_model

            def keep(accelerator, language_model, *arguments):
                saved.append(language_model)
                return original(accelerator, language_model, *arguments)

            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(pretrain_stage, "save_language_model", keep)
                patch.setattr("finetune.reporting.finish.write_plots_or_warn", lambda run_dir: [])
                result = runner.invoke(app, ["pretrain", str(write_yaml(workspace / f"{model_type}.yaml", data))])
            assert result.exit_code == 0, result.output
            runs[model_type] = (workspace / "runs" / model_type, saved[0].eval())
        return runs[model_type]

    return run


@pytest.mark.parametrize("model_type", MASKED_FAMILIES + CAUSAL_FAMILIES)
def test_two_steps_continue_and_the_checkpoint_reloads_with_the_auto_class(model_type, continued, checkpoint):
    run, trained = continued(model_type)
    saved = run / "checkpoint"
    reloaded = auto_class(model_type).from_pretrained(saved).eval()
    tokenizer = AutoTokenizer.from_pretrained(saved)
    masked = model_type not in CAUSAL_FAMILIES
    ids = tokenizer(["the film was really great ."], return_tensors="pt", add_special_tokens=masked)["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, trained(input_ids=ids).logits)
    # It trained from the checkpoint's weights (not a fresh model) and kept its tokenizer.
    before = auto_class(model_type).from_pretrained(checkpoint(model_type)).state_dict()
    after = reloaded.state_dict()
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[name], after[name]) for name in before)
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(checkpoint(model_type)).get_vocab()
    evaluation = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert evaluation["phase"] == "eval" and evaluation["validation_loss"] > 0
    card = (saved / "README.md").read_text()
    assert f"A {model_type} language model further trained from" in card


def test_every_family_has_layer_groups_embeddings_blocks_head(checkpoint):
    """Discriminative LRs step down these groups: the embeddings, each block (ALBERT's one shared set), the head."""
    for model_type in MASKED_FAMILIES + CAUSAL_FAMILIES:
        model = auto_class(model_type).from_pretrained(checkpoint(model_type))
        groups = layer_groups(model)  # every parameter exactly once, or it raises
        embedding = model.get_input_embeddings().weight
        assert any(parameter is embedding for parameter in groups[0]), model_type
        assert len(groups) == (3 if model_type == "albert" else 2 + LAYERS) and all(groups), model_type


def masked_batch(vocabulary: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, labels): 2 x 16 ids past the special tokens, about 30% labelled."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, vocabulary, (2, 16), generator=generator)
    chosen = torch.rand(ids.shape, generator=generator) < 0.3
    return ids, torch.where(chosen, ids, IGNORE_INDEX)


@pytest.mark.parametrize("model_type", [name for name in MASKED_FAMILIES if name != "bert"])
def test_the_sparse_masked_loss_equals_the_loss_of_the_full_logits(model_type, checkpoint):
    model = AutoModelForMaskedLM.from_pretrained(checkpoint(model_type)).eval()
    wrapped = AutoMaskedLM(model).eval()
    assert model_type in MASKED_LM_HEADS and wrapped.head is not None  # the masked rows alone are decoded
    ids, labels = masked_batch(model.config.vocab_size)
    with torch.no_grad():
        loss, count, correct = wrapped(ids, labels)
        logits = model(input_ids=ids).logits
    selected = labels != IGNORE_INDEX
    torch.testing.assert_close(loss, F.cross_entropy(logits[selected], labels[selected]))
    assert count == selected.sum() and correct == (logits[selected].argmax(-1) == labels[selected]).sum()
    wrapped.head = None  # a family missing from the table: every position decoded, the masked ones picked
    with torch.no_grad():
        torch.testing.assert_close(wrapped(ids, labels)[0], loss)


@pytest.mark.parametrize("model_type", [name for name in CAUSAL_FAMILIES if name != "gpt2"])
def test_the_fused_next_token_loss_equals_the_loss_of_the_full_logits(model_type, checkpoint):
    model = AutoModelForCausalLM.from_pretrained(checkpoint(model_type)).eval()
    wrapped = AutoNextTokenLM(model).eval()
    assert wrapped.split_output  # the base model's last hidden state into the fused decoder and loss
    ids, _ = masked_batch(model.config.vocab_size)
    inputs, labels = ids[:, :-1], ids[:, 1:]
    with torch.no_grad():
        loss, count, correct = wrapped(inputs, labels)
        logits = model(input_ids=inputs).logits
    torch.testing.assert_close(loss, F.cross_entropy(logits.flatten(0, 1), labels.flatten()))
    assert count == labels.numel() and correct == (logits.argmax(-1) == labels).sum()


def test_a_soft_capped_decoder_goes_through_its_own_logits():
    """Gemma 2 caps its logits (tanh): the product of the output embeddings is not its logits, so it is not fused."""
    tokenizer = tiny_tokenizer("llama")
    config = tiny_config("llama", tokenizer).to_dict() | {"model_type": "gemma2", "final_logit_softcapping": 0.5}
    config.pop("architectures", None)
    from transformers import Gemma2Config

    model = AutoModelForCausalLM.from_config(Gemma2Config(**config | {"head_dim": 16})).eval()
    wrapped = AutoNextTokenLM(model).eval()
    assert not wrapped.split_output
    ids, _ = masked_batch(model.config.vocab_size)
    with torch.no_grad():
        logits = model(input_ids=ids[:, :-1]).logits
        product = model.get_output_embeddings()(model.base_model(input_ids=ids[:, :-1]).last_hidden_state)
        loss = wrapped(ids[:, :-1], ids[:, 1:])[0]
    assert not torch.allclose(logits, product)  # the cap bites: a fused loss would be another one
    torch.testing.assert_close(loss, F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()))


def test_positions_leave_out_robertas_offset(checkpoint):
    roberta = AutoModelForMaskedLM.from_pretrained(checkpoint("roberta")).eval()
    pad = roberta.config.pad_token_id
    assert usable_positions(roberta) == 64 - pad - 1
    roberta(input_ids=torch.full((1, usable_positions(roberta)), 5))  # the longest block that fits runs
    assert usable_positions(AutoModelForCausalLM.from_pretrained(checkpoint("llama"))) == 64  # rotary: the config's


def test_a_block_past_the_checkpoints_positions_is_refused(workspace, checkpoint):
    data = continued_recipe(workspace, "roberta", checkpoint("roberta"), "too-long")
    data["corpus"]["block_size"] = 62
    line = one_error_line(runner.invoke(app, ["pretrain", str(write_yaml(workspace / "too-long.yaml", data))]))
    assert "corpus.block_size 62 exceeds the 60 positions of" in line


def test_an_electra_discriminator_is_refused_in_one_line(workspace):
    tokenizer = tiny_tokenizer("electra")
    folder = workspace / "discriminator"
    ElectraForPreTraining(tiny_config("electra", tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    data = continued_recipe(workspace, "electra", folder, "discriminator")
    line = one_error_line(runner.invoke(app, ["pretrain", str(write_yaml(workspace / "discriminator.yaml", data))]))
    assert "is an ELECTRA discriminator (ElectraForPreTraining" in line and "generator" in line
    assert not (workspace / "runs" / "discriminator").exists()


@pytest.mark.parametrize(
    ("model_type", "family", "says"),
    [
        ("llama", "bert", "is a 'llama' model (a decoder, no masked-LM head): set model.family: gpt2"),
        ("roberta", "gpt2", "is a 'roberta' model (an encoder with a masked-LM head): set model.family: bert"),
    ],
)
def test_a_checkpoint_under_the_other_objective_is_refused_naming_its_type(
    model_type, family, says, workspace, checkpoint
):
    data = continued_recipe(workspace, model_type, checkpoint(model_type), f"{model_type}-{family}")
    data["model"]["family"] = family
    path = write_yaml(workspace / f"{model_type}-{family}.yaml", data)
    assert says in one_error_line(runner.invoke(app, ["pretrain", str(path)]))
    assert says in one_error_line(runner.invoke(app, ["profile", str(path)]))


def test_a_tokenizer_without_the_token_the_layout_needs_is_refused(workspace, checkpoint):
    folder = workspace / "llama-without-eos"
    AutoModelForCausalLM.from_pretrained(checkpoint("llama")).save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint("llama"))
    tokenizer.eos_token = None
    tokenizer.save_pretrained(folder)
    data = continued_recipe(workspace, "llama", folder, "without-eos")
    line = one_error_line(runner.invoke(app, ["pretrain", str(write_yaml(workspace / "without-eos.yaml", data))]))
    assert "has no eos_token, which gpt2 pretraining needs" in line


@pytest.mark.parametrize("model_type", ["roberta", "llama"])
def test_profile_names_the_checkpoints_family(model_type, workspace, checkpoint):
    data = continued_recipe(workspace, model_type, checkpoint(model_type), f"profile-{model_type}")
    path = write_yaml(workspace / f"profile-{model_type}.yaml", data)
    result = runner.invoke(app, ["profile", str(path), "--json", "--matmul-gflops", "100"])
    assert result.exit_code == 0, result.output
    profile = json.loads(result.output)
    assert profile["model"]["family"] == model_type and profile["model"]["sizes"]["layers"] == 2
    parameters = sum(p.numel() for p in auto_class(model_type).from_pretrained(checkpoint(model_type)).parameters())
    assert profile["parameters"]["total"] == parameters


class Interrupted(Exception):
    """Stands for the run being killed right after a periodic checkpoint."""


@pytest.mark.parametrize("model_type", ["roberta", "llama"])
def test_resume_is_bit_exact(model_type, workspace, checkpoint, tmp_path):
    """Six steps straight, or interrupted after the checkpoint of step 4 and resumed: the same weights and metrics;
    the token cache read by all three runs."""

    def recipe(name: str):
        data = continued_recipe(workspace, model_type, checkpoint(model_type), name, dropout=0.1)
        data["run_dir"] = str(tmp_path / name)
        data["corpus"]["cache_dir"] = str(tmp_path / "cache")
        data["training"].update(max_steps=6, log_every=1)
        data.update(checkpoint_every=2, eval_every=3)
        return load_recipe(write_yaml(tmp_path / f"{name}.yaml", data))

    run_pretrain(recipe("full"))
    interrupted = recipe("resumed")
    with interrupted_at_step(4, Interrupted):
        run_pretrain(interrupted)
    run_pretrain(interrupted, resume=True)
    full = load_file(tmp_path / "full" / "checkpoint" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "checkpoint" / "model.safetensors")
    assert full.keys() == resumed.keys() and all(torch.equal(full[name], resumed[name]) for name in full)
    assert comparable_metrics(tmp_path / "full") == comparable_metrics(tmp_path / "resumed")
    assert len(list((tmp_path / "cache").rglob("*"))) > 0


@pytest.mark.parametrize("model_type", ["roberta", "llama"])
def test_a_streamed_corpus_continues_a_checkpoint(model_type, workspace, checkpoint, tmp_path):
    data = continued_recipe(workspace, model_type, checkpoint(model_type), f"stream-{model_type}")
    data["run_dir"] = str(tmp_path / "run")
    data["corpus"] = {
        "dataset": "text",
        "dataset_files": [str(workspace / "corpus" / "train.txt")],
        "streaming": True,
        "validation_documents": 20,
        "block_size": 16,
        "cache_dir": None,
    }
    result = runner.invoke(app, ["pretrain", str(write_yaml(tmp_path / "stream.yaml", data))])
    assert result.exit_code == 0, result.output
    assert auto_class(model_type).from_pretrained(tmp_path / "run" / "checkpoint") is not None


def test_generate_and_score_read_a_continued_llama(continued, tmp_path):
    run, _ = continued("llama")
    saved = str(run / "checkpoint")
    result = runner.invoke(app, ["generate", saved, "--prompt", "the film", "--max-new-tokens", "4", "--seed", "0"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("the film")
    text = tmp_path / "text.txt"
    text.write_text("the film was great .\nthe plot was dull .\n", encoding="utf-8")
    result = runner.invoke(app, ["score", saved, str(text)])
    assert result.exit_code == 0, result.output
    assert "nats per token" in result.output


def test_the_family_comes_from_the_checkpoints_model_type(checkpoint, tmp_path):
    def chosen(family: str, model_type: str):
        return family_of(MODEL_SECTIONS[family](family=family, checkpoint=str(checkpoint(model_type))))

    assert (chosen("bert", "bert"), chosen("gpt2", "gpt2")) == (BERT, GPT2)  # their own fast routes
    assert chosen("bert", "roberta") is AUTO_MASKED_LM and chosen("gpt2", "llama") is AUTO_CAUSAL_LM
    assert chosen("bert", "llama") is AUTO_MASKED_LM  # which refuses it, naming llama (above)
    assert family_of(MODEL_SECTIONS["bert"](checkpoint=str(tmp_path / "not-there"))) is BERT  # refused on load
    assert AUTO_CAUSAL_LM.owns(AutoConfig.for_model("qwen2")) and not AUTO_CAUSAL_LM.owns(AutoConfig.for_model("bert"))


# ---------------------------------------------------------------------------------------------
# Whole-word masking by the tokenizer's own conventions
# ---------------------------------------------------------------------------------------------


def sentencepiece_tokenizer():
    """A BPE tokenizer with SentencePiece's ▁ word starts (Metaspace), as XLM-R's, ALBERT's or Llama's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = {
        "unk_token": "<unk>",
        "cls_token": "<s>",
        "sep_token": "</s>",
        "pad_token": "<pad>",
        "mask_token": "<mask>",
    }
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=150, min_frequency=1, special_tokens=list(special.values()))
    backend.train_from_iterator(tiny_text(), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **special)


WHOLE_WORD_TOKENIZERS = {
    "WordPiece ##": lambda: tiny_tokenizer("bert"),
    "byte-level BPE Ġ": lambda: tiny_tokenizer("roberta"),
    "SentencePiece ▁": sentencepiece_tokenizer,
}


@pytest.mark.parametrize("convention", WHOLE_WORD_TOKENIZERS)
def test_whole_word_masking_chooses_the_words_the_tokenizer_marks(convention):
    tokenizer = WHOLE_WORD_TOKENIZERS[convention]()
    rule = MaskingRule.for_tokenizer(tokenizer, MaskingConfig(probability=0.3, whole_word=True))
    # Words the tiny vocabularies never saw whole: split into several pieces each.
    text = " ".join(["the unbelievably boring cinematography was really great ."] * 50)
    encoding = tokenizer(text, add_special_tokens=True)
    ids, words = np.array(encoding["input_ids"]), encoding.word_ids()
    unit = rule._unit_index(ids)
    pieces_of = {}
    for position, word in enumerate(words):
        if word is not None:  # special tokens: none is ever chosen
            pieces_of.setdefault(word, set()).add(int(unit[position]))
    assert all(len(units) == 1 for units in pieces_of.values())  # every word is one unit ...
    assert len(set().union(*pieces_of.values())) == len(pieces_of)  # ... of its own
    assert max(words.count(word) for word in set(words) - {None}) >= 3, "the test needs words of several pieces"
    _, labels = rule.apply(ids, np.random.default_rng(0))
    for word in pieces_of:
        chosen = [labels[position] != IGNORE_INDEX for position, found in enumerate(words) if found == word]
        assert all(chosen) or not any(chosen)
    assert 0.2 < np.mean([labels[words.index(word)] != IGNORE_INDEX for word in pieces_of]) < 0.4


def test_whole_word_masking_refuses_a_vocabulary_without_word_marks(workspace, checkpoint):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "[MASK]": 3, "the": 4, "film": 5}
    backend = Tokenizer(models.WordLevel(vocabulary, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]"
    )
    with (
        pytest.raises(UserError, match=r"^masking.whole_word: the tokenizer marks no word boundaries"),
        recipe_key("masking.whole_word"),
    ):
        MaskingRule.for_tokenizer(tokenizer, MaskingConfig(whole_word=True))
