"""GLUE data sources: every task's files in the original formats, the hub (monkeypatched), custom CSV and JSON Lines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from finetune.data.task_files import read_task_split, task_file
from finetune.errors import InputError, UserError
from finetune.glue.specs import GLUE_TASKS, SUBMISSION_TASKS, predicted_with
from finetune.recipes import TaskConfig, task_config
from finetune.tasks.specs import task_spec

# ---------------------------------------------------------------------------------------------
# A GLUE root in download_glue_data.py's layout, each file in its original format
# ---------------------------------------------------------------------------------------------

MNLI_PREFIX = (
    "index",
    "promptID",
    "pairID",
    "genre",
    "sentence1_binary_parse",
    "sentence2_binary_parse",
    "sentence1_parse",
    "sentence2_parse",
    "sentence1",
    "sentence2",
)
STSB_PREFIX = ("index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2")
MRPC_COLUMNS = ("#1 ID", "#2 ID", "#1 String", "#2 String")

# Dev labels as the files write them; the end-to-end tests compute their expected scores from these.
DEV_LABELS = {
    "cola": ["1", "0", "1", "1"],
    "sst2": ["1", "0", "0", "1"],
    "mrpc": ["1", "0", "1", "1", "0"],
    "stsb": ["5.000", "3.800", "0.500", "2.250"],
    "qqp": ["0", "1", "0", "0"],
    "mnli": ["entailment", "neutral", "contradiction", "entailment"],
    "mnli-mm": ["neutral", "entailment", "entailment"],
    "qnli": ["entailment", "not_entailment", "not_entailment", "not_entailment"],
    "rte": ["entailment", "entailment", "entailment", "not_entailment"],
    "wnli": ["0", "1", "1"],
}
TEST_ROWS = {
    "cola": 3,
    "sst2": 4,
    "mrpc": 3,
    "stsb": 3,
    "qqp": 5,
    "mnli": 3,
    "mnli-mm": 2,
    "qnli": 3,
    "rte": 4,
    "wnli": 2,
    "ax": 3,
}
TRAIN_LABELS = {name: labels[:3] for name, labels in DEV_LABELS.items()}
TRAIN_LABELS["mnli-mm"] = TRAIN_LABELS["mnli"]  # one train.tsv for both


def _table(header: tuple[str, ...] | None, rows: list[tuple]) -> str:
    lines = (["\t".join(header)] if header else []) + ["\t".join(str(value) for value in row) for row in rows]
    return "\n".join(lines) + "\n"


def _pair(index: int) -> tuple[str, str]:
    # Stray quotes, as QQP and MNLI have them: they belong to the text.
    return f'The "first" sentence {index} .', f"A second one {index} 's ."


def _task_files(name: str) -> dict[str, str]:
    """File name -> content for one GLUE folder."""
    train, dev, tests = TRAIN_LABELS.get(name, []), DEV_LABELS.get(name, []), range(TEST_ROWS[name])
    if name == "cola":  # header-less train/dev: source, label, star (the original annotation), sentence
        files = {
            split: _table(
                None,
                [
                    ("gj04", label, "" if label == "1" else "*", f"Sentence {index} .")
                    for index, label in enumerate(labels)
                ],
            )
            for split, labels in (("train.tsv", train), ("dev.tsv", dev))
        }
        files["test.tsv"] = _table(("index", "sentence"), [(index, f"Test sentence {index} .") for index in tests])
        return files
    if name == "sst2":
        files = {
            split: _table(
                ("sentence", "label"), [(f"a film {index} 's charm . ", label) for index, label in enumerate(labels)]
            )
            for split, labels in (("train.tsv", train), ("dev.tsv", dev))
        }
        files["test.tsv"] = _table(("index", "sentence"), [(index, f"test film {index} .") for index in tests])
        return files
    if name == "mrpc":  # train/dev start with a byte-order mark
        files = {
            split: "\ufeff"
            + _table(
                ("Quality",) + MRPC_COLUMNS,
                [(label, 100 + index, 200 + index, *_pair(index)) for index, label in enumerate(labels)],
            )
            for split, labels in (("train.tsv", train), ("dev.tsv", dev))
        }
        files["test.tsv"] = _table(
            ("index",) + MRPC_COLUMNS, [(index, 300 + index, 400 + index, *_pair(index)) for index in tests]
        )
        return files
    if name == "stsb":

        def meta(index: int) -> tuple:
            return (index, "main-captions", "MSRvid", "2012test", f"{index:04d}", "none", "none", *_pair(index))

        files = {
            split: _table(STSB_PREFIX + ("score",), [meta(index) + (score,) for index, score in enumerate(labels)])
            for split, labels in (("train.tsv", train), ("dev.tsv", dev))
        }
        files["test.tsv"] = _table(STSB_PREFIX, [meta(index) for index in tests])
        return files
    if name == "qqp":
        files = {
            split: _table(
                ("id", "qid1", "qid2", "question1", "question2", "is_duplicate"),
                [(1000 + index, 2 * index, 2 * index + 1, *_pair(index), label) for index, label in enumerate(labels)],
            )
            for split, labels in (("train.tsv", train), ("dev.tsv", dev))
        }
        files["test.tsv"] = _table(("id", "question1", "question2"), [(index, *_pair(index)) for index in tests])
        return files
    if name == "mnli":

        def prefix(index: int) -> tuple:
            first, second = _pair(index)
            return (
                index,
                31193 + index,
                f"{31193 + index}n",
                "government",
                f"( ( {first} ) )",
                f"( {second} )",
                f"(ROOT (S {first}))",
                f"(ROOT (S {second}))",
                first,
                second,
            )

        matched, mismatched = DEV_LABELS["mnli"], DEV_LABELS["mnli-mm"]
        dev_header = MNLI_PREFIX + ("label1", "label2", "label3", "label4", "label5", "gold_label")
        return {
            "train.tsv": _table(
                MNLI_PREFIX + ("label1", "gold_label"),
                [prefix(index) + (label, label) for index, label in enumerate(TRAIN_LABELS["mnli"])],
            ),
            "dev_matched.tsv": _table(
                dev_header, [prefix(index) + (label,) * 6 for index, label in enumerate(matched)]
            ),
            "dev_mismatched.tsv": _table(
                dev_header, [prefix(index) + (label,) * 6 for index, label in enumerate(mismatched)]
            ),
            "test_matched.tsv": _table(MNLI_PREFIX, [prefix(index) for index in range(TEST_ROWS["mnli"])]),
            "test_mismatched.tsv": _table(MNLI_PREFIX, [prefix(index) for index in range(TEST_ROWS["mnli-mm"])]),
        }
    if name == "ax":  # no labels: the leaderboard keeps them
        return {
            "diagnostic.tsv": _table(("index", "sentence1", "sentence2"), [(index, *_pair(index)) for index in tests])
        }
    columns = ("question", "sentence") if name == "qnli" else ("sentence1", "sentence2")  # qnli, rte, wnli
    files = {
        split: _table(
            ("index",) + columns + ("label",), [(index, *_pair(index), label) for index, label in enumerate(labels)]
        )
        for split, labels in (("train.tsv", train), ("dev.tsv", dev))
    }
    files["test.tsv"] = _table(("index",) + columns, [(index, *_pair(index)) for index in tests])
    return files


def write_glue_root(root: Path, skip: tuple[str, ...] = ()) -> Path:
    """Every GLUE folder (CoLA ... WNLI, diagnostic) with small files; `skip` leaves tasks' folders out."""
    for spec in GLUE_TASKS.values():
        if spec.name in skip or (spec.predicted_by == "mnli" and spec.name != "ax"):  # mnli-mm lives in MNLI/
            continue
        folder = root / spec.glue_folder
        folder.mkdir(parents=True, exist_ok=True)
        for file_name, content in _task_files(spec.name).items():
            (folder / file_name).write_text(content, encoding="utf-8")
    return root


