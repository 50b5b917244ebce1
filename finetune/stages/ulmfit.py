"""`finetune ulmfit`: ULMFiT's three stages as one run, each by its existing stage code, checkpoints wired.

1. a general-domain language model (`run_pretrain` into RUN_DIR/1-general-lm), or an existing one
   (`general_lm: {checkpoint: PATH}`);
2. that model fine-tuned on the target task's own text (`run_pretrain` into RUN_DIR/2-target-lm);
3. the classifier on it, with gradual unfreezing (`run_finetune` into RUN_DIR/3-classifier).

The recipe wired the checkpoints and validated every section when it loaded; stages/flows.py runs the stages as
every flow does (inputs read before the first stage, finished stages kept by --resume, a stopped one continued).
RUN_DIR holds the flow's recipe.yaml and, at the end, result.json: each stage's checkpoint and main scores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from finetune.console import console
from finetune.recipes import ULMFIT_STAGE_FOLDERS, FinetuneRecipe, PretrainedLanguageModel, UlmfitRecipe
from finetune.recipes.ulmfit import ULMFIT_UPSTREAM
from finetune.stages.finetune import RESULT_FILE, run_finetune
from finetune.stages.flows import (
    FlowShape,
    fine_tuned_output,
    fine_tuned_scores,
    last_validation,
    run_flow,
    section_key_rows,
)
from finetune.stages.pretrain import CHECKPOINT_DIR, run_pretrain

STAGE_TITLES = {
    "general_lm": "general-domain language model",
    "target_lm": "language model on the task's text",
    "classifier": "classifier",
}


def run_ulmfit(recipe: UlmfitRecipe, resume: bool = False) -> Path:
    """Run the flow (or, `resume`, finish a stopped one); returns the classifier's checkpoint folder (seeds: the
    classifier stage's folder)."""
    return run_flow(recipe, ULMFIT, resume)


def stage_code(section: str):
    """The stage code that runs a section (looked up here when it runs, so that a test may stand in for it)."""
    return run_finetune if section == "classifier" else run_pretrain


def announce_given_model(recipe: UlmfitRecipe) -> None:
    """A general_lm given as {checkpoint: PATH} is not trained: say so where stage 1 would have started."""
    if isinstance(recipe.general_lm, PretrainedLanguageModel):
        console.print(
            f"[bold]ulmfit stage 1 of 3: {STAGE_TITLES['general_lm']}[/bold]: {recipe.general_lm.checkpoint} as "
            f"given (not trained again); stage 2 continues it (model.family {recipe.target_lm.model.family}: "
            f"{'masked' if recipe.target_lm.model.masked_lm else 'next-token'} language modelling)"
        )


def classifier_output(classifier: FinetuneRecipe) -> Path:
    """What stage 3 leaves: its checkpoint folder, or with seeds (draws) its run directory."""
    return fine_tuned_output(classifier)


def summarise_flow(recipe: UlmfitRecipe) -> dict:
    """Each stage's folder, checkpoint and main scores: the language models' last validation, the dev scores."""
    summary: dict[str, dict[str, Any]] = {}
    for section, stage in recipe.stage_recipes().items():
        if stage is None:
            assert isinstance(recipe.general_lm, PretrainedLanguageModel)  # stage_recipes: None for it only
            summary[section] = {"checkpoint": str(recipe.general_lm.checkpoint), "trained": False}
            continue
        entry: dict[str, Any] = {"run_dir": str(stage.run_dir), "checkpoint": str(Path(stage.run_dir) / CHECKPOINT_DIR)}
        if isinstance(stage, FinetuneRecipe):
            entry.update(fine_tuned_scores(stage))
        else:
            entry.update(last_validation(Path(stage.run_dir)))
        summary[section] = entry
    return summary


def summary_line(summary: dict, run_dir: Path) -> str:
    """One line for the console: stage 2's validation perplexity, the classifier's main dev score, where it is."""
    parts = []
    perplexity = summary["target_lm"].get("validation_perplexity")
    if perplexity is not None:
        parts.append(f"target LM validation perplexity {perplexity:.1f}")
    classifier = summary["classifier"]
    score = classifier["dev"].get(f"dev_{classifier['main_metric']}")
    over_seeds = classifier["checkpoint"] is None
    if score is not None:
        parts.append(
            f"classifier dev {classifier['main_metric']} {score:.4f}" + (" (mean of the seeds)" if over_seeds else "")
        )
    saved = (
        f"classifiers saved in {classifier['run_dir']}"
        if over_seeds
        else f"classifier saved to {classifier['checkpoint']}"
    )
    return f"ulmfit: {', '.join(parts)}; {saved}; summary in {run_dir / RESULT_FILE}"


def describe_flow_keys() -> list[tuple[str, str, str, str]]:
    """Rows for `finetune recipes --keys ulmfit`: stages/flows.py's, with general_lm's other form."""
    sections = {"general_lm": "pretrain", "target_lm": "pretrain", "classifier": "finetune"}
    rows = section_key_rows(UlmfitRecipe, sections)
    checkpoint = PretrainedLanguageModel.model_fields["checkpoint"]
    at = next(index for index, row in enumerate(rows) if row[0] == "general_lm.*") + 1
    rows.insert(at, ("general_lm.checkpoint", "Path", "(instead of the recipe)", checkpoint.description or ""))
    return rows


ULMFIT = FlowShape(
    name="ulmfit",
    folders=ULMFIT_STAGE_FOLDERS,
    titles=STAGE_TITLES,
    run_stage=stage_code,
    output=lambda recipe: classifier_output(recipe.classifier),
    summarise=summarise_flow,
    summary_line=summary_line,
    upstream=ULMFIT_UPSTREAM,
    announce=announce_given_model,
)
