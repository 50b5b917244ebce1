"""The `ulmfit` recipe: ULMFiT's three stages (general LM, target LM, classifier) as one run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_serializer, model_validator

from finetune.recipes.base import InputFolder, RunRecipe, Section, Seed
from finetune.recipes.finetune import FinetuneRecipe
from finetune.recipes.flow_sections import FLOW_SET_KEYS, flow_base, refuse_flow_keys, with_flow_seed
from finetune.recipes.language_models import MODEL_SECTIONS
from finetune.recipes.pretrain import PretrainRecipe
from finetune.recipes.task import TaskConfig

# Each stage's folder inside the flow's run_dir; a stage's checkpoint is FOLDER/checkpoint (the stages' CHECKPOINT_DIR).
ULMFIT_STAGE_FOLDERS = {"general_lm": "1-general-lm", "target_lm": "2-target-lm", "classifier": "3-classifier"}
ULMFIT_UPSTREAM = {"target_lm": "general_lm", "classifier": "target_lm"}  # whose checkpoint a stage starts from
ULMFIT_STAGE_DESCRIPTIONS = {  # fixed, so that a new top-level description does not stop --resume of a stage
    "general_lm": "ulmfit stage 1 of 3: general-domain language model",
    "target_lm": "ulmfit stage 2 of 3: the language model fine-tuned on the target task's text",
    "classifier": "ulmfit stage 3 of 3: the classifier on the fine-tuned language model",
}


class PretrainedLanguageModel(Section):
    """`general_lm: {checkpoint: PATH}`: no stage 1; stage 2 continues this language model (e.g. a downloaded one)."""

    checkpoint: InputFolder = Field(description="a language model checkpoint folder of the family target_lm trains")


class UlmfitRecipe(RunRecipe):
    """`finetune ulmfit`: ULMFiT's three stages as one run; each section is the body of its stage's recipe.

    The flow sets what wires the stages together (each section's stage, run_dir, description and overwrite, and
    the model.checkpoint of stages 2 and 3), so a section that gives them is refused rather than silently ignored.
    """

    stage: Literal["ulmfit"]
    seed: Seed = Field(0, description="the seed of every stage whose section gives none")
    task: TaskConfig | None = Field(
        None,
        description="the target task, written once (the keys of a finetune recipe's task.*): it becomes "
        "classifier.task and, unless target_lm.corpus reads train_files or a dataset, target_lm.corpus.task, whose "
        "text the language model is fine-tuned on; give it here or in those sections, not both",
    )
    general_lm: PretrainRecipe | PretrainedLanguageModel = Field(
        description="stage 1, into RUN_DIR/1-general-lm: a pretrain recipe without stage and run_dir (model.family "
        "defaults to awd_lstm), or {checkpoint: PATH} to start stage 2 from an existing language model"
    )
    target_lm: PretrainRecipe = Field(
        description="stage 2, into RUN_DIR/2-target-lm: a pretrain recipe without stage, run_dir and "
        "model.checkpoint (stage 1's; model.family defaults to stage 1's); e.g. corpus.task, "
        "tokenizer.new_vocabulary, discriminative.factor 2.6"
    )
    classifier: FinetuneRecipe = Field(
        description="stage 3, into RUN_DIR/3-classifier: a finetune recipe without stage, run_dir and "
        "model.checkpoint (stage 2's)"
    )

    @model_validator(mode="before")
    @classmethod
    def _wire_stages(cls, data: Any) -> Any:
        """Give each section what the flow decides for it, so the stage recipe classes validate it as written."""
        if not isinstance(data, dict):
            return data
        base = flow_base(data)
        general = data.get("general_lm")
        general_body: dict[Any, Any] = general if isinstance(general, dict) else {}  # {}: not a section, refused later
        skipped = "checkpoint" in general_body
        if skipped and len(general_body) > 1:
            raise ValueError(
                "general_lm: give either {checkpoint: PATH} (no stage 1) or a pretrain recipe, not both "
                f"(remove {', '.join(sorted(str(key) for key in general_body if key != 'checkpoint'))})"
            )
        checkpoints = {
            "general_lm": general_body["checkpoint"] if skipped else str(base / "1-general-lm" / "checkpoint"),
            "target_lm": str(base / "2-target-lm" / "checkpoint"),
        }
        seed = data.get("seed", 0)
        general_model = general_body.get("model")
        # Stage 2 continues stage 1's model: its family unless the section names one; a given checkpoint's objective
        # (masked or causal, read from its config.json); ULMFiT's AWD-LSTM by default.
        family = general_model.get("family", "awd_lstm") if isinstance(general_model, dict) else "awd_lstm"
        if skipped:
            family = checkpoint_objective(general_body["checkpoint"]) or family
        wired = dict(data)
        for section, folder in ULMFIT_STAGE_FOLDERS.items():
            body = data.get(section)
            if not isinstance(body, dict) or (section == "general_lm" and skipped):
                continue
            model = body.get("model", {})
            upstream = ULMFIT_UPSTREAM.get(section)
            refuse_flow_keys("ulmfit", section, body, base / folder, upstream and f"the {upstream} stage's checkpoint")
            if data.get("task") is not None:
                body = _with_the_task(section, body, data["task"])
            body = {
                **body,
                "stage": "finetune" if section == "classifier" else "pretrain",
                "run_dir": str(base / folder),
                "description": ULMFIT_STAGE_DESCRIPTIONS[section],
            }
            body = with_flow_seed(body, seed)
            if isinstance(model, dict) and section != "classifier":
                model = {"family": family, **model}
            if isinstance(model, dict) and section in ULMFIT_UPSTREAM:
                model = {**model, "checkpoint": checkpoints[ULMFIT_UPSTREAM[section]]}
            wired[section] = {**body, "model": model}
        return wired

    @field_validator("general_lm", mode="wrap")
    @classmethod
    def _one_form(cls, value: Any, handler: Any) -> Any:
        """Validate the section as the form it is written in, so that errors name its keys, not both forms' keys."""
        if isinstance(value, dict):
            form = PretrainedLanguageModel if "checkpoint" in value else PretrainRecipe
            return form.model_validate(value)  # pydantic reports its errors under general_lm.KEY
        if isinstance(value, (PretrainRecipe, PretrainedLanguageModel)):
            return handler(value)
        raise ValueError("expected a pretrain recipe (without stage and run_dir) or {checkpoint: PATH}")

    @model_validator(mode="after")
    def _same_family(self) -> UlmfitRecipe:
        general = self.general_lm
        if isinstance(general, PretrainRecipe) and general.model.family != self.target_lm.model.family:
            raise ValueError(
                f"target_lm.model.family: {self.target_lm.model.family}, but general_lm trains a "
                f"{general.model.family} model, which stage 2 continues"
            )
        if isinstance(general, PretrainRecipe) and (
            getattr(general.model, "memory_length", 0) != 0 or getattr(general.model, "attention", "dense") != "dense"
        ):
            raise ValueError(
                "general_lm.model: memory_length and attention build a model (Transformer-XL, sparse "
                "attention) that stages 2 and 3 cannot continue or fine-tune yet; remove them"
            )
        return self

    @model_serializer(mode="wrap")
    def _as_written(self, handler: Any) -> dict[str, Any]:
        """The recipe without what the flow set, so that a saved flow recipe loads again (defaults stay filled in,
        but for the continued model of stage 2: its architecture comes from stage 1, and the model section may not
        name it)."""
        data = handler(self)
        for section in ULMFIT_STAGE_FOLDERS:
            body = data.get(section)
            if isinstance(body, dict) and "stage" in body:  # a stage recipe, not {checkpoint: PATH}
                for key in FLOW_SET_KEYS:
                    body.pop(key, None)
                if section in ULMFIT_UPSTREAM:
                    body["model"].pop("checkpoint", None)
        written = self.target_lm.model.model_fields_set
        data["target_lm"]["model"] = {key: value for key, value in data["target_lm"]["model"].items() if key in written}
        if self.task is not None:  # the sections got it from the top-level task, where it stays
            data["classifier"].pop("task")
            if self.target_lm.corpus.task is not None:
                data["target_lm"]["corpus"].pop("task")
        return data

    def stage_recipes(self) -> dict[str, PretrainRecipe | FinetuneRecipe | None]:
        """Section name -> the stage's recipe as the flow runs it (general_lm: None when a checkpoint replaces it)."""
        general = self.general_lm if isinstance(self.general_lm, PretrainRecipe) else None
        return {"general_lm": general, "target_lm": self.target_lm, "classifier": self.classifier}


