"""Leaderboard archives: values as GLUE expects them, atomic writing, and the validator against broken archives."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.errors import UserError
from finetune.glue import submission
from finetune.glue.specs import GLUE_TASKS, SUBMISSION_FILES, SUBMISSION_TASKS
from finetune.glue.submission import (
    glue_test_ids,
    submission_text,
    submission_value,
    validate_submission,
    write_submission,
)
from tests.data.test_glue_data import TEST_ROWS, write_glue_root

runner = CliRunner()


def test_values_as_the_leaderboard_expects_them():
    stsb = GLUE_TASKS["stsb"]
    assert [submission_value(stsb, value) for value in (7.25, -0.3, 3.14159, 2.0)] == [
        "5.000",
        "0.000",
        "3.142",
        "2.000",
    ]
    assert submission_value(GLUE_TASKS["mnli"], 0) == "contradiction"
    assert submission_value(GLUE_TASKS["ax"], np.int64(2)) == "neutral"
    assert submission_value(GLUE_TASKS["qnli"], 1) == "not_entailment"
    assert submission_value(GLUE_TASKS["cola"], 1) == "1"
    text = submission_text(GLUE_TASKS["rte"], ["17", "4"], [1, 0])
    assert text == "index\tprediction\n17\tnot_entailment\n4\tentailment\n"


def generated_test_ids():
    """Test ids like the generated GLUE root's: 0..n-1 per task."""
    return {spec.name: [str(index) for index in range(TEST_ROWS[spec.name])] for spec in SUBMISSION_TASKS}


def complete_predictions() -> dict:
    return {name: (ids, np.zeros(len(ids))) for name, ids in generated_test_ids().items()}


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    path = tmp_path / "submission.zip"
    assert write_submission(path, complete_predictions()) == []
    return path


