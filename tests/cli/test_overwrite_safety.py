"""`overwrite` never loses a user's files, and two runs never share a run directory.

overwrite may replace only a folder this toolkit made a run directory (its marker file), and only the
entries it wrote there; a user's files beside or inside run_dir survive every case below. A run_dir that
is the working folder, a folder above it, the home folder or `/` is refused whatever the recipe says.
A second run started into a folder that a live run holds fails before touching anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.errors import UserError
from finetune.run_dir import MARKER_FILE, OWN_ENTRIES, is_own_entry, remove_own_entries
from finetune.run_lock import LOCK_FILE
from tests.conftest import (
    REPO_ROOT,
    eval_recipe,
    finetune_recipe,
    pretrain_recipe,
    write_corpus,
    write_task,
    write_yaml,
)

runner = CliRunner()


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative path -> content): what must come out of a refusal unchanged."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def user_files(folder: Path) -> dict[str, bytes]:
    """A user's own files: a note, a nested folder, a file named like nothing finetune writes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "analysis").mkdir(exist_ok=True)
    (folder / "analysis" / "scores.csv").write_text("a,b\n1,2\n")
    return snapshot(folder)


def assert_one_line_refusal(result, *fragments: str, after_progress: bool = False) -> None:
    """Exit 2, no traceback, one `error:` line naming `fragments` (`after_progress`: the last of the output)."""
    output = result.output.strip()
    if after_progress:
        output = output.splitlines()[-1]
    assert result.exit_code == 2, f"exit code {result.exit_code}: {result.output[-2000:]}"
    assert "Traceback" not in result.output
    assert output.startswith("error: ") and "\n" not in output, f"not one error line: {output!r}"
    for fragment in fragments:
        assert fragment in output, f"{fragment!r} not named in {output!r}"


@pytest.fixture
def workspace(tmp_path, monkeypatch) -> Path:
    """A working folder with a corpus and a pretrain recipe that has overwrite on (as the quickstart's)."""
    monkeypatch.chdir(tmp_path)
    corpus = write_corpus(tmp_path / "data" / "corpus")
    data = pretrain_recipe(corpus, "runs/pretrain")
    data["overwrite"] = True
    write_yaml(tmp_path / "pretrain.yaml", data)
    return tmp_path


def pretrain(*overrides: str):
    return runner.invoke(app, ["pretrain", "pretrain.yaml", *overrides])


def test_overwrite_refuses_a_data_folder_and_leaves_it_whole(workspace):
    """The reported accident: run_dir=data with the quickstart's overwrite deleted the project's data."""
    before = snapshot(workspace / "data")
    assert_one_line_refusal(pretrain("run_dir=data"), "run_dir data", "did not write", "corpus")
    assert snapshot(workspace / "data") == before


def test_overwrite_refuses_a_folder_of_the_users_files(workspace):
    before = user_files(workspace / "mine")
    assert_one_line_refusal(pretrain("run_dir=mine"), "run_dir mine", "did not write", "analysis")
    assert snapshot(workspace / "mine") == before


@pytest.mark.parametrize(
    "run_dir", ["", ".", "WORKING", "..", "~", "/"], ids=["empty", "dot", "working-folder", "parent", "home", "root"]
)
def test_run_dir_that_holds_the_working_folder_or_home_is_refused_outright(workspace, monkeypatch, run_dir):
    home = workspace.parent / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    value = str(workspace) if run_dir == "WORKING" else run_dir
    before = snapshot(workspace)
    for overwrite in ("overwrite=true", "overwrite=false"):
        assert_one_line_refusal(pretrain(f"run_dir={value}", overwrite), "run_dir")
    assert snapshot(workspace) == before


def test_a_folder_above_home_is_refused(workspace, monkeypatch):
    monkeypatch.setenv("HOME", str(workspace / "users" / "me"))
    assert_one_line_refusal(pretrain(f"run_dir={workspace / 'users'}"), "run_dir", "home folder")


