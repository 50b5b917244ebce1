"""`finetune predict CHECKPOINT`: labels and probabilities (or scores) of a fine-tuned checkpoint for raw text.

The checkpoint's own finetune_recipe.yaml says what it reads and predicts: the task's text columns (one, two for a
pair task, or the columns its `task.text` template or `pair: false` makes one text of), its labels,
`task.max_length` and `task.long_documents` (head_tail or chunks read a long text as it was trained). Input is
either plain text, one example per line (several text columns: separated by tabs, in the task's column order), or a
TSV / CSV / JSON Lines file holding the text columns by name (other columns, a label column included, are ignored).
Examples are batched longest first like `finetune eval`, with a progress bar on long input; outputs keep the input's
order.

Output rows: the input's texts, `label` and `probabilities` (one per label, in label order) for classification,
`score` for regression, `labels` (those above the checkpoint's saved decision threshold) and `probabilities` for a
multi-label classifier, `words` and their `tags` for a tagger (task kind tokens: plain text, a sentence per line),
`id`, `label` (the chosen choice's) and `probabilities` (per choice label) for a multiple-choice model (task kind
choices: JSON Lines in ARC's layout, answerKey not needed, output JSON Lines only); `answer`, `score`, `start` and
`end` (characters of the context) for question answering (task kind spans: a question and its context per row:
JSON Lines, TSV / CSV with those columns, or plain lines `question<TAB>context`); as JSON Lines (the default, and on
stdout) or as TSV / CSV by the output file's extension. A file is written under
a temporary name and renamed when complete.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import torch

from finetune.data.choices import ChoiceQuestions, parse_choices, read_choices
from finetune.data.long_documents import DocumentReading
from finetune.data.spans import Question, SpanReading, SquadQuestions
from finetune.data.tagging import TaggedSentences
from finetune.data.tasks import FORMAT_BY_EXTENSION, TaskExamples, first_undecodable_line, read_examples_file
from finetune.errors import UserError, recipe_key
from finetune.glue.specs import TaskSpec, task_spec
from finetune.inference.predict import example_logits
from finetune.models.choices import load_finetuned_choice_model
from finetune.models.heads import load_finetuned
from finetune.models.hub import load_tokenizer, resolve_checkpoint
from finetune.models.multilabel import DEFAULT_THRESHOLD, load_finetuned_multilabel, saved_threshold
from finetune.models.question_answering import load_finetuned_qa
from finetune.models.taggers import load_finetuned_tagger, model_tags
from finetune.training.checkpoints import HYPERPARAMETERS_FILE
from finetune.training.choices import choose
from finetune.training.multilabel import label_probabilities, label_sets
from finetune.training.spans import answer_questions, span_max_length
from finetune.training.tagging import tag_sentences

NO_LABEL_COLUMN = "\0"  # a column no file has: predict ignores labels in its input
STDIO = "-"


@dataclass
class Predictor:
    """A fine-tuned checkpoint ready to predict: its model, tokenizer, task and how it reads an example."""

    model: torch.nn.Module
    tokenizer: object
    spec: TaskSpec
    reading: DocumentReading  # task.max_length and task.long_documents, as the checkpoint was trained
    batch_size: int = 64

    def predict(self, texts: Sequence[str | Sequence[str]]) -> list[dict]:
        """One result per example: {"label", "probabilities"} or {"score"}; a task of several text columns takes a
        tuple of its columns' texts."""
        examples = TaskExamples(
            [self._example(text, index) for index, text in enumerate(texts)],
            None,
            [str(index) for index in range(len(texts))],
        )
        return self.predict_examples(examples)

    def predict_examples(self, examples: TaskExamples) -> list[dict]:
        """Results for examples already read (the texts of the task's columns, in its column order)."""
        if not examples.texts:
            return []
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=not torch.cuda.is_available())
        examples = replace(examples, texts=[self.spec.model_texts(texts) for texts in examples.texts])
        logits = example_logits(
            accelerator, self.model, self.tokenizer, examples, self.reading, self.batch_size, name="input"
        )
        labels = self.spec.labels
        if labels is None:  # regression (spec.is_regression)
            return [{"score": float(value)} for value in logits[:, 0]]
        probabilities = torch.softmax(torch.from_numpy(logits).double(), dim=-1).numpy()
        return [
            {"label": labels[int(row.argmax())], "probabilities": {label: float(p) for label, p in zip(labels, row)}}
            for row in probabilities
        ]

    def _example(self, text: str | Sequence[str], index: int) -> tuple[str, ...]:
        columns = self.spec.text_columns
        parts = (text,) if isinstance(text, str) else tuple(text)
        if len(parts) != len(columns) or not all(isinstance(part, str) for part in parts):
            raise UserError(
                f"example {index}: task '{self.spec.name}' reads {len(columns)} text(s) "
                f"({', '.join(columns)}), got {parts!r:.80}"
            )
        return parts


