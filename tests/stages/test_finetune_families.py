"""Fine-tuning every family issue 41 names, for every task kind its family has a head for: layer groups, 2 steps
through the CLI, the saved checkpoint reloaded by the Auto class with the logits the trained model gave, decoders'
padding and last-token pooling, one-line refusals, and the per-backbone defaults."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)
from typer.testing import CliRunner

import finetune
from finetune.cli import app
from finetune.errors import UserError
from finetune.kinds import head_training as task_stage  # where a fine-tuning job saves its checkpoints
from finetune.kinds.registry import KINDS
from finetune.models.backbones import layer_groups
from finetune.reporting import finish
from finetune.run_dir import read_metrics
from finetune.training.techniques import Backbone, backbone_defaults, describe_backbone
from tests.conftest import custom_task_section, one_error_line, write_task, write_yaml
from tests.kinds.test_multilabel import task_section as multilabel_section
from tests.kinds.test_multilabel import write_marker_task
from tests.kinds.test_multiple_choice import write_questions
from tests.kinds.test_question_answering import write_squad
from tests.kinds.test_tagging import write_conll
from tests.tiny_families import (
    CAUSAL_FAMILIES,
    MASKED_FAMILIES,
    WORDS,
    save_tiny_checkpoint,
    tiny_config,
    tiny_tokenizer,
)

runner = CliRunner()
FAMILIES = MASKED_FAMILIES + CAUSAL_FAMILIES

# Each family's stack of blocks inside its base model: layer groups 1 to N, in this order.
BLOCKS = {
    "bert": "encoder.layer",
    "roberta": "encoder.layer",
    "xlm-roberta": "encoder.layer",
    "deberta-v2": "encoder.layer",
    "modernbert": "layers",
    "distilbert": "transformer.layer",
    "albert": "encoder.albert_layer_groups",  # one set of weights shared by every layer
    "mpnet": "encoder.layer",
    "electra": "encoder.layer",
    "gpt2": "h",
    "llama": "layers",
    "mistral": "layers",
    "qwen2": "layers",
    "gemma": "layers",
    "phi": "layers",
    "opt": "decoder.layers",
    "gpt_neox": "layers",
}
AUTO_CLASSES = {name: kind.auto_class for name, kind in KINDS.items()}  # what loads each kind's checkpoint
# Where transformers has no head for the kind (and the toolkit adds none: GPT-2's multiple choice is its own).
NO_HEAD = {("opt", "tokens"), ("gemma", "spans"), ("phi", "spans")} | {
    (family, "choices") for family in CAUSAL_FAMILIES if family != "gpt2"
}
# The first kind of each Auto class (classification, tokens, choices, spans) runs on every family with a head for it;
# the kinds that share one (regression and multilabel: the classifier's head with another loss) on an encoder and a
# decoder this issue adds.
HEAD_KINDS: dict = {}  # Auto class -> the first kind of the table with it
for _name, _kind in KINDS.items():
    HEAD_KINDS.setdefault(_kind.auto_class, _name)
RUNS = [(family, kind) for kind in HEAD_KINDS.values() for family in FAMILIES if (family, kind) not in NO_HEAD]
RUNS += [(family, kind) for kind in KINDS if kind not in HEAD_KINDS.values() for family in ("mpnet", "llama")]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from a second thread, and on a busy machine its waits cost seconds a step."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _ids(parameters) -> set[int]:
    return {id(parameter) for parameter in parameters}


# ---------------------------------------------------------------------------------------------
# Layer groups
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head", ["classifier", "language_model"])
@pytest.mark.parametrize("family", FAMILIES)
def test_layer_groups_hold_every_parameter_once_from_embeddings_to_head(family, head):
    language_model = AutoModelForCausalLM if family in CAUSAL_FAMILIES else AutoModelForMaskedLM
    auto_class = AutoModelForSequenceClassification if head == "classifier" else language_model
    torch.manual_seed(0)
    model = auto_class.from_config(tiny_config(family, tiny_tokenizer(family)))
    groups = layer_groups(model)
    flat = [id(parameter) for group in groups for parameter in group]
    assert len(flat) == len(set(flat)) == len(list(model.parameters()))
    assert id(model.get_input_embeddings().weight) in _ids(groups[0])
    blocks = model.base_model.get_submodule(BLOCKS[family])
    assert [_ids(group) for group in groups[1:-1]] == [_ids(block.parameters()) for block in blocks]
    above_the_base = _ids(model.parameters()) - _ids(model.base_model.parameters())
    assert above_the_base <= _ids(groups[-1])  # the task or LM head (a tied LM head is the embedding's)
    assert groups[0] and groups[-1]


def test_a_family_without_a_finder_is_grouped_by_its_stack_of_blocks_and_says_so(capsys):
    config = AutoConfig.for_model("bloom", vocab_size=64, hidden_size=32, n_layer=3, n_head=2)
    model = AutoModelForSequenceClassification.from_config(config)
    groups = layer_groups(model)
    base = model.transformer
    assert [_ids(group) for group in groups] == [
        _ids([*base.word_embeddings.parameters(), *base.word_embeddings_layernorm.parameters()]),
        *(_ids(block.parameters()) for block in base.h),
        _ids([*base.ln_f.parameters(), *model.score.parameters()]),
    ]
    said = [line for line in capsys.readouterr().err.splitlines() if "layer groups" in line]
    expected = (
        "layer groups of this 'bloom' model, found by its stack of blocks (the family has no finder of its own): "
        "embeddings [transformer.word_embeddings, transformer.word_embeddings_layernorm], 3 blocks [transformer.h: "
        "BloomBlock], head [transformer.ln_f, score]"
    )
    assert said == [expected]


def test_the_stack_is_the_outermost_list_of_blocks_not_a_blocks_list_of_experts():
    """Qwen2-MoE's blocks each hold a list of 4 experts, longer than its 2 blocks: the blocks are the stack."""
    config = AutoConfig.for_model(
        "qwen2_moe",
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_experts=4,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
    )
    model = AutoModelForSequenceClassification.from_config(config)
    groups = layer_groups(model)
    assert [_ids(group) for group in groups[1:-1]] == [_ids(block.parameters()) for block in model.model.layers]


