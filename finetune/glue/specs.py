"""GLUE's task table: one TaskSpec (finetune/tasks/specs.py) per GLUE task, the archive's files and the tasks a
model also predicts.

Column names follow the original GLUE TSV files (the layout of `download_glue_data.py`); the hub
columns and label order are those of the `nyu-mll/glue` dataset.
"""

from __future__ import annotations

from finetune.tasks.specs import REGRESSION_PROBLEM, HubSource, TaskSpec

HUB_DATASET = "nyu-mll/glue"

_BINARY = ("0", "1")
_NLI = ("contradiction", "entailment", "neutral")
_HUB_NLI = ("entailment", "neutral", "contradiction")  # the hub numbers MNLI's classes in this order
_ENTAILMENT = ("entailment", "not_entailment")
_PAIR = ("sentence1", "sentence2")
_PREMISE_HYPOTHESIS = ("premise", "hypothesis")

GLUE_TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in [
        TaskSpec(
            "cola",
            ("sentence",),
            "label",
            _BINARY,
            ("mcc", "accuracy"),
            headerless_columns=dict.fromkeys(("train", "dev"), ("source", "label", "star", "sentence")),
            glue_folder="CoLA",
            hub=HubSource("cola", ("sentence",)),
            submission_file="CoLA.tsv",
            test_rows=1063,
        ),
        TaskSpec(
            "sst2",
            ("sentence",),
            "label",
            _BINARY,
            ("accuracy",),
            glue_folder="SST-2",
            hub=HubSource("sst2", ("sentence",)),
            submission_file="SST-2.tsv",
            test_rows=1821,
        ),
        TaskSpec(
            "mrpc",
            ("#1 String", "#2 String"),
            "Quality",
            _BINARY,
            ("f1", "accuracy"),
            glue_folder="MRPC",
            hub=HubSource("mrpc", _PAIR),
            submission_file="MRPC.tsv",
            test_rows=1725,
        ),
        TaskSpec(
            "stsb",
            _PAIR,
            "score",
            None,
            ("pearson", "spearman"),
            glue_folder="STS-B",
            hub=HubSource("stsb", _PAIR),
            submission_file="STS-B.tsv",
            submission_range=(0.0, 5.0),
            test_rows=1379,
            kind="regression",
            problem_type=REGRESSION_PROBLEM,
        ),
        TaskSpec(
            "qqp",
            ("question1", "question2"),
            "is_duplicate",
            _BINARY,
            ("f1", "accuracy"),
            index_column="id",
            glue_folder="QQP",
            hub=HubSource("qqp", ("question1", "question2")),
            submission_file="QQP.tsv",
            test_rows=390965,
        ),
        TaskSpec(
            "mnli",
            _PAIR,
            "gold_label",
            _NLI,
            ("accuracy",),
            files={"train": "train.tsv", "dev": "dev_matched.tsv", "test": "test_matched.tsv"},
            glue_folder="MNLI",
            submission_file="MNLI-m.tsv",
            test_rows=9796,
            hub=HubSource(
                "mnli",
                _PREMISE_HYPOTHESIS,
                {"train": "train", "dev": "validation_matched", "test": "test_matched"},
                _HUB_NLI,
            ),
        ),
        TaskSpec(
            "mnli-mm",
            _PAIR,
            "gold_label",
            _NLI,
            ("accuracy",),
            files={"train": "train.tsv", "dev": "dev_mismatched.tsv", "test": "test_mismatched.tsv"},
            glue_folder="MNLI",
            predicted_by="mnli",
            submission_file="MNLI-mm.tsv",
            test_rows=9847,
            hub=HubSource(
                "mnli",
                _PREMISE_HYPOTHESIS,
                {"train": "train", "dev": "validation_mismatched", "test": "test_mismatched"},
                _HUB_NLI,
            ),
        ),
        TaskSpec(
            "qnli",
            ("question", "sentence"),
            "label",
            _ENTAILMENT,
            ("accuracy",),
            glue_folder="QNLI",
            hub=HubSource("qnli", ("question", "sentence")),
            submission_file="QNLI.tsv",
            test_rows=5463,
        ),
        TaskSpec(
            "rte",
            _PAIR,
            "label",
            _ENTAILMENT,
            ("accuracy",),
            glue_folder="RTE",
            hub=HubSource("rte", _PAIR),
            submission_file="RTE.tsv",
            test_rows=3000,
        ),
        TaskSpec(
            "wnli",
            _PAIR,
            "label",
            _BINARY,
            ("accuracy",),
            glue_folder="WNLI",
            hub=HubSource("wnli", _PAIR),
            submission_file="WNLI.tsv",
            test_rows=146,
        ),
        # The diagnostic set has no training data and no public labels: the MNLI model predicts it.
        TaskSpec(
            "ax",
            _PAIR,
            "label",
            _NLI,
            ("mcc",),
            files={"test": "diagnostic.tsv"},
            glue_folder="diagnostic",
            predicted_by="mnli",
            submission_file="AX.tsv",
            test_rows=1104,
            hub=HubSource("ax", _PREMISE_HYPOTHESIS, {"test": "test"}, _HUB_NLI),
        ),
    ]
}

# The 11 files of an archive, each with its task
SUBMISSION_FILES: dict[str, TaskSpec] = {
    spec.submission_file: spec for spec in GLUE_TASKS.values() if spec.submission_file
}
SUBMISSION_TASKS = list(SUBMISSION_FILES.values())


def predicted_with(name: str) -> list[TaskSpec]:
    """The GLUE task and those its model also predicts (mnli: mnli, mnli-mm and ax)."""
    return [GLUE_TASKS[name]] + [spec for spec in GLUE_TASKS.values() if spec.predicted_by == name]