@pytest.fixture
def glue_root(tmp_path: Path) -> Path:
    return write_glue_root(tmp_path / "glue")


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------


def test_table_has_every_glue_task_and_eleven_submission_files():
    assert list(GLUE_TASKS) == ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "mnli-mm", "qnli", "rte", "wnli", "ax"]
    assert [spec.submission_file for spec in SUBMISSION_TASKS] == [
        "CoLA.tsv",
        "SST-2.tsv",
        "MRPC.tsv",
        "STS-B.tsv",
        "QQP.tsv",
        "MNLI-m.tsv",
        "MNLI-mm.tsv",
        "QNLI.tsv",
        "RTE.tsv",
        "WNLI.tsv",
        "AX.tsv",
    ]
    assert all(spec.glue_folder and spec.hub and spec.test_rows for spec in SUBMISSION_TASKS)
    assert GLUE_TASKS["stsb"].submission_range == (0.0, 5.0)


def test_tasks_predicted_by_another_model_share_its_labels():
    assert [spec.name for spec in predicted_with("mnli")] == ["mnli", "mnli-mm", "ax"]
    assert [spec.name for spec in predicted_with("rte")] == ["rte"]
    for spec in GLUE_TASKS.values():
        if spec.predicted_by:
            assert spec.labels == GLUE_TASKS[spec.predicted_by].labels


