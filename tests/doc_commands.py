"""The shell commands of README.md and docs/*.md as a reader types them: found, expanded and checked.

A block is expanded by bash itself: its text runs with every program a reader calls (finetune, make, accelerate,
pip, .venv/bin/python, ...) replaced by a function that records its arguments, so loops, variables, pipes and
line continuations become the commands a prompt would run, and nothing runs. `check_command` then checks each one
without running it: the program is one we ship or name, a finetune subcommand and its options parse, its recipe
with the command's overrides validates, a make target exists, a test or benchmark file and its flags exist.

tests/project/test_doc_commands.py runs these checks in `make test`; tests/docs_check.py runs the commands for real
(`make docs-check`).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import typer.main

REPO_ROOT = Path(__file__).resolve().parent.parent
SHELL_FENCES = ("bash", "sh", "shell", "console")
# Programs a block may call, each recorded instead of run. Anything else that is not a shell builtin or a basic
# tool (echo, grep, cat) is recorded by bash's command_not_found_handle and refused as unknown.
RECORDED = (
    "finetune", "make", "accelerate", "pip", "python", "python3", "git", "tensorboard", "curl", "srun", "scontrol"
)  # fmt: skip
RECORDED_PATHS = (".venv/bin/python", ".venv/bin/pip", ".venv/bin/pre-commit", ".venv/bin/finetune")
# finetune subcommands that take a recipe, and the recipe stages each accepts (None: its own name).
RECIPE_COMMANDS = {
    "pretrain": ("pretrain",),
    "finetune": ("finetune",),
    "ulmfit": ("ulmfit",),
    "intermediate": ("intermediate",),
    "eval": ("eval",),
    "lr-find": ("pretrain", "finetune"),
    "profile": ("pretrain", "finetune", "ulmfit", "intermediate", "multitask"),
    "multitask": ("multitask",),
    "search": ("finetune",),
    "cv": ("finetune",),
}
# A doc's YAML block that starts with this comment is the file a later command reads (README's news.yaml).
RECIPE_BLOCK = re.compile(r"^#\s*finetune\s+\S+\s+(?P<name>[\w.-]+\.ya?ml)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a doc: where it starts (the first line inside the fence) and its text."""

    path: Path
    line: int
    language: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}"


@dataclass(frozen=True)
class Command:
    """One command of a block, as bash expanded it."""

    program: str
    args: tuple[str, ...]
    block: Block

    def __str__(self) -> str:
        return shlex.join([self.program, *self.args])


def doc_files() -> list[Path]:
    """README.md first (a reader's order), then docs/ by name."""
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def fenced_blocks(path: Path) -> list[Block]:
    blocks, language, start, lines = [], None, 0, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("```"):
            if language is None:
                language, start, lines = line[3:].strip() or "text", number + 1, []
            else:
                blocks.append(Block(path, start, language, "\n".join(lines) + "\n"))
                language = None
        elif language is not None:
            lines.append(line)
    return blocks


def shell_blocks(path: Path) -> list[Block]:
    return [block for block in fenced_blocks(path) if block.language in SHELL_FENCES]


def doc_recipes(path: Path) -> dict[str, str]:
    """The recipe files a doc writes out in YAML blocks (`# finetune finetune news.yaml` as first line)."""
    recipes = {}
    for block in fenced_blocks(path):
        match = RECIPE_BLOCK.match(block.text.splitlines()[0]) if block.language == "yaml" and block.text else None
        if match:
            recipes[match["name"]] = block.text
    return recipes


def _recording_script(block: Block, record_dir: Path) -> str:
    """The block's text after functions that write each call's arguments, NUL-separated, to a file of its own
    (named by the clock, so calls in a pipe's subshells keep their order)."""
    shims = [
        '_record() { printf \'%s\\0\' "$@" > "$RECORD_DIR/$(date +%s%N)"; }',
        'command_not_found_handle() { _record "$@"; return 0; }',
    ]
    shims += [f'{program}() {{ _record {program} "$@"; }}' for program in RECORDED + RECORDED_PATHS]
    return f"RECORD_DIR={shlex.quote(str(record_dir))}\n" + "\n".join(shims) + "\n" + block.text