def test_overwrite_replaces_only_finetunes_own_files(workspace):
    """User files inside an earlier run and beside it survive; the earlier run's own files are replaced."""
    assert pretrain().exit_code == 0
    run = workspace / "runs" / "pretrain"
    assert (run / MARKER_FILE).is_file()
    inside = user_files(run / "mine")
    (run / "notes.txt").write_text("kept\n")
    beside = user_files(workspace / "runs" / "other")
    first_metrics = (run / "metrics.jsonl").read_text()

    result = pretrain("training.max_steps=4")
    assert result.exit_code == 0, result.output
    assert snapshot(run / "mine") == inside and (run / "notes.txt").read_text() == "kept\n"
    assert snapshot(workspace / "runs" / "other") == beside
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_steps = [record["step"] for record in records if record["phase"] == "train"]
    assert train_steps == [2, 4] and (run / "metrics.jsonl").read_text() != first_metrics  # the new run alone
    assert not (run / LOCK_FILE).exists(), "the lock outlived the run"


def test_overwrite_removes_a_link_not_what_it_points_to(workspace):
    assert pretrain().exit_code == 0
    run = workspace / "runs" / "pretrain"
    target = user_files(workspace / "precious")
    os.symlink(workspace / "precious", run / "predictions")  # a name finetune writes, as a link to a user folder
    assert pretrain().exit_code == 0
    assert snapshot(workspace / "precious") == target


def test_without_overwrite_a_run_dir_is_never_mixed_into(workspace):
    assert pretrain().exit_code == 0
    run = workspace / "runs" / "pretrain"
    before = snapshot(run)
    assert_one_line_refusal(pretrain("overwrite=false"), "already holds a finished run", "overwrite=true")
    assert snapshot(run) == before


def test_a_run_of_a_version_before_the_marker_is_known_by_its_saved_recipe(workspace):
    """Its recipe.yaml names this very folder as run_dir: overwrite replaces it (make quickstart stays re-runnable)."""
    assert pretrain().exit_code == 0
    run = workspace / "runs" / "pretrain"
    (run / MARKER_FILE).unlink()
    assert pretrain().exit_code == 0
    assert (run / MARKER_FILE).is_file()


@pytest.mark.parametrize(
    "recipe_text",
    ["", "stage: pretrain\nrun_dir: runs/elsewhere\n", "[1, 2]\n", "stage: [\n"],
    ids=["no-recipe", "recipe-of-another-folder", "not-a-mapping", "not-yaml"],
)
def test_a_folder_without_marker_or_own_recipe_is_not_overwritten(workspace, recipe_text):
    assert pretrain().exit_code == 0
    run = workspace / "runs" / "pretrain"
    (run / MARKER_FILE).unlink()
    if recipe_text:
        (run / "recipe.yaml").write_text(recipe_text)
    else:
        (run / "recipe.yaml").unlink()
    before = snapshot(run)
    assert_one_line_refusal(pretrain(), "did not write")
    assert snapshot(run) == before


def test_an_empty_existing_folder_may_hold_a_run(workspace):
    (workspace / "runs" / "pretrain").mkdir(parents=True)
    assert pretrain("overwrite=false").exit_code == 0


def test_a_folder_holding_only_a_users_subfolder_is_not_a_run_dir(workspace):
    (workspace / "runs" / "pretrain").mkdir(parents=True)
    inside = user_files(workspace / "runs" / "pretrain" / "keep")
    assert_one_line_refusal(pretrain(), "did not write")
    assert snapshot(workspace / "runs" / "pretrain" / "keep") == inside


def test_a_user_mistake_found_after_the_folder_exists_leaves_nothing_behind(workspace, monkeypatch):
    """The safety net behind the validation: a UserError raised once the run directory is written removes it."""
    import finetune.training.driver as driver  # it creates the run directory, then starts the trackers

    def refuse(*arguments, **keywords):
        raise UserError("a mistake noticed late")

    with monkeypatch.context() as patched:
        patched.setattr(driver, "start_trackers", refuse)
        assert_one_line_refusal(pretrain(), "noticed late", after_progress=True)
    assert not (workspace / "runs" / "pretrain").exists()
    assert pretrain().exit_code == 0  # an earlier run, then the same mistake with overwrite: its own files go
    inside = user_files(workspace / "runs" / "pretrain" / "keep")
    with monkeypatch.context() as patched:
        patched.setattr(driver, "start_trackers", refuse)
        assert_one_line_refusal(pretrain(), "noticed late", after_progress=True)
    assert sorted(path.name for path in (workspace / "runs" / "pretrain").iterdir()) == ["keep"]
    assert snapshot(workspace / "runs" / "pretrain" / "keep") == inside