def test_an_encoder_decoder_is_refused_in_one_line():
    model = AutoModelForSequenceClassification.from_config(
        AutoConfig.for_model("t5", vocab_size=64, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2)
    )
    with pytest.raises(UserError, match=r"^a 't5' model is an encoder-decoder.*: fine-tune an encoder .* decoder"):
        layer_groups(model)


# ---------------------------------------------------------------------------------------------
# Two steps of fine-tuning through the CLI, for each kind
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def task_sections(tmp_path_factory) -> dict[str, dict]:
    """A small task of each kind (16 training and 8 dev examples) as a recipe's task section."""
    root = tmp_path_factory.mktemp("kinds")
    splits = (("train", 16), ("dev", 8))
    for number, (split, count) in enumerate(splits):
        write_conll(root / "tokens" / f"{split}.txt", count, number)
        write_squad(root / "spans" / f"{split}.json", count, number)
        write_questions(root / "choices" / f"{split}.jsonl", count, number)
    rng = random.Random(0)
    (root / "regression").mkdir()
    for split, count in splits:
        rows = [f"the film was {rng.choice(WORDS)} .\t{rng.uniform(0, 5):.2f}" for _ in range(count)]
        (root / "regression" / f"{split}.tsv").write_text("sentence\tscore\n" + "\n".join(rows) + "\n")
    return {
        "classification": custom_task_section(write_task(root / "classification", 16, 8, 4)),
        "regression": {
            "name": "scores",
            "data_dir": str(root / "regression"),
            "text_columns": ["sentence"],
            "label_column": "score",
            "metrics": ["pearson", "spearman"],
            "max_length": 16,
        },
        "multilabel": multilabel_section(write_marker_task(root / "multilabel", splits)),
        "tokens": {"name": "tags", "kind": "tokens", "data_dir": str(root / "tokens"), "max_length": 32},
        "spans": {"name": "qa", "kind": "spans", "data_dir": str(root / "spans"), "max_length": 32, "doc_stride": 8},
        "choices": {"name": "arc", "kind": "choices", "data_dir": str(root / "choices"), "max_length": 24},
    }


