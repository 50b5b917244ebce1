"""docs/python.md's notebook session runs as written: its ```python blocks, in order and in one namespace, from a
folder holding the quickstart's data (the doc's tiny model is built by its own first block), offline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "python.md"

pytest.importorskip("pandas", reason="docs/python.md's session reads the quickstart task with pandas")


def python_blocks(path: Path) -> list[str]:
    """The text of every ```python block of a Markdown file, in order."""
    return re.findall(r"^```python\n(.*?)^```$", path.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)


def test_the_doc_has_the_sessions_steps():
    code = "\n".join(python_blocks(DOC))
    steps = ("finetune.pretrain(", "finetune.finetune(", "result.metrics", "finetune.evaluate(", "finetune.predict(")
    for step in steps:
        assert step in code, step


def test_the_notebook_session_runs_as_written(tmp_path, monkeypatch, capsys):
    (tmp_path / "data").symlink_to(ROOT / "data")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for number, block in enumerate(python_blocks(DOC), start=1):
        exec(compile(block, f"{DOC.name} block {number}", "exec"), namespace)

    result, scores = namespace["result"], namespace["scores"]
    assert result.checkpoint == Path("runs/notebook/sentiment/checkpoint") and result.checkpoint.is_dir()
    assert set(result.metrics) >= {"dev_accuracy", "dev_f1"} and result.best_step is not None
    assert 0.0 <= result.metrics["dev_accuracy"] <= 1.0  # the doc: from chance to about 0.75, run to run
    assert scores.metrics["accuracy"] == pytest.approx(result.metrics["dev_accuracy"])
    assert namespace["predictions"][0]["label"] in ("0", "1")
    assert "train: missing column(s) sentence (columns: text, label)" in capsys.readouterr().out
    assert not Path("runs/notebook/oops").exists()
