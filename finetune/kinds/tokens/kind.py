"""Task kind tokens: a tag per word (named entities, parts of speech) from CoNLL column files, the family's own
token-classification head, scored entity by entity (seqeval) with a table per entity type."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from finetune.errors import recipe_key
from finetune.kinds.base import TaskKind
from finetune.kinds.tokens.evaluation import run_tagging_eval
from finetune.kinds.tokens.fine_tuning import TaggingFineTuning
from finetune.kinds.tokens.model import load_finetuned_tagger, model_tags, tagger_skeleton
from finetune.kinds.tokens.predictor import TaggingPredictor
from finetune.kinds.tokens.recipe import TokensSection
from finetune.models.hub import load_tokenizer
from finetune.reporting.model_card import CardKind, head_architecture, read_length
from finetune.tasks.specs import TaskSpec

PROFILED_TAGS = 9  # a tagging recipe without task.labels: CoNLL-2003's count (O and B-/I- of four entity types)


class TokensKind(TaskKind):
    name = "tokens"
    section = TokensSection
    fine_tuning_class = TaggingFineTuning

    def evaluate(self, recipe, spec: TaskSpec, accelerator) -> dict:
        return run_tagging_eval(recipe, spec, accelerator)

    def predictor(
        self, folder: str, recipe, spec: TaskSpec, batch_size: int, max_length: int | None
    ) -> TaggingPredictor:
        trusted = recipe.model.trust_remote_code
        with recipe_key("CHECKPOINT"):  # its tags are in the checkpoint, not the recipe
            model = load_finetuned_tagger(folder, trust_remote_code=trusted)
            tokenizer = load_tokenizer(folder, trust_remote_code=trusted)
        tagged = replace(spec, labels=model_tags(model))
        return TaggingPredictor(model, tokenizer, tagged, max_length or recipe.task.max_length, batch_size)

    def output_table(self, spec: TaskSpec, rows: list[dict]) -> tuple[list[dict], list[str]]:
        """The sentence, and its words' tags separated by spaces."""
        return [{**row, "tags": " ".join(row["tags"])} for row in rows], [*spec.text_columns, "tags"]

    def card(self, recipe, spec: TaskSpec, model_type: str, result: dict) -> CardKind:
        assert spec.labels is not None  # the tagging stage sets the tags (the recipe's or the training file's)
        length = read_length(recipe.task.max_length, model_type) or "all the"  # None: a recurrent model reads it all
        return CardKind(
            "token-classification",
            "tagger",
            self.section.auto_class_name,
            head_architecture(recipe, model_type),
            "texts.txt",
            "words",
            "a tag per word: " + ", ".join(spec.labels),
            f"reads at most {length} tokens of a sentence",
        )

    def profile_model(self, recipe, config) -> Any:
        # The tags are the training file's when the recipe does not list them: their count barely matters here.
        return tagger_skeleton(config, recipe.task.labels or ("O",) * PROFILED_TAGS, recipe.model.checkpoint)

    def profile_description(self, recipe, num_labels: int) -> str:
        if recipe.task.labels:
            return f"tagger, {num_labels} tags"
        return f"tagger (counted with {num_labels} tags; the run takes those of its training file)"


TOKENS = TokensKind()