# ---------------------------------------------------------------------------------------------
# GLUE folders
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(GLUE_TASKS))
def test_every_task_reads_every_split(glue_root, name):
    spec = GLUE_TASKS[name]
    for split in spec.files:
        examples = read_task_split(spec, glue_root / spec.glue_folder, split)
        if split == "test":
            assert examples.labels is None and len(examples.texts) == TEST_ROWS[name]
            assert examples.ids == [str(index) for index in range(TEST_ROWS[name])]  # the file's own index column
            continue
        labels = (TRAIN_LABELS if split == "train" else DEV_LABELS)[name]
        if spec.is_regression:
            assert examples.labels.tolist() == pytest.approx([float(label) for label in labels])
        else:
            assert [spec.labels[index] for index in examples.labels] == labels
        assert all(len(text) == len(spec.text_columns) for text in examples.texts)


def test_quotes_and_parse_columns_do_not_leak_into_the_texts(glue_root):
    mnli = read_task_split(GLUE_TASKS["mnli"], glue_root / "MNLI", "dev")
    assert mnli.texts[0] == ('The "first" sentence 0 .', "A second one 0 's .")
    mrpc = read_task_split(GLUE_TASKS["mrpc"], glue_root / "MRPC", "train")  # BOM before Quality
    assert mrpc.labels.tolist() == [1, 0, 1]
    qqp = read_task_split(GLUE_TASKS["qqp"], glue_root / "QQP", "dev")
    assert qqp.ids == ["1000", "1001", "1002", "1003"]  # the id column, also in train/dev
    cola = read_task_split(GLUE_TASKS["cola"], glue_root / "CoLA", "dev")
    assert cola.texts[1] == ("Sentence 1 .",) and cola.ids == ["0", "1", "2", "3"]


def test_mnli_test_file_without_gold_label(glue_root):
    examples = read_task_split(GLUE_TASKS["mnli-mm"], glue_root / "MNLI", "test")
    assert examples.labels is None and len(examples.texts) == 2


def test_diagnostic_file(glue_root):
    examples = read_task_split(GLUE_TASKS["ax"], glue_root / "diagnostic", "test")
    assert examples.labels is None and examples.ids == ["0", "1", "2"]
    with pytest.raises(UserError, match="no split 'dev'"):
        read_task_split(GLUE_TASKS["ax"], glue_root / "diagnostic", "dev")


def test_malformed_mnli_row_names_file_and_line(glue_root):
    path = glue_root / "MNLI" / "dev_matched.tsv"
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[3] = lines[3].rsplit("\t", 1)[0]  # a row with one column less
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(UserError) as info:
        read_task_split(GLUE_TASKS["mnli"], glue_root / "MNLI", "dev")
    assert str(path) in str(info.value) and "line 4" in str(info.value) and "found 15" in str(info.value)


def test_empty_file(tmp_path):
    (tmp_path / "dev.tsv").write_text("", encoding="utf-8")
    with pytest.raises(UserError, match="no examples"):
        read_task_split(GLUE_TASKS["rte"], tmp_path, "dev")


@pytest.mark.parametrize("score", ["nan", "NaN", "inf", "-Infinity", "1e999", "4e38"])
def test_stsb_score_that_is_not_a_finite_number_names_file_line_and_value(glue_root, score):
    """NaN and inf would end training as 'diverged' and write NaN into result.json; 4e38 is inf as float32."""
    path = glue_root / "STS-B" / "dev.tsv"
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[2] = lines[2].rsplit("\t", 1)[0] + "\t" + score
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(UserError) as info:
        read_task_split(GLUE_TASKS["stsb"], glue_root / "STS-B", "dev")
    assert f"{path} line 3: label '{score}' is not a finite number" in str(info.value)


