"""Padding for fine-tuning: a padding token for a tokenizer without one, on the side every task kind reads, and the
model told which token it is.

Decoders' tokenizers (GPT-2's, Llama's, Mistral's, GPT-NeoX's) have no padding token. Batches then pad with the
end-of-text token, which the attention mask hides. A decoder's classifier (transformers' `*ForSequenceClassification`)
reads the state of each row's last token that is not `config.pad_token_id`, so the config must name the token the
batches pad with. Both are saved with the checkpoint: eval and predict pad and pool as training did.
"""

from __future__ import annotations

from finetune.console import console
from finetune.models.families import reads_left_to_right


def give_a_padding_token(tokenizer, checkpoint: str) -> None:
    """A tokenizer without a padding token pads with its end-of-text token (said in one line), on the right.

    Right: spans and tagging cut each row's padding off its end (kinds/spans/training.py,
    kinds/tokens/training.py), and a decoder with a learned position table (GPT-2) reads a left-padded row at other
    positions than it was pretrained on. Llama's and Gemma's tokenizers pad on the left for generation, which
    fine-tuning does not do.
    """
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is not None or tokenizer.eos_token is None:
        return  # one with neither is refused by the collator, where batches are padded (data/task_batches.py)
    tokenizer.pad_token = tokenizer.eos_token
    console.print(
        f"the tokenizer of {checkpoint} has no padding token: batches pad with its end-of-text token "
        f"{tokenizer.eos_token} (id {tokenizer.eos_token_id}), which the attention mask hides and a decoder's "
        "classifier skips; saved with the checkpoint",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def name_the_padding_token(model, tokenizer) -> None:
    """The model's config names the tokenizer's padding token: where it names none, and for a decoder, whose
    classifier pools the last token that is not padding, where it names another (a config's default, e.g.
    Gemma's 0, would make the classifier pool a padding position)."""
    config = model.config
    if config.pad_token_id is None or (reads_left_to_right(config) and config.pad_token_id != tokenizer.pad_token_id):
        config.pad_token_id = tokenizer.pad_token_id
