"""Model cards: the README.md of every saved checkpoint, in the Hugging Face format, from the run's own records.

The YAML front matter (base model, datasets, metrics with their values, library, pipeline tag) and the text
(what was trained and how, the evaluation curve's numbers, how to load it, intended use and limits) come from the
resolved recipe and metrics.jsonl; huggingface_hub's ModelCard / ModelCardData write and validate them, so the
hub shows the metrics and `ModelCard.load` reads the card back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from finetune.data.long_documents import DEFAULT_TRANSFORMER_MAX_LENGTH, DocumentReading
from finetune.glue.specs import GLUE_TASKS
from finetune.models.families import WHOLE_DOCUMENT_TYPES, family_of, family_of_model_type
from finetune.models.hub import HUB_NAME
from finetune.models.loading import is_adapter_checkpoint
from finetune.recipes.pretrain import HEAD_WARMUP_PHASE
from finetune.reporting.calibration_report import calibration_markdown
from finetune.reporting.class_report import per_class_markdown
from finetune.tasks.specs import TaskSpec

CARD_FILE = "README.md"
# The hub's metric ids for ours (its `evaluate` names).
HUB_METRICS = {
    "accuracy": "accuracy",
    "f1": "f1",
    "mcc": "matthews_correlation",
    "pearson": "pearsonr",
    "spearman": "spearmanr",
}


def hub_base_model(checkpoint: str | None) -> str | None:
    """A base model the hub can link to: a hub name (`name`, `org/name`) that is not a local folder; else None."""
    if checkpoint and HUB_NAME.match(checkpoint) and not Path(checkpoint).exists():
        return checkpoint
    return None


def _table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows])


def _evaluations(records: list[dict], names: list[str]) -> str:
    """The evaluation curve: one row per logged evaluation, the named metrics as columns."""
    rows = [
        [record["step"], record["epoch"] + 1] + [record.get(name, "") for name in names]
        for record in records
        if record.get("phase") == "eval"
    ]
    return _table(["step", "epoch"] + names, rows) if rows else "(no evaluation was logged)"


MEAN_POOLING_IMPORT = (
    "import finetune.models.mean_pooling  # registers the mean-pooling head; without finetune installed, pass\n"
    "# trust_remote_code=True to from_pretrained: the head's code is in the folder (auto_map)\n"
)


def _loading(architecture_import: str, auto_class: str, folder: str, adapter_base: str | None = None) -> str:
    """How to load the checkpoint in Python; with a LoRA adapter (`adapter_base`: its base checkpoint), through
    peft, or merged first."""
    if adapter_base is None:
        return (
            "```python\n" + architecture_import + f"from transformers import AutoTokenizer, {auto_class}\n\n"
            f'tokenizer = AutoTokenizer.from_pretrained("{folder}")\n'
            f'model = {auto_class}.from_pretrained("{folder}")\n```'
        )
    merge = (
        f"This folder holds a LoRA adapter (peft's format) and the head, not the weights of `{adapter_base}`. "
        f"`finetune merge {folder} MERGED` writes a plain model, which `{auto_class}.from_pretrained` loads alone"
    )
    # A family class of ours (its from_pretrained knows no base of another layout), or a base that is an adapter.
    if architecture_import not in ("", MEAN_POOLING_IMPORT) or is_adapter_checkpoint(adapter_base):
        return merge + "."
    return (
        merge
        + "; with peft:\n\n```python\n"
        + architecture_import
        + "from peft import PeftModel\n"
        + f"from transformers import AutoConfig, AutoTokenizer, {auto_class}\n\n"
        f'tokenizer = AutoTokenizer.from_pretrained("{folder}")\n'
        f'config = AutoConfig.from_pretrained("{folder}")  # the labels, the head it was trained on\n'
        f'base = {auto_class}.from_pretrained("{adapter_base}", config=config)\n'
        f'model = PeftModel.from_pretrained(base, "{folder}")\n```'
    )


def _adapter_base(recipe) -> str | None:
    """The base checkpoint of a run with a LoRA adapter (model.adapter), else None."""
    return recipe.model.checkpoint if getattr(recipe.model, "adapter", None) is not None else None


class CardKind(NamedTuple):
    """What a fine-tuned model's card says of its task kind."""

    task_type: str  # the hub's pipeline tag
    what: str  # "a bert {what} for ..."
    auto_class: str  # the Auto class that loads it
    architecture: str  # the import that registers a class of ours (may be empty)
    example_input: str  # the file `finetune predict` reads in the card's example
    inputs: str
    outputs: str
    reads: str  # how it reads an example
    tags: tuple[str, ...] = ()
    use_note: str = ""
    settings: tuple[tuple[str, str], ...] = ()  # the kind's rows of the card's training table
    logged: tuple[str, ...] = ()  # what the evaluation curve shows beside the dev scores (metrics.jsonl names)