def test_header_naming_a_column_twice_is_refused(tmp_path):
    (tmp_path / "train.tsv").write_text("sentence\tsentence\tlabel\nfine\tgood\t1\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"train.tsv line 1: column 'sentence' appears 2 times in the header"):
        read_task_split(GLUE_TASKS["sst2"], tmp_path, "train")


@pytest.mark.parametrize("file_format", ["tsv", "csv"])
def test_field_past_the_csv_size_limit_names_its_line(tmp_path, file_format):
    separator = "\t" if file_format == "tsv" else ","
    rows = [f"text{separator}stars", f"ok{separator}good", f"{'x' * 200_000}{separator}good", f"ok{separator}bad"]
    path = tmp_path / f"train.{file_format}"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(UserError) as info:
        read_task_split(task_spec(custom(tmp_path, format=file_format, files={"train": path.name})), tmp_path, "train")
    assert f"{path} line 3: a field longer than 131,072 characters" in str(info.value)


# ---------------------------------------------------------------------------------------------
# The hub, with `datasets.load_dataset` replaced by a small in-memory dataset
# ---------------------------------------------------------------------------------------------


def test_hub_labels_map_to_the_task_label_strings(fake_hub):
    spec = task_spec(task_config(name="mnli", source="hub"))
    examples = read_task_split(spec, None, "dev")
    assert [spec.labels[index] for index in examples.labels] == ["entailment", "neutral", "contradiction"]
    assert examples.texts[1] == ("premise 1", "hypothesis 1")
    mismatched = read_task_split(task_spec(task_config(name="mnli-mm", source="hub")), None, "dev")
    assert [spec.labels[index] for index in mismatched.labels] == ["contradiction", "contradiction"]
    rte = read_task_split(task_spec(task_config(name="rte", source="hub")), None, "dev")
    assert [GLUE_TASKS["rte"].labels[index] for index in rte.labels] == ["not_entailment", "entailment", "entailment"]
    assert fake_hub[0] == ("nyu-mll/glue", "mnli")


def test_hub_test_splits_are_unlabeled_with_their_idx(fake_hub):
    test = read_task_split(task_spec(task_config(name="mnli", source="hub")), None, "test")
    assert test.labels is None and test.ids == ["7", "8"]
    stsb = task_spec(task_config(name="stsb", source="hub"))
    assert read_task_split(stsb, None, "test").labels is None
    dev = read_task_split(stsb, None, "dev")
    assert dev.labels.dtype == np.float32 and dev.labels.tolist() == [4.5, 0.25]


def test_hub_failure_is_one_line(fake_hub):
    with pytest.raises(UserError) as info:
        read_task_split(task_spec(task_config(name="cola", source="hub")), None, "dev")
    message = str(info.value)
    assert "cola" in message and "nyu-mll/glue" in message and "Couldn't reach" in message and "\n" not in message


def test_task_config_sources():
    with pytest.raises(ValueError, match="data_dir is required"):
        task_config(name="rte")
    with pytest.raises(ValueError, match="not both"):
        task_config(name="rte", source="hub", data_dir=".")
    with pytest.raises(ValueError, match="custom task"):
        task_config(name="mine", source="hub", text_columns=["a"], label_column="b")
    with pytest.raises(ValueError, match="remove format"):
        task_config(name="rte", data_dir=".", format="csv")


# ---------------------------------------------------------------------------------------------
# Custom tasks: CSV and JSON Lines
# ---------------------------------------------------------------------------------------------


def custom(tmp_path: Path, **keys) -> TaskConfig:
    return task_config(
        name="reviews", data_dir=tmp_path, text_columns=["text"], label_column="stars", labels=["bad", "good"], **keys
    )


def test_csv_with_quoted_commas(tmp_path):
    (tmp_path / "train.csv").write_text(
        'id,text,stars\n1,"fine, really",good\n2,"a ""quoted"" word",bad\n', encoding="utf-8"
    )
    spec = task_spec(custom(tmp_path, format="csv", index_column="id"))
    examples = read_task_split(spec, tmp_path, "train")
    assert examples.texts == [("fine, really",), ('a "quoted" word',)]
    assert examples.labels.tolist() == [1, 0] and examples.ids == ["1", "2"]


def test_csv_malformed_row_names_file_and_line(tmp_path):
    path = tmp_path / "dev.csv"
    path.write_text("text,stars\nok,good\nno label here\nok,bad\n", encoding="utf-8")
    with pytest.raises(UserError) as info:
        read_task_split(task_spec(custom(tmp_path, format="csv")), tmp_path, "dev")
    assert str(path) in str(info.value) and "line 3" in str(info.value) and "comma-separated" in str(info.value)
    path.write_text("text,stars\nok,good\nok,great\n", encoding="utf-8")
    with pytest.raises(UserError, match="line 3: label 'great'"):
        read_task_split(task_spec(custom(tmp_path, format="csv")), tmp_path, "dev")


def test_jsonl_by_extension(tmp_path):
    (tmp_path / "train.jsonl").write_text(
        '{"text": "fine", "stars": "good", "index": 4}\n\n{"text": "poor", "stars": "bad", "index": 9}\n',
        encoding="utf-8",
    )
    spec = task_spec(custom(tmp_path, files={"train": "train.jsonl"}))
    examples = read_task_split(spec, tmp_path, "train")
    assert examples.texts == [("fine",), ("poor",)] and examples.labels.tolist() == [1, 0]
    assert examples.ids == ["4", "9"]


def test_jsonl_numeric_labels_and_unlabeled_test(tmp_path):
    config = task_config(
        name="binary", data_dir=tmp_path, text_columns=["a", "b"], label_column="y", labels=["0", "1"], format="jsonl"
    )
    (tmp_path / "dev.jsonl").write_text('{"a": "x", "b": "y", "y": 1}\n{"a": "x", "b": "z", "y": 0}\n')
    (tmp_path / "test.jsonl").write_text('{"a": "x", "b": "y"}\n')
    spec = task_spec(config)
    assert read_task_split(spec, tmp_path, "dev").labels.tolist() == [1, 0]
    assert read_task_split(spec, tmp_path, "test").labels is None


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('{"text": "ok", "stars": "good"', "invalid JSON"),
        ('{"stars": "good"}', "missing key(s) text"),
        ('{"text": "ok"}', "missing key stars"),
        ('{"text": 3, "stars": "good"}', "text is not a string"),
        ('["ok", "good"]', "expected a JSON object"),
        ('{"text": "ok", "stars": true}', "label 'True'"),
    ],
)
def test_jsonl_malformed_line_names_file_and_line(tmp_path, line, fragment):
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "fine", "stars": "good"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(UserError) as info:
        read_task_split(task_spec(custom(tmp_path, format="jsonl")), tmp_path, "train")
    assert str(path) in str(info.value) and "line 2" in str(info.value) and fragment in str(info.value)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_jsonl_score_that_is_not_a_finite_number(tmp_path, literal):
    """Python's json reads NaN and Infinity literals: a JSON Lines score is checked as a TSV one is."""
    config = task_config(
        name="scores",
        data_dir=tmp_path,
        text_columns=["text"],
        label_column="score",
        metrics=["pearson"],
        format="jsonl",
    )
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "fine", "score": 4.5}\n{"text": "odd", "score": ' + literal + "}\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"train.jsonl line 2: label '.*' is not a finite number"):
        read_task_split(task_spec(config), tmp_path, "train")


def test_unknown_extension(tmp_path):
    (tmp_path / "train.txt").write_text("text\tstars\nok\tgood\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"unknown file type '.txt'"):
        read_task_split(task_spec(custom(tmp_path, files={"train": "train.txt"})), tmp_path, "train")
    # An explicit format reads any extension.
    spec = task_spec(custom(tmp_path, files={"train": "train.txt"}, format="tsv"))
    assert read_task_split(spec, tmp_path, "train").labels.tolist() == [1]


# ---------------------------------------------------------------------------------------------
# Custom tasks: files found by what is there, labels as the files write them, several text columns
# ---------------------------------------------------------------------------------------------


def news(tmp_path: Path, **keys) -> TaskConfig:
    """A news task: numeric labels 1-4, Title and Description columns, no format key."""
    return task_config(
        **{"name": "news", "data_dir": tmp_path, "label_column": "Class", "labels": [1, 2, 3, 4], **keys}
    )


NEWS_CSV = 'Class,Title,Description\n3,"Stocks up, again",Markets rose.\n1,Vote today,"Polls open, early."\n'


def test_split_files_are_found_by_extension_and_two_candidates_are_refused(tmp_path):
    (tmp_path / "train.csv").write_text(NEWS_CSV, encoding="utf-8")
    (tmp_path / "dev.jsonl").write_text('{"Class": 2, "Title": "Goal", "Description": "A late one."}\n')
    spec = task_spec(news(tmp_path, text_columns=["Title"]))
    assert read_task_split(spec, tmp_path, "train").texts == [("Stocks up, again",), ("Vote today",)]
    assert read_task_split(spec, tmp_path, "dev").labels.tolist() == [1]
    with pytest.raises(UserError, match=r"no test file in .* \(looked for test.tsv, test.csv, test.jsonl\)$"):
        read_task_split(spec, tmp_path, "test")
    (tmp_path / "train.tsv").write_text("Class\tTitle\n1\tx\n", encoding="utf-8")
    with pytest.raises(UserError) as info:
        read_task_split(spec, tmp_path, "train")
    assert f"{tmp_path / 'train.csv'} and {tmp_path / 'train.tsv'} are both train files" in str(info.value)
    # A format (or files) names the file as before: only train.tsv is read.
    assert read_task_split(
        task_spec(news(tmp_path, text_columns=["Title"], format="tsv")), tmp_path, "train"
    ).texts == [("x",)]


def test_numbers_and_booleans_in_labels_are_the_files_text(tmp_path):
    assert news(tmp_path, text_columns=["Title"]).labels == ["1", "2", "3", "4"]
    flags = task_config(name="flags", data_dir=tmp_path, text_columns=["t"], label_column="y", labels=[True, False])
    assert flags.labels == ["true", "false"]
    (tmp_path / "train.jsonl").write_text('{"t": "a", "y": false}\n{"t": "b", "y": "true"}\n')
    assert read_task_split(task_spec(flags), tmp_path, "train").labels.tolist() == [1, 0]
    (tmp_path / "dev.csv").write_text("t,y\na,True\n")  # what pandas writes
    with pytest.raises(UserError, match=r"label 'True' is not one of true, false .*write 'True' in task.labels"):
        read_task_split(task_spec(flags), tmp_path, "dev")
    with pytest.raises(ValueError, match=r"1.0 is a decimal number.*quote the label"):
        news(tmp_path, text_columns=["Title"], labels=[1.0, 2.0])
    with pytest.raises(ValueError, match="'1' is listed twice"):
        news(tmp_path, text_columns=["Title"], labels=[1, "1"])


def test_label_names_rename_the_classes_and_the_files_keep_their_labels(tmp_path):
    (tmp_path / "train.csv").write_text(NEWS_CSV, encoding="utf-8")
    spec = task_spec(news(tmp_path, text_columns=["Title"], label_names={1: "World", 3: "Business"}))
    assert spec.labels == ("World", "2", "Business", "4")  # what reports, predictions and id2label show
    assert read_task_split(spec, tmp_path, "train").labels.tolist() == [2, 0]
    with pytest.raises(ValueError, match=r"label_names: '5' is not one of the labels \(1, 2, 3, 4\)"):
        news(tmp_path, text_columns=["Title"], label_names={5: "Other"})
    with pytest.raises(ValueError, match="label_names: two labels would both be called '2'"):
        news(tmp_path, text_columns=["Title"], label_names={1: "2"})


def test_text_columns_are_a_pair_joined_or_a_template(tmp_path):
    (tmp_path / "train.csv").write_text(NEWS_CSV, encoding="utf-8")

    def texts(**keys):
        return read_task_split(task_spec(news(tmp_path, **keys)), tmp_path, "train").texts[0]

    assert texts(text_columns=["Title", "Description"]) == ("Stocks up, again", "Markets rose.")  # a pair
    assert texts(text_columns=["Title", "Description"], pair=False) == ("Stocks up, again Markets rose.",)
    assert texts(text_columns=["Class", "Title", "Description"]) == ("3 Stocks up, again Markets rose.",)
    assert texts(text="{Title}. {Description}") == ("Stocks up, again. Markets rose.",)
    with pytest.raises(ValueError, match="pair: true needs 2 text_columns, not 3"):
        news(tmp_path, text_columns=["Class", "Title", "Description"], pair=True)
    with pytest.raises(ValueError, match="text names the columns Title, Body, text_columns Title"):
        news(tmp_path, text="{Title}: {Body}", text_columns=["Title"])
    with pytest.raises(UserError, match=r"train.csv: missing column\(s\) Body"):
        texts(text="{Title}: {Body}")


def test_task_file_without_a_folder_is_an_input_error():
    # task_file takes the recipe's optional data_dir: None is a one-line error, not a TypeError from Path(None)
    with pytest.raises(InputError, match="no data folder to read its dev file from"):
        task_file(GLUE_TASKS["rte"], None, "dev")
