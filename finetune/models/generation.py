"""transformers' generation contract for this toolkit's own causal model types, so `model.generate(...)` works on
them as on GPT2LMHeadModel.

None of them has a key/value cache. Each carries its own state from one forward to the next instead, passed back
in under the keyword its forward takes (`state_keyword`): the AWD-LSTM's recurrent state ("hidden_state": each
new token is one step of the recurrence, nothing before it is read again), the causal transformer's memory of the
states that entered each layer ("memory"). The n-gram model carries nothing: its next-token distribution depends
on its last n - 1 tokens only, which is all it is given.

Greedy search and sampling only: beam search would have to reorder the carried state between beams, and
transformers reorders only its own Cache objects. The models read left to right and ignore attention masks, so a
left-padded batch of prompts of different lengths is refused rather than read wrong.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from transformers import GenerationMixin
from transformers.generation.configuration_utils import GenerationMode
from transformers.utils import ModelOutput


def refuse_padding(attention_mask: Tensor | None, model_name: str) -> None:
    """A prompt batch with padding would be read as text: these models take no attention mask."""
    if attention_mask is not None and not bool(attention_mask.all()):
        raise ValueError(
            f"{model_name} reads no padding: generate from one prompt at a time (num_return_sequences "
            "gives several samples of it)"
        )


class StatefulGenerationMixin(GenerationMixin):
    """`generate` for a model whose forward takes and returns its own carried state (see the module docstring)."""

    state_keyword: str | None = None  # the forward's keyword and the output's field holding the state; None: none
    _supported_generation_modes = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """No key/value Cache for generate to make: the state travels under `state_keyword`."""
        return False

    def prepare_inputs_for_generation(self, input_ids: Tensor, attention_mask: Tensor | None = None, **kwargs):
        """transformers' own (the tokens not read yet, the carried state among the keywords), refusing padding."""
        refuse_padding(attention_mask, type(self).__name__)
        return super().prepare_inputs_for_generation(input_ids, **kwargs)

    def _update_model_kwargs_for_generation(
        self,
        outputs: ModelOutput,
        model_kwargs: dict[str, Any],
        is_encoder_decoder: bool = False,
        num_new_tokens: int = 1,
    ) -> dict[str, Any]:
        """The state the forward returned goes in with the next token (without use_cache every step reads all)."""
        if self.state_keyword is not None and model_kwargs.get("use_cache", True):
            model_kwargs[self.state_keyword] = getattr(outputs, self.state_keyword)
        return super()._update_model_kwargs_for_generation(outputs, model_kwargs, is_encoder_decoder, num_new_tokens)