@dataclass
class MultilabelPredictor(Predictor):
    """A fine-tuned multi-label classifier ready to predict: the labels above its saved threshold, and every label's
    probability (a sigmoid each)."""

    threshold: float = DEFAULT_THRESHOLD

    def predict_examples(self, examples: TaskExamples) -> list[dict]:
        """One result per example: {"labels": [...], "probabilities": {label: probability}}."""
        if not examples.texts:
            return []
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=not torch.cuda.is_available())
        examples = replace(examples, texts=[self.spec.model_texts(texts) for texts in examples.texts])
        probabilities = label_probabilities(
            example_logits(
                accelerator, self.model, self.tokenizer, examples, self.reading, self.batch_size, name="input"
            )
        )
        labels = self.spec.labels
        assert labels is not None  # a multi-label task's spec always has its label set (glue/specs.py)
        return [
            {"labels": predicted, "probabilities": {label: float(p) for label, p in zip(labels, row)}}
            for predicted, row in zip(label_sets(probabilities, labels, self.threshold), probabilities)
        ]


@dataclass
class TaggingPredictor:
    """A fine-tuned tagger (task kind tokens) ready to predict: a tag for every word of a sentence."""

    model: torch.nn.Module
    tokenizer: object
    spec: TaskSpec  # its labels: the tagger's tags
    max_length: int | None
    batch_size: int = 64

    def predict(self, texts: Sequence[str]) -> list[dict]:
        """One result per sentence: {"words", "tags"}, the words split at white space."""
        return self.predict_examples(
            TaskExamples([(text,) for text in texts], None, [str(index) for index in range(len(texts))])
        )

    def predict_examples(self, examples: TaskExamples) -> list[dict]:
        words = [text.split() for (text,) in examples.texts]
        if not any(words):
            return [{"words": [], "tags": []} for _ in words]
        sentences = TaggedSentences(
            [sentence or [""] for sentence in words], None, list(range(1, len(words) + 1)), Path("input")
        )
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        tags = tag_sentences(
            self.model, self.tokenizer, sentences, self.spec.labels, self.max_length, self.batch_size, device
        )
        return [{"words": sentence, "tags": predicted[: len(sentence)]} for sentence, predicted in zip(words, tags)]


@dataclass
class ChoicesPredictor:
    """A fine-tuned multiple-choice model (task kind choices) ready to predict: the right choice of a question."""

    model: torch.nn.Module
    tokenizer: object
    spec: TaskSpec
    max_length: int | None
    batch_size: int = 64

    def predict(self, questions: Sequence[dict]) -> list[dict]:
        """One result per question in ARC's layout ({"id", "question": {"stem", "choices": [{"text", "label"}]}},
        answerKey not needed): {"id", "label", "probabilities"}."""
        lines = [json.dumps(question) for question in questions]
        return self.predict_questions(parse_choices(lines, Path("questions"), with_answers=False)) if lines else []

    def predict_questions(self, questions: ChoiceQuestions) -> list[dict]:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        probabilities = choose(self.model, self.tokenizer, questions, self.max_length, self.batch_size, device)
        return [
            {
                "id": question_id,
                "label": labels[int(row.argmax())],
                "probabilities": {label: float(p) for label, p in zip(labels, row)},
            }
            for question_id, labels, row in zip(questions.ids, questions.labels, probabilities)
        ]


