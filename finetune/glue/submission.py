"""Leaderboard submissions: one zip with a file per task at its root, written atomically, and a validator.

Each file is `index<TAB>prediction` with the test file's own index; file names, label strings and
the range of regression scores come from the task table.
"""

from __future__ import annotations

import math
import os
import zipfile
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from finetune.data.task_files import read_task_split
from finetune.errors import DataFileError, InputError
from finetune.glue.specs import SUBMISSION_FILES, SUBMISSION_TASKS
from finetune.tasks.specs import TaskSpec

HEADER = "index\tprediction"
DECIMALS = 3  # regression scores, as the leaderboard's sample submission writes them
PROBLEMS_PER_FILE = 5  # a broken file reports its first few bad rows, then a count


def submission_value(spec: TaskSpec, prediction) -> str:
    """What the leaderboard expects for one prediction: a label string, or a clipped score with 3 decimals."""
    if spec.labels is not None:  # a class index (not regression)
        return (spec.submission_labels or spec.labels)[int(prediction)]
    value = float(prediction)
    if spec.submission_range is not None:
        value = min(max(value, spec.submission_range[0]), spec.submission_range[1])
    return f"{value:.{DECIMALS}f}"


def submission_text(spec: TaskSpec, ids: Sequence[str], predictions: Sequence) -> str:
    """The file of one task: the header, then one `index<TAB>prediction` row per test example."""
    rows = [HEADER] + [f"{index}\t{submission_value(spec, prediction)}" for index, prediction in zip(ids, predictions)]
    return "\n".join(rows) + "\n"


def missing_submission_tasks(names) -> list[str]:
    """The tasks of a complete submission that are not among `names`."""
    return [spec.name for spec in SUBMISSION_TASKS if spec.name not in names]


def write_submission(
    path: Path, predictions: dict[str, tuple[Sequence[str], Sequence]], allow_incomplete: bool = False
) -> list[str]:
    """Write the archive from {task: (test ids, predictions)}; returns the missing tasks.

    An incomplete archive is refused unless `allow_incomplete`. The zip is assembled under a
    temporary name and renamed into place, so a failure never leaves a partial archive behind.
    """
    missing = missing_submission_tasks(predictions)
    if missing and not allow_incomplete:
        raise InputError(
            f"no predictions for {', '.join(missing)}; set allow_incomplete=true to write an archive without them",
            value=missing,
        )
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    try:
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for file_name, spec in SUBMISSION_FILES.items():
                if spec.name in predictions:
                    ids, values = predictions[spec.name]
                    archive.writestr(file_name, submission_text(spec, ids, values))
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return missing


@dataclass
class SubmissionCheck:
    """What the validator found: the tasks present and missing, the rows per file, and every problem."""

    present: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)  # submission file -> prediction rows
    problems: list[str] = field(default_factory=list)

    def accepted(self, allow_incomplete: bool = False) -> bool:
        """True without problems and, unless `allow_incomplete`, with every task present."""
        return not self.problems and (allow_incomplete or not self.missing)


MAX_MEMBER_BYTES = 16 * 2**20  # 4x the largest submission file (QQP); more is not read


def validate_submission(path: Path, test_ids: dict[str, Sequence[str]] | None = None) -> SubmissionCheck:
    """Check names, headers, labels, row counts and index coverage of an archive.

    Rows are checked against the test files' ids in `test_ids` ({task: ids}) where given, else
    against the official test-set sizes of the task table.
    """
    check = SubmissionCheck()
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as error:
        check.problems.append(f"{path}: not a readable zip archive ({error})")
        check.missing = [spec.name for spec in SUBMISSION_TASKS]
        return check
    with archive:
        names = archive.namelist()
        for name, count in Counter(names).items():
            if count > 1:
                check.problems.append(f"{name}: in the archive {count} times")
        for name in dict.fromkeys(names):
            if "/" in name or "\\" in name:
                check.problems.append(f"{name}: in a subfolder; the leaderboard reads files at the archive's root")
            elif name not in SUBMISSION_FILES:
                check.problems.append(f"{name}: not a GLUE submission file (expected {', '.join(SUBMISSION_FILES)})")
        for spec in SUBMISSION_TASKS:
            if spec.submission_file not in names:
                check.missing.append(spec.name)
                continue
            check.present.append(spec.name)
            expected = (test_ids or {}).get(spec.name)
            try:
                data = read_member(archive, path, spec.submission_file)
            except DataFileError as error:  # this member only: the others are still checked and reported
                check.problems.append(f"{spec.submission_file}: {error.reason}")
                continue
            if len(data) > MAX_MEMBER_BYTES:  # not read further: a zip bomb would fill the memory
                check.problems.append(
                    f"{spec.submission_file}: more than {MAX_MEMBER_BYTES // 2**20} MB of text; a "
                    "GLUE submission file holds a few MB at most (QQP's 390,965 rows: ~3.5 MB)"
                )
                continue
            rows, problems = check_file(spec, data, expected)
            check.rows[spec.submission_file] = rows
            check.problems += problems
    return check


