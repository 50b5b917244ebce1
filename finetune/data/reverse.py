"""Backward language models (ULMFiT section 3.3): text read from its last token to its first.

A backward LM is pretrained on every document's token ids reversed (`corpus.reverse: true`), after tokenisation,
so that BPE pieces stay whole and only their order changes; the separator still follows each document. Its
checkpoint says so in config.json (`finetune_reverse: true`), and everything that reads text for such a model
reads it the same way: continued pretraining, the classifier's training and dev text, `finetune eval` and
`finetune predict`. A bidirectional classifier (a forward and a backward encoder, `reads_both_directions`) is given
both: `input_ids` forwards and `backward_input_ids` reversed by the same rule. A classifier fine-tuned from it
keeps the key (the config is copied), so it is read backwards too. Forward models have no key at all: their config.json
is what it always was.

The ids are never stored reversed: the token cache holds forward ids and `read_backwards` makes a view that
`DocumentStream` reads from each document's end (data/token_arrays.py), so one cache entry serves both directions
and a cached forward corpus cannot reach a backward run unreversed.
"""

from __future__ import annotations

import dataclasses

from finetune.data.token_arrays import TokenizedDocuments
from finetune.errors import InputError

REVERSE_CONFIG_KEY = "finetune_reverse"  # in a checkpoint's config.json: true for a model that reads backwards


def reads_backwards(config) -> bool:
    """Whether a model with this config reads text backwards (a mean-pooling head: its encoder's config says)."""
    encoder = getattr(config, "encoder", None)  # models/mean_pooling.py keeps the backbone's config there
    return bool(getattr(config, REVERSE_CONFIG_KEY, False) or getattr(encoder, REVERSE_CONFIG_KEY, False))


def reads_both_directions(config) -> bool:
    """Whether a model reads each text forwards and backwards (the AWD-LSTM's bidirectional classifier: ELMo's biLM,
    `model.backward_checkpoint`): it takes the reversed ids as `backward_input_ids` beside `input_ids`."""
    return bool(getattr(config, "classifier_bidirectional", False))


def mark_backwards(config) -> None:
    """Record in a model's config (saved to config.json) that it reads text backwards."""
    setattr(config, REVERSE_CONFIG_KEY, True)


def pretraining_direction(requested: bool | None, continued_config, checkpoint: str | None) -> bool:
    """Whether a pretraining run reads backwards: `corpus.reverse` as given, or (null) as the continued checkpoint
    reads; a checkpoint that reads the other way than `corpus.reverse` asks is refused (its weights learnt the other
    direction: continuing it would unlearn it)."""
    stored = continued_config is not None and reads_backwards(continued_config)
    if requested is None or continued_config is None:
        return bool(requested) or stored
    if requested != stored:
        direction = "backwards" if stored else "forwards"
        raise InputError(
            f"{str(requested).lower()}, but model.checkpoint {checkpoint} reads text {direction}; "
            "remove corpus.reverse (null follows the checkpoint) or continue a "
            f"{'forward' if stored else 'backward'} model",
            value=requested,
        )
    return requested


def read_backwards(documents: TokenizedDocuments) -> TokenizedDocuments:
    """The same documents, each read from its last token to its first (a view: no id is copied or rewritten)."""
    return dataclasses.replace(documents, backwards=True)


def reverse_segments(input_ids: list[int], sequence_ids: list[int | None]) -> list[int]:
    """An encoded example with the tokens of each text segment in reverse order, special tokens left in place.

    For a pair, each text is reversed where it stands: [CLS] a1 a2 [SEP] b1 b2 [SEP] becomes [CLS] a2 a1 [SEP] b2 b1
    [SEP], not the whole sequence turned round ([SEP] b2 b1 [SEP] a2 a1 [CLS]). The backward LM read every document
    backwards but the documents in their order, each after a separator, and the family's template (which text comes
    first, its token type, where the special tokens go) is what the classifier's head reads (BERT's [CLS] in front,
    GPT-2's last token): only the reading direction inside each text changes. Truncation has already cut the forward
    text, so the forward and the backward classifier of an ensemble see the same tokens.
    `sequence_ids` is the fast tokenizer's segment of every position (None: a special token).
    """
    reversed_ids = list(input_ids)
    for segment in {segment for segment in sequence_ids if segment is not None}:
        positions = [position for position, owner in enumerate(sequence_ids) if owner == segment]
        for position, source in zip(positions, reversed(positions)):
            reversed_ids[position] = input_ids[source]
    return reversed_ids