def read_length(max_length: int | None, model_type: str) -> int | None:
    """The tokens a classifier read per example: task.max_length, or left out, the whole example for a recurrent
    model and DEFAULT_TRANSFORMER_MAX_LENGTH for a transformer (`models.heads.fitted_max_length`'s rule)."""
    if max_length is None and model_type not in WHOLE_DOCUMENT_TYPES:
        return DEFAULT_TRANSFORMER_MAX_LENGTH
    return max_length


def head_architecture(recipe, model_type: str) -> str:
    """The import that registers the classifier's (or tagger's, ...) class of ours, for the card's loading code."""
    family = family_of_model_type(model_type)  # None for transformers' own (roberta, deberta, ...)
    return (family.classifier_registering_import if family else "") or (
        MEAN_POOLING_IMPORT if recipe.pooling in ("mean", "scalar_mix") else ""
    )


def classifier_reading(recipe, model_type: str) -> str:
    """How a sequence classifier reads an example: its length, long documents, both orders."""
    task = recipe.task
    return DocumentReading.of(
        read_length(task.max_length, model_type), task.long_documents, task.both_orders
    ).describe()


def training_settings(recipe, spec: TaskSpec, result: dict, kind: CardKind) -> list[list]:
    """The card's table of how the model was trained."""
    training, unfreezing = recipe.training, recipe.unfreezing
    thaw = (
        "off"
        if unfreezing.mode == "none"
        else (
            f"gradual, from {unfreezing.initial_groups} group(s), one more every "
            + (
                f"{unfreezing.every_steps} steps"
                if unfreezing.every_steps
                else f"{unfreezing.every_fraction:.0%} of the steps"
                if unfreezing.every_fraction
                else f"epoch ({unfreezing.groups_per_epoch or 1} per epoch)"
            )
        )
    )
    settings = [
        ["base model", f"`{recipe.model.checkpoint}` ({recipe.model.init} weights)"],
        ["task", f"{spec.display_name} (`{spec.name}`): {kind.inputs} -> {kind.outputs}"],
        ["pooling", recipe.pooling],
        ["method", recipe.method],
        ["epochs / batch size", f"{training.epochs or 'by the data size'} / {training.batch_size}"],
        ["optimizer steps", result["last_step"]],
        ["peak LR (top group)", f"{training.lr:g}"],
        ["schedule", recipe.schedule.kind],
        ["discriminative LRs", f"factor {recipe.discriminative.factor:g}"],
        ["gradual unfreezing", thaw],
        ["reading", kind.reads],
        ["seed", recipe.seed],
    ]
    return settings + [list(row) for row in kind.settings]


def classifier_card(
    recipe, spec: TaskSpec, result: dict, records: list[dict], model_type: str, kind: CardKind
) -> ModelCard:
    """The card of a fine-tuned model of any task kind (`kind`: what its kind says, finetune/kinds/K/kind.py): dev
    scores of the saved weights and the curve."""
    saved = result["best"] if result["saved"] == "best" else result["last"]
    # A multi-label run's dev_threshold is the decision threshold these scores were taken at, not a score.
    scores = {
        name.removeprefix("dev_"): value
        for name, value in saved.items()
        if name.startswith("dev_") and name != "dev_threshold"
    }
    data = _classifier_card_data(recipe, spec, scores, model_type, kind)
    body = f"""
# {Path(recipe.run_dir).name}

A {model_type} {kind.what} for {spec.display_name}, fine-tuned with the finetune toolkit from
`{recipe.model.checkpoint}`. {recipe.description}
"""
    body += _classifier_results(spec, result, scores, records, kind)
    body += _classifier_training(recipe, spec, result, kind)
    body += _classifier_use(recipe, kind) + _classifier_limits(spec, kind)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")


def _classifier_card_data(recipe, spec: TaskSpec, scores: dict, model_type: str, kind: CardKind) -> ModelCardData:
    """A fine-tuned model's front matter: its dev scores as the hub's eval results, the dataset, the tags."""
    glue = spec.name in GLUE_TASKS
    dataset = "nyu-mll/glue" if glue else spec.name
    eval_results = [
        EvalResult(
            task_type=kind.task_type,
            dataset_type=dataset,
            dataset_name=spec.display_name,
            dataset_config=spec.name if glue else None,
            dataset_split="validation",
            metric_type=HUB_METRICS.get(name, name),
            metric_name=name,
            metric_value=round(float(value), 4),
        )
        for name, value in scores.items()
    ]
    family = family_of_model_type(model_type)
    return ModelCardData(
        base_model=hub_base_model(recipe.model.checkpoint),
        datasets=[dataset] if glue else None,
        eval_results=eval_results,
        metrics=[HUB_METRICS.get(name, name) for name in scores],
        library_name="peft" if _adapter_base(recipe) else "transformers",
        pipeline_tag=kind.task_type,
        model_name=Path(recipe.run_dir).name,
        tags=["finetune", kind.task_type, *kind.tags, *(family.classifier_card_tags if family else ())],
    )