@pytest.fixture(scope="module")
def checkpoint_of(tmp_path_factory):
    """The tiny checkpoint (language model and tokenizer) of a family, saved once per module."""
    folder, saved = tmp_path_factory.mktemp("checkpoints"), {}

    def checkpoint(family: str) -> Path:
        if family not in saved:
            saved[family] = save_tiny_checkpoint(folder / family, family)
        return saved[family]

    return checkpoint


def probe_logits(model) -> torch.Tensor:
    """The model's logits for one unpadded row of ordinary tokens (two choices of it for a multiple-choice model)."""
    input_ids = torch.arange(5, 11)[None]
    if "MultipleChoice" in type(model).__name__:
        input_ids = input_ids[:, None].expand(1, 2, -1)
    training, device = model.training, next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        output = model(input_ids=input_ids.to(device), attention_mask=torch.ones_like(input_ids).to(device))
    model.train(training)
    logits = output.logits if "logits" in output else torch.stack([output.start_logits, output.end_logits])
    return logits.float().cpu()


@pytest.fixture(scope="module")
def run_of(tmp_path_factory, checkpoint_of, task_sections):
    """(CLI result, checkpoint folder, the trained model's probe logits when it was saved) of 2 steps of
    fine-tuning a family on a kind, run once per module."""
    folder, runs = tmp_path_factory.mktemp("runs"), {}

    def run(family: str, kind: str):
        if (family, kind) not in runs:
            run_dir = folder / f"{family}-{kind}"
            recipe = {
                "stage": "finetune",
                "run_dir": str(run_dir),
                "seed": 0,
                "model": {"checkpoint": str(checkpoint_of(family))},
                "task": task_sections[kind],
                "training": {"epochs": 1, "max_steps": 2, "batch_size": 4, "device": "cpu"},
            }
            saved = []
            original = task_stage.save_checkpoint

            def save_and_probe(model, *arguments, **keywords):
                saved.append(probe_logits(model))
                return original(model, *arguments, **keywords)

            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(task_stage, "save_checkpoint", save_and_probe)
                # No plots: test_plots.py draws them, and here they would take half of each run's time.
                patch.setattr(finish, "write_plots_or_warn", lambda run_dir: [])
                result = runner.invoke(app, ["finetune", str(write_yaml(folder / f"{family}-{kind}.yaml", recipe))])
            runs[family, kind] = (result, run_dir / "checkpoint", saved[-1] if saved else None)
        return runs[family, kind]

    return run


