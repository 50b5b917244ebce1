"""The README's "Your own data" walk-through, run as written: its recipe files and commands, on small files made here
(a news CSV task with numeric labels and two text columns, a play), in a fresh working folder."""

from __future__ import annotations

import json
import random
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from tests.conftest import REPO_ROOT, save_tiny_masked_lm

SECTION = re.search(
    r"^## Your own data\n(.*?)^## ", (REPO_ROOT / "README.md").read_text(encoding="utf-8"), re.DOTALL | re.MULTILINE
).group(1)
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", SECTION, re.DOTALL)
TOPICS = {
    1: ["talks", "minister", "border", "election"],
    2: ["goal", "coach", "striker", "derby"],
    3: ["shares", "bank", "profits", "merger"],
    4: ["chip", "software", "probe", "battery"],
}


def write_news(folder: Path, rows: int, labelled: bool = True) -> None:
    """A CSV like the README's: Class Index, Title, Description (quoted where a comma appears)."""
    rng = random.Random(rows)
    lines = ["Class Index,Title,Description" if labelled else "Title,Description"]
    for index in range(rows):
        label = index % 4 + 1
        title = f"The {rng.choice(TOPICS[label])} story"
        description = f'"A {rng.choice(TOPICS[label])}, then a {rng.choice(TOPICS[label])} again."'
        lines.append(f"{label},{title},{description}" if labelled else f"{title},{description}")
    (folder / ("train.csv" if rows == 48 else "dev.csv" if labelled else "test.csv")).write_text(
        "\n".join(lines) + "\n", encoding="utf-8"
    )


def write_play(path: Path, speeches: int = 120) -> None:
    """Speeches: a speaker's name on its own line, two lines of verse, a blank line."""
    rng = random.Random(0)
    words = [
        "the",
        "king",
        "my",
        "lord",
        "good",
        "night",
        "sweet",
        "prince",
        "what",
        "is",
        "this",
        "and",
        "now",
        "to",
        "be",
        "or",
        "not",
    ]
    text = []
    for _ in range(speeches):
        verse = [" ".join(rng.choice(words) for _ in range(6)) + "," for _ in range(2)]
        text.append(f"{rng.choice(['HAMLET.', 'HORATIO.', 'OPHELIA.'])}\n" + "\n".join(verse) + "\n")
    path.write_text("\n".join(text), encoding="utf-8")


@pytest.fixture
def workspace(tmp_path, monkeypatch) -> Path:
    """A working folder with the walk-through's inputs: the quickstart's checkpoint (tiny), data/news, play.txt."""
    monkeypatch.chdir(tmp_path)
    save_tiny_masked_lm(tmp_path / "runs" / "quickstart" / "pretrain")
    news = tmp_path / "data" / "news"
    news.mkdir(parents=True)
    write_news(news, 48)
    write_news(news, 16)
    write_news(news, 6, labelled=False)
    write_play(tmp_path / "play.txt")
    return tmp_path


def test_the_walk_through_runs_as_written(workspace):
    recipes = [body for kind, body in BLOCKS if kind == "yaml"]
    commands = [line for kind, body in BLOCKS if kind == "bash" for line in body.splitlines() if line.strip()]
    assert len(recipes) == 2 and len(commands) == 5, (recipes, commands)
    for body in recipes:  # each recipe opens with the command that runs it: `# finetune STAGE FILE`
        name = body.splitlines()[0].split()[-1]
        (workspace / name).write_text(body, encoding="utf-8")
    outputs = {}
    for command in commands:
        arguments = shlex.split(command.split("#")[0])
        assert arguments[0] == "finetune", command
        result = CliRunner().invoke(app, arguments[1:])
        assert result.exit_code == 0, f"{command}\n{result.output[-3000:]}"
        outputs[arguments[1]] = result.output

    assert "techniques: peak lr 0.0001 default for a bert transformer" in " ".join(outputs["finetune"].split())
    config = json.loads((workspace / "runs" / "news" / "checkpoint" / "config.json").read_text())
    assert list(config["id2label"].values()) == ["World", "Sports", "Business", "Sci/Tech"]
    predictions = [json.loads(line) for line in outputs["predict"].splitlines() if line.startswith("{")]
    assert len(predictions) == 6 and {row["label"] for row in predictions} <= {
        "World",
        "Sports",
        "Business",
        "Sci/Tech",
    }
    metrics = [json.loads(line) for line in (workspace / "runs" / "play" / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in metrics if record["phase"] == "train"][-1] == 200
    assert outputs["generate"].startswith("HAMLET.")
    assert "nats per token" in outputs["score"]