def test_every_entry_a_run_writes_is_finetunes_own(tmp_path, monkeypatch):
    """OWN_ENTRIES must name everything the stages write, or overwrite would leave old files mixed into a new run."""
    monkeypatch.chdir(tmp_path)
    corpus, task = write_corpus(tmp_path / "corpus"), write_task(tmp_path / "task")
    pretrain_data = pretrain_recipe(corpus, tmp_path / "runs" / "pretrain")
    pretrain_data.update(checkpoint_every=4)
    finetune_data = finetune_recipe(tmp_path / "runs" / "pretrain" / "checkpoint", task, tmp_path / "runs" / "seeds")
    finetune_data.update(seeds=[1, 2], checkpoint_every=3)
    eval_data = eval_recipe(
        task, tmp_path / "runs" / "eval", {"m": str(tmp_path / "runs" / "seeds" / "seed-1" / "checkpoint")}
    )
    eval_data["write_predictions"] = True
    for stage, data in (("pretrain", pretrain_data), ("finetune", finetune_data), ("eval", eval_data)):
        result = runner.invoke(app, [stage, str(write_yaml(tmp_path / f"{stage}.yaml", data))])
        assert result.exit_code == 0, result.output
    for run in ("pretrain", "seeds", "seeds/seed-1", "eval"):
        folder = tmp_path / "runs" / run
        foreign = [entry.name for entry in folder.iterdir() if not is_own_entry(entry)]
        assert foreign == [], f"{run} holds entries overwrite would not remove: {foreign}"
    remove_own_entries(tmp_path / "runs" / "seeds")
    assert list((tmp_path / "runs" / "seeds").iterdir()) == []
    assert {"checkpoint", "metrics.jsonl", "seeds.json", "report.json"} <= OWN_ENTRIES


def test_a_run_of_draws_writes_only_its_own_entries_and_overwrite_spares_the_users(pretrained, tmp_path):
    task = write_task(tmp_path / "task")
    (task / "dev.tsv").unlink()  # dev_split holds the dev rows out of train.tsv
    data = finetune_recipe(pretrained, task, tmp_path / "runs" / "draws")
    data["task"].update(labels_per_class=4, dev_split=0.25)
    data["training"]["epochs"] = 1
    data.update(draws=2, seeds=[1])
    recipe = write_yaml(tmp_path / "draws.yaml", data)
    result = runner.invoke(app, ["finetune", str(recipe)])
    assert result.exit_code == 0, result.output
    for run in ("draws", "draws/draw-0", "draws/draw-1/seed-1"):
        folder = tmp_path / "runs" / run
        foreign = [entry.name for entry in folder.iterdir() if not is_own_entry(entry)]
        assert foreign == [], f"{run} holds entries overwrite would not remove: {foreign}"
    (tmp_path / "runs" / "draws" / "draw-0" / "notes.txt").write_text("mine")
    assert runner.invoke(app, ["finetune", str(recipe), "overwrite=true", "draws=1"]).exit_code == 0
    assert (tmp_path / "runs" / "draws" / "draw-0" / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "runs" / "draws" / "draw-1").exists()  # the earlier run's second draw: removed


# ---------------------------------------------------------------------------------------------
# Two runs, one folder
# ---------------------------------------------------------------------------------------------


def start_cli(arguments: list[str], cwd: Path) -> subprocess.Popen:
    environment = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "finetune", *arguments],
        cwd=cwd,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def lock_content(run: Path) -> str:
    """The lock file's text once it is complete JSON, else ''."""
    try:
        text = (run / LOCK_FILE).read_text()
        json.loads(text)
        return text
    except (FileNotFoundError, ValueError):
        return ""


