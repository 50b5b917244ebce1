"""What a Python call of a stage returns: the run's folder, its checkpoint, its scores and its metrics history."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune.run_dir import METRICS_FILE, read_metrics


@dataclass
class RunResult:
    """One finished run: `metrics` are the saved checkpoint's dev scores (finetune; of several runs, seeds.json's
    summary and `checkpoint` the run folder), the report's scores (evaluate) or the last logged values (pretrain);
    `history` holds metrics.jsonl's records, one per logged step."""

    run_dir: Path
    checkpoint: Path | None
    metrics: dict[str, Any] = field(default_factory=dict)
    best_step: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list, repr=False)
    # evaluate: the whole report (report.json); ulmfit: the flow's summary (every stage's scores)
    report: dict[str, Any] | None = field(default=None, repr=False)

    @classmethod
    def of_run(cls, run_dir: Path | str, checkpoint: Path | None) -> RunResult:
        """The result of a finished training run, read from its folder."""
        from finetune.kinds.fine_tuning import RESULT_FILE  # late: the stages import torch
        from finetune.stages.seeds import SUMMARY_JSON

        run_dir = Path(run_dir)
        history = read_metrics(run_dir / METRICS_FILE) if (run_dir / METRICS_FILE).is_file() else []
        summary = _json(run_dir / SUMMARY_JSON) or _json(run_dir / RESULT_FILE)  # several runs: the whole summary
        if summary is not None and isinstance(summary.get("best"), dict):
            return cls(run_dir, checkpoint, dict(summary["best"]), summary.get("best_step"), history)
        if summary is not None:  # several runs (seeds, draws): each metric's mean, median, interval, ... over them
            return cls(run_dir, checkpoint, summary, None, history)
        last = {key: value for record in history for key, value in record.items() if isinstance(value, int | float)}
        return cls(run_dir, checkpoint, last, None, history)

    @classmethod
    def of_evaluation(cls, run_dir: Path | str, report: dict[str, Any]) -> RunResult:
        """The result of an eval run: each scored model's (or ensemble's) scores by its name."""
        results = report.get("results", {})
        metrics: dict[str, Any] = {
            name: {key: value for key, value in row.items() if isinstance(value, int | float)}
            for name, row in results.items()
            if isinstance(row, dict)
        }
        if len(metrics) == 1:  # one model: its scores themselves
            metrics = next(iter(metrics.values()))
        return cls(Path(run_dir), None, metrics, report=report)


def _json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
