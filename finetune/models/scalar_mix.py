"""ELMo's scalar mix (Peters et al. 2018, eq. 1): a task head reads gamma * sum_j softmax(w)_j h_j over every layer.

`pooling: scalar_mix` puts one in front of a classifier's pooling: h_0 is the embedding output, h_1 ... h_L the
layers' outputs, w one learned weight per layer and gamma one learned scale. Both belong to the head (its layer
group, its learning rate, trained even while the backbone is frozen, as in ELMo, where the biLM is fixed).

Layers of different widths cannot be summed: `ProjectedScalarMix` first maps each layer that is not `width` wide
to it with a learned linear map of its own (the AWD-LSTM's inner layers are wider than its top one). For ELMo's biLM
(a forward and a backward AWD-LSTM) it also takes the backward model's layers: layer j enters the mix as the
concatenation [forward_j; backward_j], each half projected by its own map, under one weight per layer, as ELMo
mixes its concatenated biLM states.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from transformers import initialization as init


class ScalarMix(nn.Module):
    """gamma * sum_j softmax(w)_j h_j over a fixed number of same-shaped layer outputs h_j."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.layer_weights = nn.Parameter(torch.zeros(num_layers))  # w; all 0: softmax shares 1/L, the plain mean
        self.gamma = nn.Parameter(torch.ones(()))  # the scale, 1 at the start (ELMo's gamma)

    def reset_parameters(self) -> None:
        """w = 0, gamma = 1: the mean of the layers. transformers' init functions skip tensors loaded from a file."""
        init.zeros_(self.layer_weights)
        init.ones_(self.gamma)

    def forward(self, layers: Sequence[Tensor]) -> Tensor:
        """(batch, time, size) each, embedding output first -> their mix, of the same shape."""
        if len(layers) != self.layer_weights.numel():  # a model built for another depth: a bug, not a user mistake
            raise ValueError(f"scalar mix of {self.layer_weights.numel()} layers was given {len(layers)}")
        shares = torch.softmax(self.layer_weights, dim=0)
        # A running sum, not torch.stack: stacking would hold one more copy of every layer's states.
        mixed = shares[0] * layers[0]
        for share, layer in zip(shares[1:], layers[1:]):
            mixed = mixed + share * layer
        return self.gamma * mixed


def width_projections(widths: Sequence[int], width: int) -> nn.ModuleList:
    """A map to `width` for each layer width: Identity where it already fits (no parameters: the layer enters the mix
    unchanged), else a linear map without bias."""
    return nn.ModuleList(nn.Identity() if size == width else nn.Linear(size, width, bias=False) for size in widths)


class ProjectedScalarMix(nn.Module):
    """A scalar mix of layers of several widths: each one not `width` wide is projected to it first (no bias).

    `bidirectional`: a second, backward stack of layers of the same widths, each projected by maps of its own
    (`backward_projections`) and concatenated after the forward one: the mix is then (batch, time, 2 * width).
    """

    def __init__(self, widths: Sequence[int], width: int, bidirectional: bool = False):
        super().__init__()
        self.projections = width_projections(widths, width)
        self.backward_projections = width_projections(widths, width) if bidirectional else None
        self.mix = ScalarMix(len(widths))

    def forward(self, layers: Sequence[Tensor], backward_layers: Sequence[Tensor] | None = None) -> Tensor:
        """(batch, time, widths[j]) for each layer j -> (batch, time, width); with the backward model's layers too,
        (batch, time, 2 * width).

        Each half is projected on its own and the mix is linear, so the forward half of the result depends on the
        forward layers alone and the backward half on the backward ones: the backward layers may be in the backward
        model's reading order (position p: its p-th token read), and both halves still pool as ELMo's aligned states
        would under an order-free pooling.
        """
        if (backward_layers is None) != (self.backward_projections is None):
            raise ValueError("backward layers must be given exactly when the mix was built bidirectional")
        projected = [projection(layer) for projection, layer in zip(self.projections, layers)]
        if backward_layers is not None and self.backward_projections is not None:  # both or neither (above)
            projected = [
                torch.cat([forward, projection(backward)], dim=-1)
                for forward, projection, backward in zip(projected, self.backward_projections, backward_layers)
            ]
        return self.mix(projected)
