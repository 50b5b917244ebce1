"""BERT's masking rule, as a pure function of the tokens and a random generator.

Of the non-special tokens, `probability` are chosen as prediction targets; of those,
`mask_fraction` become [MASK], `random_fraction` a random non-special token, the rest stay.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from finetune.errors import InputError
from finetune.tasks.specs import IGNORE_INDEX


@dataclass(frozen=True)
class MaskingRule:
    """The masking rates and the token ids they act on; `apply` is deterministic given the generator."""

    mask_token_id: int
    special_ids: np.ndarray  # never chosen, never drawn as a random replacement
    vocab_size: int
    probability: float = 0.15
    mask_fraction: float = 0.8
    random_fraction: float = 0.1
    # Whole-word masking: True at the ids of word-continuing pieces (`continuation_ids`); None: per token.
    continues_word: np.ndarray | None = None

    @classmethod
    def for_tokenizer(cls, tokenizer, masking_config) -> MaskingRule:
        """The rule for a Hugging Face tokenizer and a recipe's `masking` section."""
        return cls(
            mask_token_id=tokenizer.mask_token_id,
            special_ids=np.array(sorted(set(tokenizer.all_special_ids))),
            vocab_size=len(tokenizer),
            probability=masking_config.probability,
            mask_fraction=masking_config.mask_fraction,
            random_fraction=masking_config.random_fraction,
            continues_word=continuation_ids(tokenizer) if masking_config.whole_word else None,
        )

    @property
    def replacement_ids(self) -> np.ndarray:
        """The ordinary vocabulary that random replacements are drawn from (cached on first use)."""
        cached = self.__dict__.get("_replacement_ids")
        if cached is None:
            cached = np.setdiff1d(np.arange(self.vocab_size), self.special_ids)
            object.__setattr__(self, "_replacement_ids", cached)
        return cached

    def apply(self, token_ids: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Return (inputs, labels): labels hold the original id where chosen and IGNORE_INDEX elsewhere."""
        token_ids = np.asarray(token_ids)
        candidates = ~np.isin(token_ids, self.special_ids)
        # Draws are made per unit (a token, or a whole word) and spread over the unit's tokens, so
        # with whole-word masking a word is chosen, and masked / randomised / kept, as one piece.
        unit = self._unit_index(token_ids)
        units = int(unit[-1]) + 1 if unit.size else 0
        chosen = candidates & (rng.random(units) < self.probability)[unit]
        labels = np.where(chosen, token_ids, IGNORE_INDEX)
        action = rng.random(units)[unit]
        to_mask = chosen & (action < self.mask_fraction)
        to_randomise = chosen & (action >= self.mask_fraction) & (action < self.mask_fraction + self.random_fraction)
        inputs = token_ids.copy()
        inputs[to_mask] = self.mask_token_id
        inputs[to_randomise] = rng.choice(self.replacement_ids, size=int(to_randomise.sum()))
        return inputs, labels

    def _unit_index(self, token_ids: np.ndarray) -> np.ndarray:
        """For each position, the index of the unit it belongs to: itself, or the word it continues."""
        if self.continues_word is None:
            return np.arange(token_ids.size).reshape(token_ids.shape)
        starts = ~self.continues_word[token_ids]
        starts[..., 0] = True  # a block may open in the middle of a word: that piece starts a unit
        return np.cumsum(starts.ravel()).reshape(token_ids.shape) - 1


# How vocabularies mark words: WordPiece prefixes the pieces that continue a word ("##ing"); byte-level BPE (GPT-2,
# RoBERTa) and SentencePiece (XLM-R, ALBERT, DeBERTa-v3, Llama) prefix the pieces that start one, with the
# character that stands for the space before it (byte-level BPE: or for a line break, tab or carriage return).
CONTINUES_WORD_PREFIX = "##"
STARTS_WORD_PREFIXES = {"byte-level BPE": ("Ġ", "Ċ", "ĉ", "č"), "SentencePiece": ("▁",)}


def continuation_ids(tokenizer) -> np.ndarray:
    """A boolean per vocabulary id: True for the pieces that continue a word, by the convention the vocabulary
    follows (the one whose marks most of its pieces carry); special tokens always start a unit. A vocabulary with
    no such marks is refused."""
    vocabulary = tokenizer.get_vocab()
    continues = np.zeros(len(tokenizer), dtype=bool)
    wordpiece = sum(token.startswith(CONTINUES_WORD_PREFIX) for token in vocabulary)
    starts = {
        name: sum(token.startswith(marks) for token in vocabulary) for name, marks in STARTS_WORD_PREFIXES.items()
    }
    convention = max(starts, key=starts.__getitem__)
    if max(wordpiece, starts[convention]) == 0:
        raise InputError(
            "the tokenizer marks no word boundaries (no WordPiece ## pieces, no byte-level BPE or SentencePiece word "
            "starts), which whole-word masking reads"
        )
    special = set(tokenizer.all_special_ids)
    for token, index in vocabulary.items():
        if index >= len(continues) or index in special:
            continue
        if wordpiece >= starts[convention]:
            continues[index] = token.startswith(CONTINUES_WORD_PREFIX) and len(token) > len(CONTINUES_WORD_PREFIX)
        else:
            continues[index] = not token.startswith(STARTS_WORD_PREFIXES[convention])
    return continues