def expanded_commands(block: Block) -> list[Command]:
    """The block's commands as bash runs them (in an empty folder, with a PATH of basic tools only)."""
    with tempfile.TemporaryDirectory() as scratch:
        record_dir = Path(scratch) / "calls"
        record_dir.mkdir()
        work = Path(scratch) / "work"
        work.mkdir()
        result = subprocess.run(
            ["bash", "-c", _recording_script(block, record_dir)],
            cwd=work,
            env={"PATH": "/usr/bin:/bin", "HOME": scratch},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if "syntax error" in result.stderr:
            raise AssertionError(f"{block.where}: bash cannot read the block: {result.stderr.strip()}")
        calls = [
            path.read_bytes().split(b"\0")[:-1] for path in sorted(record_dir.iterdir(), key=lambda p: int(p.name))
        ]
    return [Command(call[0].decode(), tuple(arg.decode() for arg in call[1:]), block) for call in calls]


# ---------------------------------------------------------------------------------------------
# Checking a command without running it
# ---------------------------------------------------------------------------------------------


def check_command(command: Command, recipes_dir: Path) -> None:
    """Raise AssertionError naming the doc line and the command when the command cannot work as written.

    `recipes_dir` holds the recipe files the docs write out (news.yaml), for the commands that read them.
    """
    checks = {
        "finetune": check_finetune,
        ".venv/bin/finetune": check_finetune,
        "accelerate": check_accelerate,
        "make": check_make,
        ".venv/bin/python": check_python,
        "python": check_python,
        "srun": check_srun,
    }
    external = {"pip", ".venv/bin/pip", ".venv/bin/pre-commit", "tensorboard", "git", "curl", "scontrol"}  # not ours
    if command.program in external:
        return
    check = checks.get(command.program)
    if check is None:
        raise AssertionError(f"{command.block.where}: `{command}`: unknown program {command.program}")
    try:
        check(list(command.args), recipes_dir)
    except AssertionError as error:
        raise AssertionError(f"{command.block.where}: `{command}`: {error}") from None


def check_finetune(args: list[str], recipes_dir: Path) -> None:
    """The subcommand exists, its arguments and options parse, and a recipe with its overrides validates."""
    from finetune.cli import app
    from finetune.errors import UserError
    from finetune.recipes import load_recipe

    command = typer.main.get_command(app)
    names = []
    while hasattr(command, "commands") and args and not args[0].startswith("-"):  # a group: runs compare
        name = args.pop(0)
        assert name in command.commands, f"no such command {' '.join([*names, name])}"
        names.append(name)
        command = command.commands[name]
    try:
        context = command.make_context(" ".join(["finetune", *names]), args)
    except Exception as error:  # click's parse errors: an unknown option, a missing argument, a bad value
        raise AssertionError(f"the arguments do not parse: {error}") from None
    if names == ["recipes", "copy"]:
        shipped_recipe_file(context.params["name"])
    stages = RECIPE_COMMANDS.get(names[0] if names else "")
    if stages is None:
        return
    recipe_path = recipe_file(str(context.params["recipe"]), recipes_dir)
    try:  # paths are the reader's (data they download, runs made earlier): the keys and values are what is checked
        recipe = load_recipe(recipe_path, context.params.get("overrides") or [], check_paths=False)
    except UserError as error:
        raise AssertionError(f"the recipe is refused: {error}") from None
    assert recipe.stage in stages, f"`finetune {names[0]}` does not take a {recipe.stage} recipe"


def recipe_file(argument: str, recipes_dir: Path) -> Path:
    """The file a command's recipe argument reads, as the command finds it: a file the docs write out (or copy with
    `finetune recipes copy`), a path from the checkout's root, else a shipped recipe's name."""
    for folder in (recipes_dir, REPO_ROOT):
        if (folder / argument).is_file():
            return folder / argument
    return shipped_recipe_file(argument, f"no recipe file {argument}, nor a shipped recipe of that name")


def shipped_recipe_file(name: str, problem: str | None = None) -> Path:
    from finetune.errors import UserError
    from finetune.recipes.shipped import shipped_recipe

    try:
        return shipped_recipe(name)
    except UserError as error:
        raise AssertionError(problem or str(error)) from None


def check_accelerate(args: list[str], recipes_dir: Path) -> None:
    if args[:1] == ["config"]:
        return
    assert args[:1] == ["launch"] and "-m" in args, (
        "expected `accelerate config` or `accelerate launch ... -m finetune`"
    )
    module = args.index("-m") + 1
    assert args[module : module + 1] == ["finetune"], "accelerate launches `-m finetune`"
    check_finetune(args[module + 1 :], recipes_dir)


def check_srun(args: list[str], recipes_dir: Path) -> None:
    """SLURM's `srun [OPTIONS] accelerate launch ...`: the command it runs on every machine, checked as typed alone
    (the docs give srun options in --name=value form)."""
    while args and args[0].startswith("-"):
        args = args[1:]
    assert args[:1] == ["accelerate"], "srun runs `accelerate launch ... -m finetune` in the docs"
    check_accelerate(args[1:], recipes_dir)


def make_targets() -> set[str]:
    text = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([\w-]+):", text, flags=re.MULTILINE))


def check_make(args: list[str], recipes_dir: Path) -> None:
    targets = [arg for arg in args if not arg.startswith("-") and "=" not in arg]
    for target in targets or ["all"]:
        assert target in make_targets(), f"the Makefile has no target {target}"


def check_python(args: list[str], recipes_dir: Path) -> None:
    """`-m pytest FILE[::TEST]` (the file and test exist) or a script of ours and its --flags."""
    if args[:2] == ["-m", "pytest"]:
        for arg in args[2:]:
            if arg.startswith("-") or not arg.startswith("tests/"):
                continue
            file, _, test = arg.partition("::")
            assert (REPO_ROOT / file).is_file(), f"no test file {file}"
            if test:
                assert f"def {test}(" in (REPO_ROOT / file).read_text(encoding="utf-8"), f"no test {test} in {file}"
        return
    assert args and not args[0].startswith("-"), "expected a script or -m pytest"
    script = REPO_ROOT / args[0]
    assert script.is_file(), f"no script {args[0]}"
    source = script.read_text(encoding="utf-8")
    for flag in (arg.split("=")[0] for arg in args[1:] if arg.startswith("--")):
        assert f'"{flag}"' in source, f"{args[0]} has no option {flag}"