@dataclass
class SpanPredictor:
    """A fine-tuned question-answering model ready to predict: an answer to a question from its context."""

    model: torch.nn.Module
    tokenizer: object
    spec: TaskSpec  # text columns question, context
    reading: SpanReading
    batch_size: int = 64

    def predict(self, texts: Sequence[Sequence[str]]) -> list[dict]:
        """One result per (question, context) pair: {"answer", "score", "start", "end"} (characters of the context;
        answer "" and start, end None for no answer)."""
        return self.predict_examples(
            TaskExamples([tuple(pair) for pair in texts], None, [str(index) for index in range(1, len(texts) + 1)])
        )

    def predict_examples(self, examples: TaskExamples) -> list[dict]:
        questions = SquadQuestions(
            [
                Question(identifier, question, context)
                for identifier, (question, context) in zip(examples.ids, examples.texts)
            ],
            Path("input"),
        )
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        answers = answer_questions(self.model, self.tokenizer, questions, self.reading, self.batch_size, device)
        return [answer.as_row() for answer in answers]


# What load_predictor returns, by the checkpoint's task kind: each takes its own kind of input.
AnyPredictor = Predictor | TaggingPredictor | ChoicesPredictor | SpanPredictor


def load_span_predictor(folder: str, recipe, spec: TaskSpec, batch_size: int, max_length: int | None) -> SpanPredictor:
    """The question-answering model of a checkpoint folder, read and answering as it was trained."""
    with recipe_key("CHECKPOINT"):
        model = load_finetuned_qa(folder, trust_remote_code=recipe.model.trust_remote_code)
        tokenizer = load_tokenizer(folder, trust_remote_code=recipe.model.trust_remote_code)
    length = span_max_length(max_length or recipe.task.max_length, model)
    return SpanPredictor(model, tokenizer, spec, SpanReading.of(recipe.task, length), batch_size)


def load_predictor(checkpoint: str, batch_size: int = 64, max_length: int | None = None) -> AnyPredictor:
    """The checkpoint with the task of its finetune_recipe.yaml (a local folder, or a hub name with a network)."""
    from finetune.models.heads import fitted_max_length
    from finetune.recipes import FinetuneRecipe, load_recipe

    with recipe_key("CHECKPOINT"):
        folder = resolve_checkpoint(checkpoint)
    # A hub name: only the recipe file is fetched here, the weights by transformers.
    recipe_file = Path(folder) / HYPERPARAMETERS_FILE if Path(folder).is_dir() else _hub_file(checkpoint)
    if recipe_file is None or not recipe_file.is_file():
        raise UserError(
            f"CHECKPOINT: {checkpoint} has no {HYPERPARAMETERS_FILE}: predict needs a checkpoint "
            "fine-tuned by finetune (the file names the task's text columns and labels)"
        )
    recipe = load_recipe(recipe_file, expected_stage="finetune", check_paths=False)
    assert isinstance(recipe, FinetuneRecipe)  # expected_stage: any other recipe is refused
    spec = task_spec(recipe.task)
    if spec.kind == "spans":
        return load_span_predictor(folder, recipe, spec, batch_size, max_length)
    trusted = recipe.model.trust_remote_code
    with recipe_key("CHECKPOINT"):
        if spec.kind in ("tokens", "choices"):  # their labels are in the checkpoint, not the recipe
            load_labelled = {"tokens": load_finetuned_tagger, "choices": load_finetuned_choice_model}[spec.kind]
            model = load_labelled(folder, trust_remote_code=trusted)
        else:
            load_for_task = load_finetuned_multilabel if spec.kind == "multilabel" else load_finetuned
            model = load_for_task(folder, spec, trust_remote_code=trusted)
        tokenizer = load_tokenizer(folder, trust_remote_code=trusted)
    if spec.kind == "tokens":
        return TaggingPredictor(
            model, tokenizer, replace(spec, labels=model_tags(model)), max_length or recipe.task.max_length, batch_size
        )
    if spec.kind == "choices":
        return ChoicesPredictor(model, tokenizer, spec, max_length or recipe.task.max_length, batch_size)
    reading = DocumentReading.of(
        fitted_max_length(max_length or recipe.task.max_length, model),
        recipe.task.long_documents,
        recipe.task.both_orders,
    )
    if spec.kind == "multilabel":
        return MultilabelPredictor(
            model, tokenizer, spec, reading, batch_size, saved_threshold(model) or DEFAULT_THRESHOLD
        )
    return Predictor(model, tokenizer, spec, reading, batch_size)