def _classifier_results(spec: TaskSpec, result: dict, scores: dict, records: list[dict], kind: CardKind) -> str:
    """The card's Results: the saved weights' dev scores (which weights, honestly) and every evaluation; a
    classifier's calibration (reporting/calibration_report.py)."""
    which = (
        f"the best dev {result['main_metric']} of the run's evaluations (step {result['best_step']}): the dev "
        "set chose this checkpoint, so its dev score is optimistic; report a test or held-out score"
        if result["saved"] == "best"
        else f"the weights after the last step ({result['last_step']})"
    )
    names = [f"dev_{name}" for name in spec.metrics] + list(kind.logged) + ["validation_loss"]
    classes = result.get("classes")  # a classifier's per-class scores of the same evaluation
    per_class = "\n\nPer class (dev, x 100):\n\n" + "\n".join(per_class_markdown(classes)) if classes else ""
    return f"""
## Results

Dev scores of these weights ({which}):

{_table(["metric", "value"], [[name, float(value)] for name, value in scores.items()])}{per_class}

Every evaluation of the run (dev set):

{_evaluations(records, names)}
""" + (calibration_markdown(result["calibration"]) if "calibration" in result else "")


def _classifier_training(recipe, spec: TaskSpec, result: dict, kind: CardKind) -> str:
    """The card's Training: the settings' table and the recipe that trains it again."""
    return f"""
## Training

{_table(["setting", "value"], training_settings(recipe, spec, result, kind))}

The full recipe is `finetune_recipe.yaml` beside the weights: `finetune finetune finetune_recipe.yaml` trains it again.
"""


def _classifier_use(recipe, kind: CardKind) -> str:
    """The card's How to use: `finetune predict`, then loading in Python."""
    return f"""
## How to use

```bash
finetune predict PATH_TO_THIS_FOLDER --input {kind.example_input}
```

{_loading(kind.architecture, kind.auto_class, "PATH_TO_THIS_FOLDER", _adapter_base(recipe))}{kind.use_note}
"""


def _classifier_limits(spec: TaskSpec, kind: CardKind) -> str:
    """The card's Intended use and limits: what it reads, where it was scored."""
    return f"""
## Intended use and limits

For {spec.display_name}-like inputs ({kind.inputs}); the model {kind.reads}.
The scores above are from the task's dev set only; the model was not evaluated on other domains, and it inherits the
biases of its base model and of its training data. Small training sets give unstable results from one seed to the
next: compare seeds before relying on one run.
"""


def language_model_card(recipe, records: list[dict], config) -> ModelCard:
    """The card of a pretrained (or further pretrained) language model (`config`: its config): its validation
    curve."""
    trained = family_of(recipe.model)
    family = trained.shown_name(recipe.model, config)  # bert, gpt2, ...; a continued roberta or llama: its own
    evaluations = [record for record in records if record.get("phase") == "eval"]
    last = evaluations[-1] if evaluations else {}
    base = getattr(recipe.model, "checkpoint", None)
    source = _corpus_source(recipe.corpus)
    accuracy = next((name for name in last if name.endswith("accuracy")), None)
    data = _language_model_card_data(recipe, trained, family, last, accuracy, base)
    purpose, next_step = _language_model_purpose(trained)
    body = f"""
# {Path(recipe.run_dir).name}

A {family} language model {"further trained from `" + base + "`" if base else "trained from scratch"} with
the finetune toolkit on {source}. {recipe.description}{_head_warmup(recipe, records)}
"""
    body += _validation_curve(records, accuracy) + _language_model_use(recipe, trained, next_step)
    body += _language_model_limits(purpose, source, last)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")


def _head_warmup(recipe, records: list[dict]) -> str:
    """The card's sentence about the head's warm-up, where the run had one (its records in metrics.jsonl)."""
    steps = max((record["step"] for record in records if record.get("phase") == HEAD_WARMUP_PHASE), default=0)
    if not steps:
        return ""
    return (
        f"\n\nIts language-model head first trained alone for {steps} steps at lr {recipe.head_warmup.lr:g} "
        "(`head_warmup`), the rest of the model frozen, so that a random head's first gradients did not move the "
        "pretrained weights; then every weight trained."
    )