def read_member(archive: zipfile.ZipFile, path: Path, name: str) -> bytes:
    """The bytes of one member, at most MAX_MEMBER_BYTES + 1 of them (whatever size its header claims); one that
    cannot be read (encrypted, corrupt) is a DataFileError naming it."""
    if archive.getinfo(name).flag_bits & 0x1:  # bit 0 of the general-purpose flags: encrypted
        raise DataFileError(
            f"member {name} is encrypted; the leaderboard reads only unencrypted archives", source=path, value=name
        )
    try:
        with archive.open(name) as member:
            return member.read(MAX_MEMBER_BYTES + 1)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as error:  # bad CRC, bad data, method
        raise DataFileError(
            f"member {name} is corrupt ({error}); write the archive again", source=path, value=name
        ) from None


def check_file(spec: TaskSpec, data: bytes, test_ids: Sequence[str] | None) -> tuple[int, list[str]]:
    """(rows, problems) of one submission file."""
    name = spec.submission_file
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return 0, [f"{name}: not UTF-8 text"]
    if not lines or lines[0] != HEADER:
        found = shown(lines[0]) if lines else "an empty file"
        return 0, [f"{name} line 1: header must be {HEADER!r}, found {found}"]
    problems, indices = [], []
    for line, text in enumerate(lines[1:], start=2):
        fields = text.split("\t")
        if len(fields) != 2:
            problems.append(f"{name} line {line}: expected index<TAB>prediction, found {len(fields)} field(s)")
            continue
        indices.append(fields[0])
        problem = value_problem(spec, fields[1])
        if problem:
            problems.append(f"{name} line {line}: {problem}")
    if len(problems) > PROBLEMS_PER_FILE:
        problems = problems[:PROBLEMS_PER_FILE] + [f"{name}: {len(problems) - PROBLEMS_PER_FILE} more bad rows"]
    rows = len(lines) - 1
    expected_rows = len(test_ids) if test_ids is not None else spec.test_rows
    against = "the test file" if test_ids is not None else "the official test set"
    if expected_rows is not None and rows != expected_rows:
        problems.append(f"{name}: {rows} prediction rows, {against} has {expected_rows}")
    repeated = [index for index, count in Counter(indices).items() if count > 1]
    if repeated:
        problems.append(f"{name}: {len(repeated)} index value(s) repeated, e.g. {shown(repeated[0], quoted=False)}")
    if test_ids is not None:
        absent, unknown = set(test_ids) - set(indices), set(indices) - set(test_ids)
        if absent:
            example = shown(min(absent), quoted=False)
            problems.append(f"{name}: {len(absent)} test index value(s) without a prediction, e.g. {example}")
        if unknown:
            problems.append(
                f"{name}: {len(unknown)} index value(s) not in the test file, e.g. {shown(min(unknown), quoted=False)}"
            )
    return rows, problems


SHOWN_CHARACTERS = 40  # of a file's text quoted in a problem: a line of a broken file may be megabytes long


def shown(text: str, quoted: bool = True) -> str:
    """`text` (quoted: as a repr) for a problem line, cut to SHOWN_CHARACTERS."""
    cut = text[:SHOWN_CHARACTERS]
    shown_text = repr(cut) if quoted else cut
    return shown_text if len(text) <= SHOWN_CHARACTERS else f"{shown_text}... ({len(text):,} characters)"


def value_problem(spec: TaskSpec, value: str) -> str | None:
    """Why one prediction is not what the leaderboard accepts for the task, or None."""
    if spec.labels is not None:  # classes (not regression)
        vocabulary = spec.submission_labels or spec.labels
        return None if value in vocabulary else f"prediction {shown(value)} is not one of {', '.join(vocabulary)}"
    try:
        score = float(value)
    except ValueError:
        return f"prediction {shown(value)} is not a number"
    low, high = spec.submission_range or (-math.inf, math.inf)
    if not low <= score <= high:  # also refuses NaN
        return f"prediction {shown(value, quoted=False)} is outside [{low:g}, {high:g}]"
    return None


def glue_test_ids(glue_dir: Path) -> dict[str, Sequence[str]]:
    """{task: ids} from every test file present in a GLUE folder (download_glue_data.py's layout)."""
    test_ids = {}
    for spec in SUBMISSION_TASKS:
        assert spec.glue_folder is not None and spec.files is not None  # every GLUE task has its folder and files
        data_dir = Path(glue_dir) / spec.glue_folder
        if (data_dir / spec.files["test"]).is_file():
            test_ids[spec.name] = read_task_split(spec, data_dir, "test").ids
    return test_ids
