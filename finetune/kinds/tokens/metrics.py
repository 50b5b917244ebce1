"""The scores of tagging tasks: entity-level precision, recall and F1 with seqeval, and token accuracy."""

from __future__ import annotations

from seqeval import metrics as entity_metrics


def tagging_metrics(references: list[list[str]], predictions: list[list[str]]) -> dict[str, float]:
    """Entity-level micro precision, recall and F1 (seqeval, CoNLL's conlleval rules: an I- tag may start an
    entity), and the accuracy over every word's tag."""
    return {
        "f1": float(entity_metrics.f1_score(references, predictions, zero_division=0)),
        "precision": float(entity_metrics.precision_score(references, predictions, zero_division=0)),
        "recall": float(entity_metrics.recall_score(references, predictions, zero_division=0)),
        "accuracy": float(entity_metrics.accuracy_score(references, predictions)),
    }


def entity_types_table(references: list[list[str]], predictions: list[list[str]]) -> dict[str, dict[str, float]]:
    """Per entity type: precision, recall, F1 and the number of entities in the references (seqeval's report)."""
    report = entity_metrics.classification_report(references, predictions, output_dict=True, zero_division=0)
    return {
        name: {
            "precision": float(row["precision"]),
            "recall": float(row["recall"]),
            "f1": float(row["f1-score"]),
            "entities": int(row["support"]),
        }
        for name, row in report.items()
        if not name.endswith(" avg")
    }