def _hub_file(repository: str) -> Path | None:
    """The recipe file of a hub repository (None when it has none); a hub that cannot be reached is a UserError."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return Path(hf_hub_download(repository, HYPERPARAMETERS_FILE))
    except EntryNotFoundError:
        return None
    except Exception as error:  # offline, unknown repository, no permission
        raise UserError(
            f"CHECKPOINT: cannot fetch {HYPERPARAMETERS_FILE} of {repository} from the hub ({type(error).__name__})"
        ) from None


# ---------------------------------------------------------------------------------------------
# Files in and out
# ---------------------------------------------------------------------------------------------


def read_input(source: str, spec: TaskSpec, stdin: TextIO | None = None) -> TaskExamples:
    """Examples from a file (or `-`: stdin, plain lines); tables by extension, anything else one text per line.
    Their texts are the text columns as they are (output rows show them), not yet what the model reads."""
    unlabelled = replace(
        spec, label_column=NO_LABEL_COLUMN, index_column=NO_LABEL_COLUMN, text_template=None, label_columns=None
    )
    if source == STDIO:
        return plain_lines(stdin or sys.stdin, "<stdin>", spec)
    path = Path(source)
    if not path.is_file():
        raise UserError(f"--input: no such file: {path}")
    file_format = FORMAT_BY_EXTENSION.get(path.suffix.lower())
    if file_format is not None and spec.kind == "tokens":
        raise UserError(f"--input: {path}: a tagger reads plain text, a sentence per line (words split at spaces)")
    if file_format is not None:
        return read_examples_file(unlabelled, path, file_format)
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            return plain_lines(handle, str(path), spec)
    except UnicodeDecodeError:
        raise UserError(f"{path} line {first_undecodable_line(path)}: not valid UTF-8") from None


def plain_lines(lines: Iterable[str], name: str, spec: TaskSpec) -> TaskExamples:
    """One example per non-empty line; the texts of several text columns separated by tabs."""
    texts, ids = [], []
    width = len(spec.text_columns)
    for number, line in enumerate(lines, start=1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        parts = tuple(line.split("\t")) if width > 1 else (line,)
        if len(parts) != width:
            raise UserError(
                f"{name} line {number}: task '{spec.name}' reads {width} tab-separated texts "
                f"({', '.join(spec.text_columns)}), found {len(parts)}"
            )
        texts.append(parts)
        ids.append(str(number))
    if not texts:
        raise UserError(f"{name}: no text to predict")
    return TaskExamples(texts, None, ids)


def output_rows(spec: TaskSpec, examples: TaskExamples, results: list[dict]) -> list[dict]:
    """Each result beside its input's texts."""
    return [{**dict(zip(spec.text_columns, texts)), **result} for texts, result in zip(examples.texts, results)]