# Decoder model types whose config names no head (a bare `LlamaModel`): stage 2 continues them as causal LMs. Named
# here, since the recipe loads without importing transformers (models/families.py's is_decoder_type asks transformers'
# mappings): tests/models/test_families.py checks each is a decoder there, and that every decoder models/auto_lm.py's
# SPLIT_OUTPUT_TYPES fuses (those continued pretraining is tested on) is here.
DECODER_MODEL_TYPES = (
    "gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi", "phi3", "opt", "gpt_neox",
)  # fmt: skip


def checkpoint_objective(checkpoint: Any) -> str | None:
    """The model.family whose objective continues a local checkpoint: awd_lstm for ours, gpt2 (next token) for a
    decoder, bert (masked tokens) for an encoder; None where its config.json cannot be read here (a hub name: the
    section's family, or the default, decides).

    Read from config.json alone (no transformers import), so that the recipe loads fast: a head the config names
    (`...ForCausalLM`, `...LMHeadModel`, `...ForMaskedLM`) decides, else the model type (a bare encoder such as a
    sentence-embedding checkpoint is continued as a masked LM, its missing head starting fresh).
    """
    try:
        config = json.loads((Path(str(checkpoint)).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    model_type = config.get("model_type")
    architectures = [str(name) for name in config.get("architectures") or []]
    if model_type in MODEL_SECTIONS:  # bert, gpt2 and ours: the model type is the family
        return str(model_type)
    if any(name.endswith(("ForCausalLM", "LMHeadModel")) for name in architectures):
        return "gpt2"
    if any(name.endswith("ForMaskedLM") for name in architectures):
        return "bert"
    return "gpt2" if model_type in DECODER_MODEL_TYPES else "bert"


def _with_the_task(section: str, body: dict[str, Any], task: Any) -> dict[str, Any]:
    """The section with the top-level task where it reads one: stage 3's task, stage 2's corpus (unless that reads
    files or a dataset); given there too, it is refused in one line rather than one of the two silently winning."""
    if section == "classifier":
        if "task" in body:
            raise ValueError("classifier.task: the top-level task is stage 3's task; give it in one place")
        return {**body, "task": task}
    corpus = body.get("corpus", {})
    if section != "target_lm" or not isinstance(corpus, dict):
        return body
    if corpus.get("task") is not None:
        raise ValueError("target_lm.corpus.task: the top-level task is the text stage 2 reads; give it in one place")
    if corpus.get("train_files") or corpus.get("dataset"):  # the language model reads other text, as the user chose
        return body
    return {**body, "corpus": {**corpus, "task": task}}