@pytest.mark.parametrize(("family", "kind"), RUNS, ids=[f"{family}-{kind}" for family, kind in RUNS])
def test_two_steps_of_each_kind_save_a_checkpoint_the_auto_class_reloads_with_the_same_logits(run_of, family, kind):
    result, checkpoint, trained_logits = run_of(family, kind)
    assert result.exit_code == 0, result.output[-3000:]
    model, loading = AUTO_CLASSES[kind].from_pretrained(checkpoint, output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"]
    assert model.config.model_type == family
    # A decoder's classifier pools the last token that is not config.pad_token_id: the one batches pad with.
    assert model.config.pad_token_id == AutoTokenizer.from_pretrained(checkpoint).pad_token_id
    torch.testing.assert_close(probe_logits(model), trained_logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("family", "kind"), sorted(NO_HEAD))
def test_a_kind_without_a_head_for_the_family_is_one_line_naming_what_it_can_do(
    checkpoint_of, task_sections, tmp_path, family, kind
):
    recipe = {
        "stage": "finetune",
        "run_dir": str(tmp_path / "run"),
        "model": {"checkpoint": str(checkpoint_of(family))},
        "task": task_sections[kind],
        "training": {"epochs": 1, "max_steps": 2, "device": "cpu"},
    }
    message = one_error_line(runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", recipe))]))
    assert message.startswith("error: model.checkpoint: ") and f"is a '{family}' model, which has no" in message
    classifiers = [name for name, other in KINDS.items() if other.auto_class is AutoModelForSequenceClassification]
    assert f"it fine-tunes for task kinds {', '.join(classifiers)}" in message  # the kinds with a head for it
    assert "finetune/" not in message and not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------
# Decoders: a padding token, and the last real token pooled
# ---------------------------------------------------------------------------------------------


def test_a_llama_without_a_pad_token_pads_with_its_end_of_text_and_pools_the_last_real_token(run_of):
    result, checkpoint, _ = run_of("llama", "classification")
    assert result.exit_code == 0, result.output[-3000:]
    assert result.output.count("has no padding token: batches pad with its end-of-text token </s>") == 1
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)  # as saved: predict and eval read this one
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    assert tokenizer.pad_token == tokenizer.eos_token == "</s>" and tokenizer.padding_side == "right"
    assert model.config.pad_token_id == tokenizer.pad_token_id
    texts = ["the script was awful", "dull", "the film was quite dull .", "the acting", "quite boring script"]
    lengths = [len(tokenizer(text)["input_ids"]) for text in texts]
    assert len(set(lengths)) == 5 and max(lengths) <= 16  # padded in one batch of 5; none cut by max_length 16
    predicted = finetune.predict(str(checkpoint), texts, batch_size=5)
    for text, prediction in zip(texts, predicted):
        inputs = tokenizer(text, return_tensors="pt")  # alone: no padding
        with torch.no_grad():
            alone = model(**inputs).logits
            last_state = model.model(**inputs).last_hidden_state[:, -1]
            torch.testing.assert_close(alone, model.score(last_state))  # the head reads the last token
        expected = torch.softmax(alone, dim=-1)[0].tolist()
        assert [prediction["probabilities"][label] for label in ("0", "1")] == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_decoders_read_left_to_right_and_encoders_both_ways(family):
    from finetune.models.families import reads_left_to_right

    assert reads_left_to_right(AutoConfig.for_model(family)) == (family in CAUSAL_FAMILIES)


# ---------------------------------------------------------------------------------------------
# Per-backbone defaults
# ---------------------------------------------------------------------------------------------


def test_decoders_of_llamas_kind_default_to_a_lower_lr_than_berts(checkpoint_of):
    backbone = describe_backbone(str(checkpoint_of("llama")))
    assert backbone_defaults(backbone)["training.lr"] == (2e-5, "default for a llama decoder")
    for family in ("mistral", "qwen2", "gemma", "phi", "opt", "gpt_neox", "bloom"):
        assert backbone_defaults(Backbone(family, 4096, None))["training.lr"][0] == 2e-5
    # The others as before: gpt2 and the encoders by width, mpnet among them.
    assert backbone_defaults(Backbone("gpt2", 768, None))["training.lr"][0] == 3e-5
    assert backbone_defaults(Backbone("mpnet", 384, "mean"))["training.lr"][0] == 1e-4
    assert backbone_defaults(Backbone("llama", 2048, None))["pooling"][0] == "model"  # its last token


def test_ulmfits_techniques_run_on_a_decoders_layer_groups(checkpoint_of, task_sections, tmp_path):
    """Discriminative LRs, gradual unfreezing (a group more every step) and STLR over a Llama's 4 groups."""
    recipe = {
        "stage": "finetune",
        "run_dir": str(tmp_path / "run"),
        "model": {"checkpoint": str(checkpoint_of("llama"))},
        "task": task_sections["classification"],
        "training": {"epochs": 1, "max_steps": 3, "batch_size": 4, "lr": 1e-3, "device": "cpu"},
        "discriminative": {"factor": 2.6},
        "unfreezing": {"mode": "gradual", "initial_groups": 1, "every_steps": 1},
        "schedule": {"kind": "stlr"},
    }
    result = runner.invoke(app, ["finetune", str(write_yaml(tmp_path / "recipe.yaml", recipe))])
    assert result.exit_code == 0, result.output[-3000:]
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    thawed = [record["trainable_groups"] for record in records if record["phase"] == "unfreeze"]
    assert thawed == [1, 2, 3] and {record["total_groups"] for record in records if "total_groups" in record} == {4}
    learning_rates = [record["lr"] for record in records if record["phase"] == "train"][-1]
    assert len(set(learning_rates.values())) == 4  # lr / 2.6 ** depth for each group
