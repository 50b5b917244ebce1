"""`finetune eval` of taggers: entity-level scores and a table per entity type."""

from __future__ import annotations

from pathlib import Path

from finetune.data.task_files import task_file
from finetune.errors import recipe_key
from finetune.kinds.evaluation import load_each, models_of, one_task, refuse_ensembles, task_folder, tokenizer_of
from finetune.kinds.tokens.data import read_conll, tag_indices
from finetune.kinds.tokens.metrics import entity_types_table, tagging_metrics
from finetune.kinds.tokens.model import load_finetuned_tagger, model_tags
from finetune.kinds.tokens.spec import tagging_spec
from finetune.kinds.tokens.training import tag_sentences
from finetune.recipes import EvalRecipe
from finetune.reporting.eval_report import PREDICTIONS_DIR, report_markdown, task_report
from finetune.run_dir import prepare_run_dir
from finetune.tasks.specs import TaskSpec
from finetune.training.checkpoints import checkpoint_reading


def run_tagging_eval(recipe: EvalRecipe, spec: TaskSpec, accelerator) -> dict:
    """Score every tagger of `models` on `split` of a tagging task: entity-level scores and a table per entity
    type; with write_predictions, predictions/MODEL.txt in CoNLL columns (word, tag, predicted tag)."""
    refuse_ensembles(recipe, "taggers (task kind tokens)")
    path = task_file(spec, task_folder(recipe), recipe.split)
    sentences = read_conll(path, tagging_spec(spec).tag_column)
    assert sentences.tags is not None  # read_conll reads the tags (with_tags) or refuses the file
    taggers = load_each(recipe, load_finetuned_tagger)
    for name, model in taggers.items():  # a tag the model does not know is one line naming file and line
        with recipe_key(f"models.{name}"):
            tag_indices(sentences, model_tags(model))
    run_dir = prepare_run_dir(recipe, accelerator.is_main_process)
    results = {}
    for name, model in taggers.items():
        checkpoint = models_of(recipe)[name]
        tokenizer = tokenizer_of(recipe, name)
        max_length = checkpoint_reading(checkpoint, one_task(recipe).max_length).max_length
        predicted = tag_sentences(
            model,
            tokenizer,
            sentences,
            model_tags(model),
            max_length,
            recipe.batch_size,
            accelerator.device,
            name=recipe.split,
        )
        results[name] = {
            "checkpoint": checkpoint,
            **tagging_metrics(sentences.tags, predicted),
            "entity_types": entity_types_table(sentences.tags, predicted),
        }
        if recipe.write_predictions and accelerator.is_main_process:
            write_tagged(run_dir / PREDICTIONS_DIR / f"{name}.txt", sentences, predicted)
    return task_report(
        run_dir, recipe, spec, len(sentences.words), results, tagging_report_markdown, accelerator.is_main_process
    )


def write_tagged(path: Path, sentences, predicted: list[list[str]]) -> None:
    """CoNLL columns: word, its tag in the file, the predicted tag; a blank line after each sentence."""
    path.parent.mkdir(parents=True, exist_ok=True)
    blocks = [
        "\n".join(f"{word} {tag} {guess}" for word, tag, guess in zip(words, tags, guesses))
        for words, tags, guesses in zip(sentences.words, sentences.tags, predicted)
    ]
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")


def tagging_report_markdown(report: dict) -> str:
    """The scores table of every tagger, then each tagger's table per entity type."""
    lines = [report_markdown(report)]
    for name, result in report["results"].items():
        lines += [
            f"## {name}: by entity type",
            "",
            "| type | entities | precision | recall | f1 |",
            "|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {kind} | {row['entities']:,} | {100 * row['precision']:.1f} | {100 * row['recall']:.1f} | "
            f"{100 * row['f1']:.1f} |"
            for kind, row in result["entity_types"].items()
        ]
        lines.append("")
    return "\n".join(lines)