def rewrite(source: Path, target: Path, change: dict[str, str | None]) -> Path:
    """A copy of the archive with files replaced (a string), removed (None) or added (a new name)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for name in old.namelist():
            if name not in change:
                new.writestr(name, old.read(name))
        for name, text in change.items():
            if text is not None:
                new.writestr(name, text)
    return target


def test_complete_archive_is_valid(archive):
    with zipfile.ZipFile(archive) as opened:
        assert sorted(opened.namelist()) == sorted(spec.submission_file for spec in SUBMISSION_TASKS)
        assert opened.read("MNLI-mm.tsv").decode() == "index\tprediction\n0\tcontradiction\n1\tcontradiction\n"
        assert opened.read("STS-B.tsv").decode().splitlines()[1] == "0\t0.000"
    check = validate_submission(archive, generated_test_ids())
    assert check.accepted() and check.missing == [] and check.rows["QQP.tsv"] == 5


def test_incomplete_archive_is_refused_and_nothing_is_written(tmp_path):
    predictions = {name: value for name, value in complete_predictions().items() if name not in ("qqp", "ax")}
    path = tmp_path / "submission.zip"
    with pytest.raises(UserError, match=r"no predictions for qqp, ax.*allow_incomplete"):
        write_submission(path, predictions)
    assert list(tmp_path.iterdir()) == []
    assert write_submission(path, predictions, allow_incomplete=True) == ["qqp", "ax"]
    check = validate_submission(path, generated_test_ids())
    assert check.missing == ["qqp", "ax"] and not check.problems
    assert not check.accepted() and check.accepted(allow_incomplete=True)


def test_failed_write_leaves_no_partial_archive(tmp_path, monkeypatch, archive):
    before = archive.read_bytes()

    def broken(spec, ids, predictions):
        if spec.name == "qqp":
            raise RuntimeError("disk full")
        return "index\tprediction\n"

    monkeypatch.setattr(submission, "submission_text", broken)
    with pytest.raises(RuntimeError):
        write_submission(archive, complete_predictions())
    assert archive.read_bytes() == before  # the earlier archive is untouched
    assert sorted(path.name for path in archive.parent.iterdir()) == ["submission.zip"]


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        ({"RTE.tsv": None}, []),  # missing: no problem, but not accepted without allow_incomplete
        (
            {"CoLA.tsv": "index\tprediction\n0\t1\n1\t0\n"},
            ["CoLA.tsv: 2 prediction rows, the test file has 3", "without a prediction, e.g. 2"],
        ),
        (
            {"MNLI-m.tsv": "index\tprediction\n0\tentail\n1\tneutral\n2\tneutral\n"},
            ["MNLI-m.tsv line 2: prediction 'entail' is not one of contradiction, entailment, neutral"],
        ),
        (
            {"SST-2.tsv": "index\tprediction\n0\tpositive\n1\t1\n2\t0\n3\t1\n"},
            ["SST-2.tsv line 2: prediction 'positive'"],
        ),
        (
            {"STS-B.tsv": "index\tprediction\n0\t5.500\n1\tabc\n2\t1.0\n"},
            ["STS-B.tsv line 2: prediction 5.500 is outside [0, 5]", "line 3: prediction 'abc' is not a number"],
        ),
        ({"WNLI.tsv": None, "glue/WNLI.tsv": "index\tprediction\n0\t1\n1\t0\n"}, ["glue/WNLI.tsv: in a subfolder"]),
        (
            {"QNLI.tsv": "id\tlabel\n0\tentailment\n1\tentailment\n2\tentailment\n"},
            ["QNLI.tsv line 1: header must be 'index\\tprediction', found 'id\\tlabel'"],
        ),
        (
            {"RTE.tsv": "index\tprediction\n0\tentailment\n0\tentailment\n2\tentailment\n3\tentailment\n"},
            ["RTE.tsv: 1 index value(s) repeated, e.g. 0", "without a prediction, e.g. 1"],
        ),
        (
            {"AX.tsv": "index\tprediction\n0\tneutral\n1\tneutral\n9\tneutral\n"},
            ["AX.tsv: 1 index value(s) not in the test file, e.g. 9"],
        ),
        (
            {"MRPC.tsv": "index\tprediction\n0\t1\t0.9\n1\t0\n2\t1\n"},
            ["MRPC.tsv line 2: expected index<TAB>prediction"],
        ),
        ({"README.txt": "hello"}, ["README.txt: not a GLUE submission file"]),
    ],
)
def test_broken_archives(archive, tmp_path, change, fragments):
    broken = rewrite(archive, tmp_path / "broken.zip", change)
    check = validate_submission(broken, generated_test_ids())
    for fragment in fragments:
        assert any(fragment in problem for problem in check.problems), (fragment, check.problems)
    assert not check.accepted()
    if not fragments:
        assert check.missing == ["rte"] and check.problems == [] and check.accepted(allow_incomplete=True)


def test_without_test_files_rows_are_checked_against_the_official_sizes(archive):
    check = validate_submission(archive)
    assert "CoLA.tsv: 3 prediction rows, the official test set has 1063" in check.problems
    assert len(check.problems) == 11


def test_not_a_zip(tmp_path):
    path = tmp_path / "submission.zip"
    path.write_text("not a zip", encoding="utf-8")
    check = validate_submission(path)
    assert "not a readable zip archive" in check.problems[0] and len(check.missing) == 11


def test_many_bad_rows_are_summarised(archive, tmp_path):
    rows = "".join(f"{index}\tmaybe\n" for index in range(3))
    broken = rewrite(archive, tmp_path / "broken.zip", {"QNLI.tsv": "index\tprediction\n" + rows * 3})
    problems = [problem for problem in validate_submission(broken).problems if problem.startswith("QNLI.tsv")]
    assert problems[5] == "QNLI.tsv: 4 more bad rows"


def test_glue_test_ids_reads_the_test_files(tmp_path):
    root = write_glue_root(tmp_path / "glue", skip=("qqp",))
    ids = glue_test_ids(root)
    assert "qqp" not in ids and ids["mnli-mm"] == ["0", "1"] and ids["ax"] == ["0", "1", "2"]


# ---------------------------------------------------------------------------------------------
# `finetune validate-submission`
# ---------------------------------------------------------------------------------------------


def test_cli_accepts_a_valid_archive(archive, tmp_path):
    root = write_glue_root(tmp_path / "glue")
    result = runner.invoke(app, ["validate-submission", str(archive), "--glue-dir", str(root)])
    assert result.exit_code == 0, result.output
    assert "CoLA.tsv: 3 rows (checked against the test file)" in result.output
    assert result.output.strip().endswith("valid, complete")


def test_cli_incomplete_archive(archive, tmp_path):
    root = write_glue_root(tmp_path / "glue", skip=("ax",))
    partial = rewrite(archive, tmp_path / "partial.zip", {"AX.tsv": None, "QQP.tsv": None})
    result = runner.invoke(app, ["validate-submission", str(partial), "--glue-dir", str(root)])
    assert result.exit_code == 1 and "missing: QQP.tsv, AX.tsv" in result.output
    assert "--allow-incomplete" in result.output
    result = runner.invoke(app, ["validate-submission", str(partial), "--glue-dir", str(root), "--allow-incomplete"])
    assert result.exit_code == 0 and "valid, 2 task(s) missing" in result.output


def test_cli_reports_problems(archive, tmp_path):
    broken = rewrite(archive, tmp_path / "broken.zip", {"CoLA.tsv": "index\tprediction\n0\t2\n1\t0\n2\t1\n"})
    root = write_glue_root(tmp_path / "glue")
    result = runner.invoke(app, ["validate-submission", str(broken), "--glue-dir", str(root)])
    assert result.exit_code == 1 and "problem: CoLA.tsv line 2: prediction '2'" in result.output


def test_cli_missing_archive_is_a_one_line_error(tmp_path):
    result = runner.invoke(app, ["validate-submission", str(tmp_path / "absent.zip")])
    assert result.exit_code == 2 and result.output.strip() == f"error: {tmp_path / 'absent.zip'}: no such file"
    result = runner.invoke(app, ["validate-submission", str(tmp_path / "absent.zip"), "--glue-dir", str(tmp_path)])
    assert result.exit_code == 2


def test_a_huge_member_is_refused_without_reading_it_whole(archive, tmp_path, monkeypatch):
    """A zip bomb (here 8 MB of zeros against a 1 MB limit) is named as too large; at most the limit is read."""
    import tracemalloc

    monkeypatch.setattr(submission, "MAX_MEMBER_BYTES", 2**20)
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive) as old, zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as new:
        for name in old.namelist():
            new.writestr(name, old.read(name) if name != "QQP.tsv" else b"index\tprediction\n" + bytes(8 * 2**20))
    tracemalloc.start()
    check = validate_submission(bomb)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert any(problem.startswith("QQP.tsv: more than 1 MB of text") for problem in check.problems)
    assert peak < 4 * 2**20, peak
    others = [problem for problem in validate_submission(archive).problems if not problem.startswith("QQP.tsv")]
    assert [problem for problem in check.problems if not problem.startswith("QQP.tsv")] == others


def test_submission_files_name_every_submission_task():
    assert list(SUBMISSION_FILES) == [spec.submission_file for spec in SUBMISSION_TASKS]
    assert len(SUBMISSION_FILES) == 11


# ---------------------------------------------------------------------------------------------
# Malformed archives: every problem reported, none crashes the validator or the command (issue 44)
# ---------------------------------------------------------------------------------------------


def test_cli_reports_a_huge_member_and_still_checks_the_others(archive, tmp_path, monkeypatch):
    # The archive had a 200 MB CoLA.tsv of zeros; the bound is made 1 MB here so 2 MB exceed it.
    monkeypatch.setattr(submission, "MAX_MEMBER_BYTES", 2**20)
    bomb = rewrite(archive, tmp_path / "bomb.zip", {"CoLA.tsv": "\0" * (2 * 2**20)})
    root = write_glue_root(tmp_path / "glue")
    result = runner.invoke(app, ["validate-submission", str(bomb), "--glue-dir", str(root)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "CoLA.tsv: not read (see its problem below)" in result.output
    assert "problem: CoLA.tsv: more than 1 MB of text" in result.output
    assert "SST-2.tsv: 4 rows (checked against the test file)" in result.output
    assert result.output.strip().endswith("not valid")


def test_cli_reports_every_problem_of_a_malformed_archive(archive, tmp_path):
    broken = rewrite(
        archive,
        tmp_path / "broken.zip",
        {
            "RTE.tsv": None,  # missing
            "CoLA.tsv": "\x7f\x01junk",  # no header
            "QNLI.tsv": "x" * 100_000 + "\n0\tentailment\n",  # a wrong header, megabytes long in real junk
            "SST-2.tsv": "index\tprediction\n0\t1\n",  # too few rows
        },
    )
    root = write_glue_root(tmp_path / "glue")
    result = runner.invoke(app, ["validate-submission", str(broken), "--glue-dir", str(root)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    output = result.output
    assert "missing: RTE.tsv" in output
    assert "problem: CoLA.tsv line 1: header must be" in output
    assert "problem: QNLI.tsv line 1: header must be 'index\\tprediction', found 'xxxx" in output
    assert "(100,000 characters)" in output and max(len(line) for line in output.splitlines()) < 300
    assert "problem: SST-2.tsv: 1 prediction rows, the test file has 4" in output


def test_binary_junk_is_not_utf8(archive, tmp_path):
    with zipfile.ZipFile(archive) as old, zipfile.ZipFile(tmp_path / "junk.zip", "w") as new:
        for name in old.namelist():
            new.writestr(name, old.read(name) if name != "MRPC.tsv" else bytes(range(256)) * 4)
    check = validate_submission(tmp_path / "junk.zip", generated_test_ids())
    assert "MRPC.tsv: not UTF-8 text" in check.problems and "mrpc" in check.present


def test_a_corrupt_member_is_one_problem_and_the_others_are_checked(archive, tmp_path):
    # A stored (uncompressed) member with one byte changed fails its CRC check when read.
    corrupt = tmp_path / "corrupt.zip"
    with zipfile.ZipFile(archive) as old, zipfile.ZipFile(corrupt, "w", compression=zipfile.ZIP_STORED) as new:
        for name in old.namelist():
            new.writestr(name, old.read(name))
        member = old.read("AX.tsv")
    data = bytearray(corrupt.read_bytes())
    assert new.namelist()[-1] == "AX.tsv"  # written last: the last copy of its bytes (MNLI's may be the same)
    data[data.rindex(member) + len(member) - 2] ^= 0xFF  # a byte of AX.tsv's last row
    corrupt.write_bytes(bytes(data))
    check = validate_submission(corrupt, generated_test_ids())
    ax_problems = [problem for problem in check.problems if problem.startswith("AX.tsv")]
    assert len(ax_problems) == 1 and ax_problems[0].startswith("AX.tsv: member AX.tsv is corrupt"), check.problems
    assert check.rows["CoLA.tsv"] == 3 and "AX.tsv" not in check.rows
    result = runner.invoke(app, ["validate-submission", str(corrupt)])
    assert result.exit_code == 1 and "AX.tsv: not read" in result.output and "Traceback" not in result.output


def test_cli_on_a_file_that_is_not_a_zip(tmp_path):
    path = tmp_path / "submission.zip"
    path.write_bytes(bytes(1000))
    result = runner.invoke(app, ["validate-submission", str(path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "not a readable zip archive" in result.output and "missing: CoLA.tsv" in result.output