def write_output(rows: list[dict], target: str, spec: TaskSpec, stdout: TextIO | None = None) -> None:
    """JSON Lines on stdout or to a .jsonl file; TSV/CSV with one probability column per label."""
    if target == STDIO:
        (stdout or sys.stdout).write(_render(rows, "jsonl", spec))
        return
    path = Path(target)
    file_format = FORMAT_BY_EXTENSION.get(path.suffix.lower())
    if file_format is None:
        raise UserError(f"--output: {path} must end in .jsonl, .tsv or .csv")
    if not path.parent.is_dir():
        raise UserError(f"--output: no such folder: {path.parent}")
    text = _render(rows, file_format, spec)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _render(rows: list[dict], file_format: str, spec: TaskSpec) -> str:
    if file_format == "jsonl":
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    if spec.kind == "spans":  # the question, its context, the answer and where it is
        columns = list(spec.text_columns) + ["answer", "score", "start", "end"]
    elif spec.kind == "tokens":  # the sentence, and its words' tags separated by spaces
        rows = [{**row, "tags": " ".join(row["tags"])} for row in rows]
        columns = list(spec.text_columns) + ["tags"]
    elif spec.kind == "multilabel":  # the predicted labels joined by the task's separator, a probability each
        assert spec.labels is not None  # a multi-label task's spec always has its label set (glue/specs.py)
        rows = [{**row, "labels": spec.label_separator.join(row["labels"])} for row in rows]
        columns = list(spec.text_columns) + ["labels"] + [f"probability_{label}" for label in spec.labels]
    else:
        columns = list(spec.text_columns) + (
            ["score"] if spec.labels is None else ["label"] + [f"probability_{label}" for label in spec.labels]
        )
    buffer = io.StringIO()
    writer = csv.writer(
        buffer, delimiter="\t" if file_format == "tsv" else ",", lineterminator="\n", quoting=csv.QUOTE_MINIMAL
    )
    writer.writerow(columns)
    for row in rows:
        flat = {**row, **{f"probability_{label}": p for label, p in row.get("probabilities", {}).items()}}
        writer.writerow([flat[column] for column in columns])
    return buffer.getvalue()


def run_predict(
    checkpoint: str, source: str = STDIO, target: str = STDIO, batch_size: int = 64, max_length: int | None = None
) -> int:
    """The CLI's work: read, predict, write; returns the number of examples."""
    predictor = load_predictor(checkpoint, batch_size, max_length)
    if isinstance(predictor, ChoicesPredictor):
        return predict_choices_file(predictor, source, target)
    examples = read_input(source, predictor.spec)
    write_output(output_rows(predictor.spec, examples, predictor.predict_examples(examples)), target, predictor.spec)
    return len(examples.texts)


def predict_choices_file(predictor: ChoicesPredictor, source: str, target: str) -> int:
    """Questions in ARC's layout (a .jsonl file, or `-`: standard input) to JSON Lines of predictions."""
    if target != STDIO and not target.lower().endswith(".jsonl"):
        raise UserError(
            f"--output: {target}: multiple-choice predictions (a probability per choice label) are "
            "written as JSON Lines (.jsonl)"
        )
    if source == STDIO:
        questions = parse_choices(sys.stdin.read().splitlines(), Path("<stdin>"), with_answers=False)
    elif not Path(source).is_file():
        raise UserError(f"--input: no such file: {source}")
    else:
        questions = read_choices(Path(source), with_answers=False)
    write_output(predictor.predict_questions(questions), target, predictor.spec)
    return len(questions.ids)


def predict(checkpoint: str, texts: Sequence[Any], batch_size: int = 64) -> list[dict]:
    """Predict raw texts with a fine-tuned checkpoint: one dict per text, {"label", "probabilities"} or {"score"}
    (a multiple-choice checkpoint takes question dicts in ARC's layout instead).

    A pair task takes (first, second) pairs. Loads the checkpoint on every call; for many calls keep
    `load_predictor(checkpoint)` and call its `predict`.
    """
    return load_predictor(checkpoint, batch_size).predict(list(texts))