def _corpus_source(corpus) -> str:
    """What a language model was trained on, as the card says it: a dataset, a task's text, or the files."""
    if corpus.dataset:
        return f"the `{corpus.dataset}` dataset" + (f" ({corpus.dataset_config})" if corpus.dataset_config else "")
    if corpus.task is not None:
        return f"the text of task `{corpus.task.name}` ({', '.join(corpus.task_splits)})"
    return ", ".join(f"`{Path(path).name}`" for path in corpus.train_files)


def _language_model_card_data(
    recipe, trained, family: str, last: dict, accuracy: str | None, base: str | None
) -> ModelCardData:
    """A language model's front matter: its last validation scores as the hub's eval results, the tags."""
    corpus = recipe.corpus
    eval_results = [
        EvalResult(
            task_type=trained.pipeline_tag,
            dataset_type=corpus.dataset or "text",
            dataset_name=corpus.dataset or "held-out text",
            dataset_split="validation",
            metric_type=name,
            metric_name=name,
            metric_value=round(float(last[name]), 4),
        )
        for name in ("validation_loss", "validation_perplexity", accuracy)
        if name and name in last
    ]
    return ModelCardData(
        base_model=hub_base_model(base),
        datasets=[corpus.dataset] if corpus.dataset else None,
        eval_results=eval_results or None,
        library_name="peft" if _adapter_base(recipe) else "transformers",
        pipeline_tag=trained.pipeline_tag,
        model_name=Path(recipe.run_dir).name,
        tags=["finetune", family, *trained.card_tags],
    )


def _language_model_purpose(trained) -> tuple[str, str]:
    """What the model is for, and the next step the card suggests."""
    if trained.counted:  # a baseline to compare with, not a backbone to fine-tune
        next_step = (
            "Score text with `model.nats_per_token(ids)` (mean nats per next token); `model(ids).logits` are "
            "next-token log-probabilities"
        )
        return "A baseline to compare language models with", next_step
    return (
        "A starting point for fine-tuning",
        "Fine-tune it on a task with `finetune finetune` (`model.checkpoint: PATH_TO_THIS_FOLDER`)",
    )


def _validation_curve(records: list[dict], accuracy: str | None) -> str:
    """The card's Validation curve: every evaluation, and the n-gram floor where one was counted."""
    return f"""
## Validation curve

Loss in nats per token on held-out text:

{_evaluations(records, ["validation_loss", "validation_perplexity"] + ([accuracy] if accuracy else []))}
{_floor(records)}"""


def _language_model_use(recipe, trained, next_step: str) -> str:
    """The card's How to use: loading in Python, then the next step."""
    return f"""
## How to use

{_loading(trained.registering_import, trained.auto_class, "PATH_TO_THIS_FOLDER", _adapter_base(recipe))}

{next_step}; the full pretraining recipe is `finetune_recipe.yaml`
beside the weights.
"""


def _language_model_limits(purpose: str, source: str, last: dict) -> str:
    """The card's Intended use and limits: what it was trained on, how far it got."""
    return f"""
## Intended use and limits

{purpose}, not a model to deploy as is: it was trained on {source} only
({"a small corpus: " if last.get("validation_perplexity", 0) > 50 else ""}validation perplexity
{last.get("validation_perplexity", float("nan")):.1f}), and it reproduces that text's style, gaps and biases.
"""


def _floor(records: list[dict]) -> str:
    """The n-gram floor's line (`ngram_floor`), or nothing."""
    floors = [record for record in records if record.get("phase") == "floor"]
    if not floors:
        return ""
    floor = floors[-1]
    return (
        f"\nFloor: a {floor['model']} Kneser-Ney model counted on the same training tokens scores validation loss "
        f"{floor['validation_loss']:.4f} (perplexity {floor['validation_perplexity']:.1f}) on the same text.\n"
    )


def write_card(card: ModelCard, checkpoint: Path) -> Path:
    """Save the card as the checkpoint's README.md."""
    path = Path(checkpoint) / CARD_FILE
    card.save(path)
    return path


def add_card_section(checkpoint: Path, heading: str, text: str) -> None:
    """Add a section to the end of a checkpoint's card, in place of an earlier one of that heading (a run written
    again, e.g. by --resume), if the checkpoint has a card."""
    path = checkpoint / CARD_FILE
    if not path.is_file():
        return
    card, marker = path.read_text(encoding="utf-8"), f"\n## {heading}\n"
    start = card.find(marker)
    if start >= 0:
        end = card.find("\n## ", start + len(marker))
        card = card[:start] + (card[end:] if end >= 0 else "")
    # Written anew and renamed into place: a checkpoint's files may be hard links shared with another copy of it
    # (a self-training run's checkpoint is its last round's), which keeps its own card.
    partial = path.with_name(path.name + ".partial")
    partial.write_text(f"{card.rstrip()}\n{marker}\n{text.strip()}\n", encoding="utf-8")
    os.replace(partial, path)
