"""`finetune intermediate`: intermediate-task training (STILTs) as one run, each stage by `run_finetune`.

1. the intermediate task (A) from intermediate.model.checkpoint, into RUN_DIR/1-intermediate;
2. the target task (B) from stage 1's checkpoint, its encoder under a new head (model.new_head), into
   RUN_DIR/2-target (with target.seeds, once per seed from the one stage-1 checkpoint);
3. with compare (the default), B again from intermediate.model.checkpoint, the same section and seeds, into
   RUN_DIR/3-target-alone: what B scores without A.

stages/flows.py runs them as every flow does (inputs read before the first stage, finished stages kept by --resume,
a stopped one continued; stage 3 does not start from stage 1, so it is kept when only stage 1 runs again). RUN_DIR
holds the flow's recipe.yaml and, at the end, result.json (each stage's checkpoint and dev scores, and B's gain from
A) and report.md (the comparison as a table).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from finetune.recipes import IntermediateRecipe, read_yaml
from finetune.recipes.intermediate import INTERMEDIATE_SECTIONS, INTERMEDIATE_STAGE_FOLDERS, INTERMEDIATE_UPSTREAM
from finetune.stages.finetune import RESULT_FILE, run_finetune
from finetune.stages.flows import FlowShape, fine_tuned_output, fine_tuned_scores, run_flow, section_key_rows
from finetune.stages.pretrain import CHECKPOINT_DIR
from finetune.training.checkpoints import HYPERPARAMETERS_FILE

REPORT_FILE = "report.md"
STAGE_TITLES = {
    "intermediate": "the intermediate task",
    "target": "the target task from the intermediate task's encoder",
    "target_alone": "the target task without the intermediate one",
}


def run_intermediate(recipe: IntermediateRecipe, resume: bool = False) -> Path:
    """Run the flow (or, `resume`, finish a stopped one); returns the target's checkpoint folder (with seeds: the
    target stage's folder)."""
    return run_flow(recipe, INTERMEDIATE, resume)


def stage_code(section: str):
    """The stage code that runs a section (looked up here when it runs, so that a test may stand in for it)."""
    return run_finetune


def describe_flow_keys() -> list[tuple[str, str, str, str]]:
    """Rows for `finetune recipes --keys intermediate` (stages/flows.py's)."""
    return section_key_rows(IntermediateRecipe, dict.fromkeys(INTERMEDIATE_SECTIONS, "finetune"))


def summarise(recipe: IntermediateRecipe) -> dict:
    """Each stage's folder, checkpoint and dev scores, and the target's gain from the intermediate task on its main
    metric (a mean over the seeds where it ran several); report.md beside the summary shows the comparison."""
    summary: dict[str, Any] = {}
    for section, stage in recipe.stage_recipes().items():
        if stage is None:
            continue
        entry = {"run_dir": str(stage.run_dir), "checkpoint": str(Path(stage.run_dir) / CHECKPOINT_DIR)}
        summary[section] = {**entry, "task": stage.task.name, **fine_tuned_scores(stage)}
        summary[section]["method"] = method_trained(summary[section])
    methods = {summary[section]["method"] for section in ("target", "target_alone") if section in summary}
    if len(methods) > 1:  # method auto decides on each checkpoint: stage 1's may be a sentence-embedding model
        summary["warning"] = (
            f"the target trained with method {summary['target']['method']}, the target alone with "
            f"{summary['target_alone']['method']} (method auto decided on each starting checkpoint): set "
            "target.method to compare like with like"
        )
    if "target_alone" in summary:
        metric = summary["target"]["main_metric"]
        with_it, without = (summary[section]["dev"].get(f"dev_{metric}") for section in ("target", "target_alone"))
        if with_it is not None and without is not None:
            summary["gain"] = {"metric": metric, "with_intermediate": with_it, "without": without,
                               "difference": with_it - without}  # fmt: skip
    (Path(recipe.run_dir) / REPORT_FILE).write_text(report(summary), encoding="utf-8")
    return summary


def method_trained(entry: dict) -> str | None:
    """How a fine-tuning stage trained (its checkpoint's saved recipe: method auto decided), its first seed's."""
    checkpoint = entry["checkpoint"] or entry["checkpoints"][0]
    saved = read_yaml(Path(checkpoint) / HYPERPARAMETERS_FILE)
    return saved.get("method")


def report(summary: dict) -> str:
    """report.md: each stage's task and main dev score (mean, and each seed's, where seeds ran), and the gain."""
    intermediate, target = summary["intermediate"], summary["target"]
    lines = [
        f"# Intermediate-task training: {intermediate['task']} before {target['task']}",
        "",
        "| stage | task | starts from | method | dev " + target["main_metric"] + " | runs |",
        "|---|---|---|---|---:|---|",
    ]
    starts = {"intermediate": "model.checkpoint", "target": "stage 1's encoder, a new head",
              "target_alone": "model.checkpoint, a new head"}  # fmt: skip
    for section in INTERMEDIATE_STAGE_FOLDERS:
        if section not in summary:
            continue
        entry = summary[section]
        metric = entry["main_metric"]
        score = entry["dev"].get(f"dev_{metric}")
        values = entry.get("spread", {}).get(f"dev_{metric}", {}).get("values")
        runs = ", ".join(f"{value:.4f}" for value in values) if values else "one run"
        shown = "-" if score is None else f"{score:.4f}" + ("" if metric == target["main_metric"] else f" ({metric})")
        lines.append(f"| {section} | {entry['task']} | {starts[section]} | {entry['method']} | {shown} | {runs} |")
    if "warning" in summary:
        lines += ["", f"Note: {summary['warning']}."]
    if "gain" in summary:
        gain = summary["gain"]
        gained = f"{gain['difference']:+.4f} {gain['metric']}"
        against = f"{gain['with_intermediate']:.4f} against {gain['without']:.4f} without"
        lines += ["", f"{target['task']} with {intermediate['task']} first: {gained} ({against})."]
    return "\n".join(lines) + "\n"


def summary_line(summary: dict, run_dir: Path) -> str:
    """One line for the console: the target's main dev score, its gain from the intermediate task, where it is."""
    target = summary["target"]
    score = target["dev"].get(f"dev_{target['main_metric']}")
    parts = [] if score is None else [f"target dev {target['main_metric']} {score:.4f}"]
    if "gain" in summary:
        parts.append(f"{summary['gain']['difference']:+.4f} over the target alone")
    if target.get("checkpoint") is None:
        parts[-1:] = [parts[-1] + " (mean of the seeds)"] if parts else []
    warning = f" (note: {summary['warning']})" if "warning" in summary else ""
    where = f"report in {run_dir / REPORT_FILE}, summary in {run_dir / RESULT_FILE}"
    return f"intermediate: {', '.join(parts)}{warning}; {where}"


INTERMEDIATE = FlowShape(
    name="intermediate",
    folders=INTERMEDIATE_STAGE_FOLDERS,
    titles=STAGE_TITLES,
    run_stage=stage_code,
    output=lambda recipe: fine_tuned_output(recipe.target),
    summarise=summarise,
    summary_line=summary_line,
    upstream=INTERMEDIATE_UPSTREAM,
)