@pytest.mark.slow
def test_a_second_run_into_a_busy_run_dir_fails_before_touching_it(workspace):
    """The second run (overwrite on) must not wipe the first, which must finish with its own metrics only."""
    # The CLI imports a stage's code only after its recipe is read: loaded here first, so that the second run reaches
    # the lock at once instead of after seconds of imports, by which time the short first run may have finished.
    import finetune.stages.pretrain  # noqa: F401

    run = workspace / "runs" / "pretrain"
    first = start_cli(
        ["pretrain", "pretrain.yaml", "training.epochs=30", "training.max_steps=300", "training.log_every=50"],
        workspace,
    )
    deadline = time.monotonic() + 120
    # The lock is created empty (O_EXCL) and then filled: wait for its content, which a loaded machine can delay.
    while not lock_content(run) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lock_content(run), first.communicate()[1][-2000:]
    owner = json.loads(lock_content(run))
    assert owner["pid"] == first.pid
    before = snapshot(run)

    second = runner.invoke(
        app, ["pretrain", "pretrain.yaml", "training.epochs=30", "training.max_steps=300", "training.log_every=50"]
    )

    assert_one_line_refusal(second, "in use by another run", f"process {first.pid}")
    if first.poll() is None:  # still training: the refusal changed nothing (files may only have grown since)
        after = snapshot(run)
        assert all(after.get(name, b"").startswith(content) for name, content in before.items())
    _, errors = first.communicate(timeout=300)
    assert first.returncode == 0, errors[-2000:]
    steps = [
        json.loads(line)["step"]
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["phase"] == "train"
    ]
    assert steps == list(range(50, 301, 50)), "the first run's metrics were mixed with another run's"
    assert not (run / LOCK_FILE).exists()


def test_a_stale_lock_of_a_killed_run_is_taken_over(workspace):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs: the run that held the lock was killed
    assert pretrain().exit_code == 0
    run = workspace / "runs" / "pretrain"
    (run / LOCK_FILE).write_text(json.dumps({"pid": gone.pid, "host": os.uname().nodename, "start_time": "1"}))
    result = pretrain()
    assert result.exit_code == 0, result.output
    assert not (run / LOCK_FILE).exists()


def test_a_lock_from_another_host_is_respected(workspace):
    assert pretrain().exit_code == 0
    run = workspace / "runs" / "pretrain"
    (run / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "some-other-machine", "start_time": "1"}))
    before = snapshot(run)
    assert_one_line_refusal(pretrain(), "in use", "some-other-machine", LOCK_FILE)
    assert_one_line_refusal(pretrain("--resume"), "in use")
    assert snapshot(run) == before


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_says_what_to_do(workspace):
    """kill -9 before any checkpoint: --resume and a plain rerun each say, in one line, to start again with overwrite;
    that rerun takes over the dead run's lock."""
    run = workspace / "runs" / "pretrain"
    killed = start_cli(
        [
            "pretrain",
            "pretrain.yaml",
            "overwrite=false",
            "checkpoint_every=100000",
            "training.epochs=30",
            "training.max_steps=300",
            "training.log_every=1",
        ],
        workspace,
    )
    deadline = time.monotonic() + 120
    while not (run / "metrics.jsonl").exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    killed.kill()
    killed.wait()
    assert (run / LOCK_FILE).exists() and not (run / "checkpoint").exists()
    before = snapshot(run)
    overrides = [
        "overwrite=false",
        "checkpoint_every=100000",
        "training.epochs=30",
        "training.max_steps=300",
        "training.log_every=1",
    ]
    assert_one_line_refusal(pretrain(*overrides), "stopped before saving a checkpoint", "overwrite=true")
    assert_one_line_refusal(
        pretrain(*overrides, "--resume"),
        "cannot be resumed",
        "before its first periodic checkpoint (checkpoint_every: 100000)",
        "overwrite=true",
    )
    assert snapshot(run) == before
    result = pretrain("overwrite=true", "training.max_steps=2", "training.log_every=1")
    assert result.exit_code == 0, result.output
    assert not (run / LOCK_FILE).exists()
