"""Task kind multilabel: any number of labels per example, the classifier with a sigmoid per label and binary
cross-entropy (problem_type multi_label_classification), decided at a threshold given or chosen on dev."""

from __future__ import annotations

from typing import Any

from finetune.data.long_documents import DocumentReading
from finetune.kinds.classification.kind import POOLING_NOTES, ClassificationKind
from finetune.kinds.multilabel.evaluation import run_multilabel_eval
from finetune.kinds.multilabel.fine_tuning import MultilabelFineTuning
from finetune.kinds.multilabel.model import DEFAULT_THRESHOLD, load_finetuned_multilabel, saved_threshold
from finetune.kinds.multilabel.predictor import MultilabelPredictor
from finetune.kinds.multilabel.recipe import MultilabelSection
from finetune.kinds.multilabel.spec import multilabel_spec
from finetune.reporting.model_card import CardKind
from finetune.tasks.specs import TaskSpec


class MultilabelKind(ClassificationKind):
    name = "multilabel"
    section = MultilabelSection
    fine_tuning_class = MultilabelFineTuning

    def evaluate(self, recipe, spec: TaskSpec, accelerator) -> dict:
        return run_multilabel_eval(recipe, spec, accelerator)

    def load_model(self, folder: str, spec: TaskSpec, trust_remote_code: bool) -> Any:
        return load_finetuned_multilabel(folder, spec, trust_remote_code=trust_remote_code)

    def make_predictor(
        self, model, tokenizer, spec: TaskSpec, reading: DocumentReading, batch_size: int
    ) -> MultilabelPredictor:
        threshold = saved_threshold(model) or DEFAULT_THRESHOLD
        return MultilabelPredictor(model, tokenizer, spec, reading, batch_size, threshold)

    def output_table(self, spec: TaskSpec, rows: list[dict]) -> tuple[list[dict], list[str]]:
        """The predicted labels joined by the task's separator, and a probability per label."""
        assert spec.labels is not None  # a multi-label task's spec always has its label set
        separator = multilabel_spec(spec).label_separator
        rows = [{**row, "labels": separator.join(row["labels"])} for row in rows]
        return rows, [*spec.text_columns, "labels", *(f"probability_{label}" for label in spec.labels)]

    def outputs(self, spec: TaskSpec) -> str:
        assert spec.labels is not None
        return "any number of labels (multi-label): " + ", ".join(spec.labels)

    def card(self, recipe, spec: TaskSpec, model_type: str, result: dict) -> CardKind:
        saved = result["best"] if result["saved"] == "best" else result["last"]
        chosen = "chosen on dev: the best micro F1)" if recipe.task.threshold == "dev" else "given)"
        threshold = f"{saved['dev_threshold']:g} (a sigmoid per label; a label is predicted above it; {chosen}"
        return (
            super()
            .card(recipe, spec, model_type, result)
            ._replace(
                tags=("multi-label-classification",),
                use_note="\n\nMulti-label: each label has its own sigmoid; the labels of a text are those whose "
                "probability is above `model.config.multilabel_threshold` (transformers' text-classification "
                "pipeline applies the sigmoid for this problem_type; `top_k=None` gives every label).",
                settings=(("decision threshold", threshold),),
                logged=("dev_threshold",),  # the threshold each evaluation's scores were taken at
            )
        )

    def profile_description(self, recipe, num_labels: int) -> str:
        return f"multi-label classifier, {num_labels} labels" + POOLING_NOTES.get(recipe.pooling, "")


MULTILABEL = MultilabelKind()
