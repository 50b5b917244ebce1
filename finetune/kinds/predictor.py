"""What `finetune predict` and `finetune.predict` ask of a fine-tuned checkpoint of any kind (`TaskKind.predictor`
gives one): its task, its predictions for inputs of its kind, and the output rows for a file of them.

Each kind's predictor (kinds/K/predictor.py) subclasses `TaskPredictor`, or `TextPredictor` where its inputs are the
task's text columns (classification, regression, multilabel, tagging, question answering): those read a table (.tsv,
.csv, .jsonl: the text columns by name, any other column ignored) or plain text, one example per line (several text
columns: separated by tabs, in the task's column order). A kind that reads a layout of its own (ARC's questions)
overrides `predict_source`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, TextIO

from finetune.data.examples import TaskExamples
from finetune.data.unlabelled_text import is_table, plain_lines, read_unlabelled_file
from finetune.errors import UserError
from finetune.kinds.dev_split import dev_examples
from finetune.tasks.specs import TaskSpec

STDIO = "-"  # --input and --output: standard input and output


class TaskPredictor(ABC):
    """A fine-tuned checkpoint of some kind, ready to predict."""

    spec: TaskSpec  # its task, as its finetune_recipe.yaml says (a tagger's labels: its tags)
    # Why its predictions are written as JSON Lines only (a .tsv or .csv --output is refused before any input is
    # read); None: JSON Lines, TSV or CSV (TaskKind.output_table gives the table's columns).
    json_lines_only: ClassVar[str | None] = None

    @abstractmethod
    def predict(self, inputs: Sequence[Any]) -> list[dict]:
        """One result per input: a text, a tuple of the task's texts, a question; each kind says which."""

    @abstractmethod
    def predict_source(self, source: str, stdin: TextIO) -> list[dict]:
        """The output rows for a file, or `-`: standard input; one per example, in the input's order."""

    def dev_inputs(self, task: Any, checkpoint: Path) -> list:
        """The dev rows `checkpoint` was scored on, as `predict` takes them: what `finetune bench` times when given
        no inputs."""
        return predict_inputs(dev_examples(self.spec, task, [checkpoint]))


def predict_inputs(examples: TaskExamples) -> list:
    """Examples as `predict` takes them: each a text, or a tuple of the task's texts."""
    return [texts[0] if len(texts) == 1 else tuple(texts) for texts in examples.texts]


class TextPredictor(TaskPredictor):
    """A predictor whose inputs are the task's text columns; each output row holds them beside the result."""

    # Why it reads plain text only (a table --input is refused); None: tables too.
    plain_text_only: ClassVar[str | None] = None

    @abstractmethod
    def predict_examples(self, examples: TaskExamples) -> list[dict]:
        """Results for examples already read (the texts of the task's columns, in its column order)."""

    def predict_source(self, source: str, stdin: TextIO) -> list[dict]:
        examples = self.read_source(source, stdin)
        results = self.predict_examples(examples)
        columns = self.spec.text_columns
        return [{**dict(zip(columns, texts)), **result} for texts, result in zip(examples.texts, results)]

    def read_source(self, source: str, stdin: TextIO) -> TaskExamples:
        """Examples from a file (or `-`: stdin, plain lines); tables by extension, anything else one text per line
        (data/unlabelled_text.py). Their texts are the text columns as they are (output rows show them), not yet
        what the model reads."""
        if source == STDIO:
            return plain_lines(stdin, "<stdin>", self.spec)
        path = Path(source)
        if not path.is_file():
            raise UserError(f"--input: no such file: {path}")
        if is_table(path) and self.plain_text_only is not None:
            raise UserError(f"--input: {path}: {self.plain_text_only}")
        return read_unlabelled_file(path, self.spec)
