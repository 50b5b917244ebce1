"""The Markdown report of a GLUE evaluation: dev scores over runs, GLUE scores, missing tasks, submission."""

from __future__ import annotations

from finetune.glue.score import CONVENTIONS

STATISTICS = ("mean", "median", "std", "min", "max")


def percent(value: float) -> str:
    """A score x 100 with one decimal, as GLUE reports them."""
    return f"{100 * value:.1f}"


def glue_report_markdown(report: dict) -> str:
    """Tables of the report; scores x 100."""
    lines = [
        "# GLUE dev scores",
        "",
        "| task | metric | runs | " + " | ".join(STATISTICS) + " |",
        "|---|---|---:|" + "---:|" * len(STATISTICS),
    ]
    for result in report["tasks"].values():
        for metric, summary in result["summary"].items():
            cells = " | ".join(percent(summary[statistic]) for statistic in STATISTICS)
            lines.append(f"| {result['display_name']} | {metric} | {len(summary['values'])} | {cells} |")
    lines += ensemble_lines(report)
    lines += glue_score_lines(report)
    lines += ["", "## Missing tasks", "", ", ".join(report["missing_tasks"]) or "none: every GLUE task is scored"]
    left_out = report.get("left_out") or {}
    if left_out:  # listed in the recipe, left out by allow_incomplete
        lines += ["", "Listed but left out (allow_incomplete): " + "; ".join(f"{k} ({v})" for k, v in left_out.items())]
    lines += submission_lines(report.get("submission"))
    return "\n".join(lines) + "\n"


def ensemble_lines(report: dict) -> list[str]:
    """Each ensemble's members and their average, for the tasks scored by ensembles (none: no lines)."""
    ensembles = [result for result in report["tasks"].values() if "members" in result]
    if not ensembles:
        return []
    lines = [  # the task table's rows are the ensembles' own scores
        "",
        "## Ensembles: each member and their average (dev)",
        "",
        "| task | model | scores |",
        "|---|---|---|",
    ]
    for result in ensembles:
        rows = [(member["checkpoint"], member) for member in result["members"]]
        rows.append((f"ensemble of {len(result['members'])}", result["runs"][0]))
        for model, run in rows:
            scores = ", ".join(f"{metric} {percent(run[metric])}" for metric in result["metrics"])
            lines.append(f"| {result['display_name']} | {model} | {scores} |")
    return lines


def glue_score_lines(report: dict) -> list[str]:
    """The GLUE score under each convention, with the components present and the tasks missing; what each means."""
    lines = [
        "",
        "## GLUE score (dev, mean over runs)",
        "",
        "| convention | score | components | missing |",
        "|---|---:|---:|---|",
    ]
    for convention in CONVENTIONS:
        score = report["glue_scores"][convention.name]
        present, total = len(score["components"]), len(convention.components)
        if score["score"] is not None:
            value = percent(score["score"])
        elif score["mean_of_present"] is not None:
            value = f"incomplete (mean of the {present} present: {percent(score['mean_of_present'])})"
        else:
            value = "incomplete"
        lines.append(f"| {convention.name} | {value} | {present} of {total} | {', '.join(score['missing']) or '-'} |")
    return lines + [""] + [f"- **{convention.name}**: {convention.description}" for convention in CONVENTIONS]


def submission_lines(submission: dict | None) -> list[str]:
    """The leaderboard archive's files, each with the checkpoint that predicted it (none written: no lines)."""
    if submission is None:
        return []
    lines = [
        "",
        f"## Submission: {submission['archive']}",
        "",
        "| file | task | rows | checkpoint (best on dev) |",
        "|---|---|---:|---|",
    ]
    for file_name, entry in submission["files"].items():
        lines.append(f"| {file_name} | {entry['task']} | {entry['rows']} | {entry['checkpoint']} |")
    lines += [
        "",
        f"Missing from the archive: {', '.join(submission['missing'])}"
        if submission["missing"]
        else "Complete: every task of the leaderboard has its file.",
    ]
    return lines
