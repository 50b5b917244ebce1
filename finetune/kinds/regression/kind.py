"""Task kind regression: a real-valued score per example (STS-B; a custom task whose label column holds numbers).
The classifier's reading, model and training with one output and transformers' MSE loss (problem_type regression),
scored by Pearson and Spearman correlations; `finetune predict` gives {"score"}."""

from __future__ import annotations

from finetune.data.long_documents import DocumentReading
from finetune.kinds.classification.kind import POOLING_NOTES, ClassificationKind
from finetune.kinds.regression.predictor import RegressionPredictor
from finetune.kinds.regression.recipe import RegressionSection
from finetune.tasks.specs import TaskSpec


class RegressionKind(ClassificationKind):
    name = "regression"
    section = RegressionSection

    def make_predictor(
        self, model, tokenizer, spec: TaskSpec, reading: DocumentReading, batch_size: int
    ) -> RegressionPredictor:
        return RegressionPredictor(model, tokenizer, spec, reading, batch_size)

    def output_table(self, spec: TaskSpec, rows: list[dict]) -> tuple[list[dict], list[str]]:
        return rows, [*spec.text_columns, "score"]

    def outputs(self, spec: TaskSpec) -> str:
        return "a score"

    def profile_description(self, recipe, num_labels: int) -> str:
        return "regression" + POOLING_NOTES.get(recipe.pooling, "")


REGRESSION = RegressionKind()
