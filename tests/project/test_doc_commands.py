"""Every shell command of README.md and docs/*.md works as written, checked without running it (tests/doc_commands.py
says how); `make docs-check` runs them (tests/docs_check.py).

What this catches: a subcommand, option, recipe file, recipe key or value, make target, test or benchmark flag that
does not exist, or an override the recipe refuses. What it leaves to `make docs-check`: whether the command then
runs and writes what the text next to it says.
"""

from __future__ import annotations

import pytest

from tests.doc_commands import Block, Command, check_command, doc_files, doc_recipes, expanded_commands, shell_blocks

BLOCKS = [block for path in doc_files() for block in shell_blocks(path)]
COMMANDS = [command for block in BLOCKS for command in expanded_commands(block)]


@pytest.fixture(scope="module")
def recipes_dir(tmp_path_factory):
    """The recipe files the docs write out in YAML blocks (README's news.yaml, play.yaml) or copy from the shipped
    ones (`finetune recipes copy NAME FILE`), for the commands after them that run those files."""
    from finetune.recipes.shipped import copy_recipe

    folder = tmp_path_factory.mktemp("doc-recipes")
    for path in doc_files():
        for name, text in doc_recipes(path).items():
            (folder / name).write_text(text, encoding="utf-8")
    for command in COMMANDS:
        words = [word for word in command.args if not word.startswith("-")]
        if command.program == "finetune" and words[:2] == ["recipes", "copy"] and len(words) == 4:
            copy_recipe(words[2], folder / words[3], force=True)
    return folder


def test_the_docs_have_commands_and_every_block_gives_some():
    assert len(BLOCKS) >= 20 and len(COMMANDS) >= 60
    for block in BLOCKS:
        commands = [line for line in block.text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        if commands:
            assert any(command.block == block for command in COMMANDS), f"{block.where}: no command recorded"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: f"{command.block.where}-{command.program}")
def test_doc_command_works_as_written(command, recipes_dir):
    check_command(command, recipes_dir)


def test_loops_and_continuations_expand_as_bash_runs_them():
    block = Block(
        doc_files()[0],
        1,
        "bash",
        "for task in cola:CoLA rte:RTE; do\n  finetune eval x.yaml task=${task%:*} dir=${task#*:}\ndone\n"
        "echo hi | finetune predict \\\n  runs/a --output 'b c'  # a comment\n",
    )
    assert [(command.program, command.args) for command in expanded_commands(block)] == [
        ("finetune", ("eval", "x.yaml", "task=cola", "dir=CoLA")),
        ("finetune", ("eval", "x.yaml", "task=rte", "dir=RTE")),
        ("finetune", ("predict", "runs/a", "--output", "b c")),
    ]


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("finetune evaluate recipes/eval/glue.yaml", "no such command evaluate"),
        ("finetune lr-find recipes/quickstart/finetune.yaml --stepz 5", "do not parse"),
        ("finetune finetune recipes/quickstart/finetune.yaml training.epochz=2", "the recipe is refused"),
        ("finetune finetune recipes/quickstart/nothing.yaml", "no recipe file"),
        ("finetune finetune quickstart/finetun", "no recipe file quickstart/finetun, nor a shipped recipe"),
        ("finetune pretrain quickstart/finetune", "does not take a finetune recipe"),
        ("finetune recipes copy quickstart/nothing my.yaml", "no shipped recipe quickstart/nothing"),
        ("finetune pretrain recipes/quickstart/finetune.yaml", "does not take a finetune recipe"),
        ("finetune runs compare", "do not parse"),
        ("accelerate launch -m finetune pretrain recipes/quickstart/pretrain.yaml run_dirr=x", "the recipe is refused"),
        ("make quikstart", "no target quikstart"),
        (".venv/bin/python bench/ulmfit_imdb.py --no-such-flag", "has no option --no-such-flag"),
        (
            ".venv/bin/python -m pytest -q tests/training/test_schedules.py::test_nothing_like_it",
            "no test test_nothing",
        ),
        ("finetun recipes", "unknown program finetun"),
    ],
)
def test_the_check_refuses_what_would_fail(line, fragment, recipes_dir):
    block = Block(doc_files()[0], 1, "bash", line + "\n")
    (command,) = expanded_commands(block)
    with pytest.raises(AssertionError, match=fragment):
        check_command(command, recipes_dir)


def test_a_command_is_shown_as_typed():
    block = Block(doc_files()[0], 1, "bash", "")
    assert str(Command("finetune", ("eval", "a b.yaml"), block)) == "finetune eval 'a b.yaml'"


# ---------------------------------------------------------------------------------------------
# make docs-check's decisions (tests/docs_check.py), without running anything
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("program", "args", "reason"),
    [
        ("finetune", ["ulmfit", "x.yaml", "general_lm={checkpoint: <stage-1 checkpoint>}"], "placeholder"),
        ("finetune", ["push", "runs/a", "me/a"], "network"),
        ("finetune", ["serve", "runs/a/checkpoint"], "a server"),
        ("curl", ["-s", "http://127.0.0.1:8000/health"], "asks a server"),
        ("finetune", ["eval", "x.yaml", "source=hub"], "network"),
        ("accelerate", ["launch", "--multi_gpu", "-m", "finetune", "pretrain", "x.yaml"], "GPUs"),
        ("make", ["test"], "CI"),
        ("make", ["dist"], "builds the release"),
        ("finetune", ["finetune", "x.yaml", "task.data_dir=../shared/data/nowhere"], "not on this machine"),
    ],
)
def test_docs_check_skips_what_cannot_run_here_and_says_why(program, args, reason):
    from tests.docs_check import skip_reason

    assert reason in skip_reason(program, args)


def test_docs_check_runs_the_quickstart_commands():
    from tests.docs_check import skip_reason

    assert skip_reason("finetune", ["pretrain", "recipes/quickstart/pretrain.yaml", "run_dir=runs/a"]) is None


def test_docs_check_reads_the_claims_beside_a_command_and_checks_them(tmp_path):
    from tests.docs_check import check_claims, claims

    block = Block(
        doc_files()[0],
        7,
        "bash",
        "finetune lr-find a.yaml --steps 5   # writes runs/a-lr-find/\n"
        "finetune runs compare runs/a runs/b   # Markdown on stdout\n"
        "finetune ulmfit u.yaml    # seconds on a CPU\n"
        "for x in 1; do finetune eval $x  # a loop's comment is not a claim\ndone\n",
    )
    assert [words for words, _ in claims(block)] == [
        ["finetune", "lr-find", "a.yaml", "--steps", "5"],
        ["finetune", "runs", "compare", "runs/a", "runs/b"],
        ["finetune", "ulmfit", "u.yaml"],
    ]
    records = [
        {"program": "finetune", "args": ["lr-find", "a.yaml", "--steps", "5"], "rc": 0, "stdout": ""},
        {"program": "finetune", "args": ["runs", "compare", "runs/a", "runs/b"], "rc": 0, "stdout": "no table\n"},
        {"program": "finetune", "args": ["ulmfit", "u.yaml"], "rc": 0, "seconds": 75.0, "stdout": ""},
    ]
    problems = check_claims(block, records, tmp_path)
    assert len(problems) == 3 and all(problem.startswith("README.md:7: ") for problem in problems)
    assert "writes runs/a-lr-find/; there is no such file" in problems[0]
    assert "no table was printed" in problems[1] and "it took 75.0 s" in problems[2]
    (tmp_path / "runs" / "a-lr-find").mkdir(parents=True)
    records[1]["stdout"], records[2]["seconds"] = "| a | b |\n", 12.0
    assert check_claims(block, records, tmp_path) == []
