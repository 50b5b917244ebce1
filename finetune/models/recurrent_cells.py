"""The recurrent layers an AWD-LSTM stack can be made of (config.cell), each with its DropConnect.

- "lstm" and "rnn" (tanh): PyTorch's nn.LSTM / nn.RNN under `WeightDropout`, AWD-LSTM's DropConnect on the
  hidden-to-hidden weights.
- "qrnn": the quasi-recurrent layer of Bradbury et al. (2016), as MultiFiT (Eisenschlos et al. 2019) and fastai's
  AWD-QRNN use it in place of the LSTM, `QRNNLayer`.

Every layer is called as layer(inputs (batch, time, features), state or None) -> (outputs, state). Its state,
the tensors it carries from one batch to the next, is a tuple named by its `state_names`, each tensor
(1, batch, size) as in PyTorch's recurrent modules: LSTM (hidden, cell); RNN (hidden,); QRNN (cell,), and with
window 2 (cell, previous_input).

A QRNN layer computes every gate of the whole sequence in one matrix product, a causal convolution over time
(window 1 reads x_t; window 2 reads [x_t, x_{t-1}]), which leaves only an elementwise recurrence, fo-pooling:

    z_t = tanh(W_z s_t + b_z),  f_t = sigmoid(W_f s_t + b_f),  o_t = sigmoid(W_o s_t + b_o)
    c_t = f_t * c_{t-1} + (1 - f_t) * z_t
    h_t = o_t * c_t

There is no hidden-to-hidden matrix, so DropConnect (AWD-LSTM's weight dropout) masks W, the convolution's weights,
as fastai does. The recurrence runs as a tight loop of one fused multiply-add per time step over (batch, size)
slices, forward and backward (`forget_mult`): autograd never records the steps one by one.
"""

from __future__ import annotations

import math
import warnings
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

LayerState = tuple[Tensor, ...]  # one layer's state, named by its `state_names` (see above)

# cuDNN warns at every call when an LSTM's weights are not one packed buffer; under DropConnect they never are.
_UNPACKED_WEIGHTS_WARNING = "RNN module weights are not part of single contiguous chunk of memory"


class _NeverPacked:
    """Mixed into nn.LSTM / nn.RNN: they never pack their weights into cuDNN's single buffer."""

    def flatten_parameters(self) -> None:
        """Do nothing: WeightDropout hands the module a new hidden-to-hidden tensor at every call.

        nn.LSTM re-packs (on cuDNN) whenever a weight object changes: at every call here, copying all weights and
        moving the real parameters to new storage in place, under graphs that may still need them (ULMFiT's
        classifier runs the encoder over many chunks of a document before one backward).
        """


class _UnpackedLSTM(_NeverPacked, nn.LSTM):
    """An nn.LSTM that never packs its weights."""


class _UnpackedRNN(_NeverPacked, nn.RNN):
    """An nn.RNN (tanh) that never packs its weights."""


class WeightDropout(nn.Module):
    """One batch-first LSTM (or tanh RNN) layer, DropConnect on its hidden-to-hidden weights (a fresh mask per call).

    The PyTorch module is the submodule named after the cell ("lstm" or "rnn"): its weights' names in checkpoints.
    """

    def __init__(self, input_size: int, hidden_size: int, p: float, cell: Literal["lstm", "rnn"] = "lstm"):
        super().__init__()
        self.input_size, self.hidden_size, self.p, self.cell = input_size, hidden_size, p, cell
        self.state_names = ("hidden", "cell") if cell == "lstm" else ("hidden",)
        recurrent = {"lstm": _UnpackedLSTM, "rnn": _UnpackedRNN}[cell](input_size, hidden_size, batch_first=True)
        self.add_module(cell, recurrent)
        # The raw weight lives here, so it is what optimizers train and checkpoints store; the module only ever
        # sees a masked copy, set just for the duration of a call.
        self.weight_hh_l0_raw = recurrent.weight_hh_l0
        del recurrent.weight_hh_l0  # unregister first: assigning None to a parameter name keeps the name
        recurrent.weight_hh_l0 = None

    def forward(self, inputs: Tensor, state: LayerState | None = None) -> tuple[Tensor, LayerState]:
        """(outputs, state: LSTM (h, c), RNN (h,)) for `inputs` of shape (batch, time, input_size)."""
        recurrent = self.get_submodule(self.cell)
        raw = self.weight_hh_l0_raw
        # view_as in eval: assigning the Parameter itself would register it as a parameter of the module.
        weight = F.dropout(raw, self.p, training=True) if self.training and self.p > 0 else raw.view_as(raw)
        # nn.LSTM reads a cached list of weights; its __setattr__ updates that list for names it knows.
        recurrent.weight_hh_l0 = weight
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_UNPACKED_WEIGHTS_WARNING)
                if self.cell == "lstm":
                    return recurrent(inputs, state)
                outputs, hidden = recurrent(inputs, None if state is None else state[0])  # nn.RNN's state: bare h
                return outputs, (hidden,)
        finally:
            # Drop the masked copy: a module holding a non-leaf tensor cannot be deep-copied or pickled.
            # torch's stub types a module's attributes Tensor | Module; nn.Module.__setattr__ takes None as well
            recurrent.weight_hh_l0 = None  # type: ignore[assignment]  # torch's stub refuses None; run time takes it


class _ForgetMult(torch.autograd.Function):
    """c_t = f_t * c_{t-1} + g_t over the leading (time) dimension, with its backward written out as the same
    recurrence run in reverse: dL/dg_t = dL/dc_t + f_{t+1} * dL/dg_{t+1}, dL/df_t = dL/dg_t * c_{t-1}."""

    @staticmethod
    def forward(ctx, forget: Tensor, candidate: Tensor, initial: Tensor) -> Tensor:
        cells = torch.empty_like(candidate)
        previous = initial
        for step in range(candidate.shape[0]):
            previous = torch.addcmul(candidate[step], forget[step], previous, out=cells[step])
        ctx.save_for_backward(forget, cells, initial)
        return cells

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_cells: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        forget, cells, initial = ctx.saved_tensors
        # The gradient reaching each c_t through every later step: also the candidate's, since dc_t/dg_t = 1.
        grad_candidate = torch.empty_like(cells)
        grad_candidate[-1] = grad_cells[-1]
        for step in range(cells.shape[0] - 2, -1, -1):
            torch.addcmul(grad_cells[step], forget[step + 1], grad_candidate[step + 1], out=grad_candidate[step])
        previous_cells = torch.cat([initial.unsqueeze(0), cells[:-1]])
        return grad_candidate * previous_cells, grad_candidate, forget[0] * grad_candidate[0]


def forget_mult(forget: Tensor, candidate: Tensor, initial: Tensor) -> Tensor:
    """fo-pooling's cells: c_t = f_t * c_{t-1} + g_t for (time, batch, size) `forget` f and `candidate` g (here
    (1 - f_t) * z_t), starting from `initial` c_{-1} of shape (batch, size)."""
    return _ForgetMult.apply(forget.contiguous(), candidate.contiguous(), initial.contiguous())


class QRNNLayer(nn.Module):
    """One batch-first QRNN layer (output gate on) with DropConnect on its weights, a fresh mask per call.

    Its recurrent state, each tensor (1, batch, size) as in PyTorch's recurrent modules: the cell c, and with
    window 2 also the last input x, which the next call's first step reads as its x_{t-1} (fastai's
    `save_prev_x`), so reading a text in pieces with the state carried is reading it whole.
    """

    def __init__(self, input_size: int, hidden_size: int, p: float, window: int = 1):
        super().__init__()
        if window not in (1, 2):
            raise ValueError(f"a QRNN layer's window is 1 or 2, not {window}")
        self.input_size, self.hidden_size, self.window, self.p = input_size, hidden_size, window, p
        self.state_names = ("cell", "previous_input") if window == 2 else ("cell",)
        # Rows: z, f, o gates; columns: x_t, then x_{t-1} with window 2 (fastai's layout). "raw": before DropConnect.
        self.weight_ih_raw = nn.Parameter(torch.empty(3 * hidden_size, window * input_size))
        self.bias_ih = nn.Parameter(torch.empty(3 * hidden_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Linear's initialisation (fastai's QRNN gates are an nn.Linear): uniform in +-1/sqrt(fan-in)."""
        bound = 1 / math.sqrt(self.weight_ih_raw.shape[1])
        for parameter in (self.weight_ih_raw, self.bias_ih):
            nn.init.uniform_(parameter, -bound, bound)

    def forward(self, inputs: Tensor, state: LayerState | None = None) -> tuple[Tensor, LayerState]:
        """(outputs (batch, time, hidden_size), new state) for `inputs` of shape (batch, time, input_size)."""
        # Time-major inside: every step of the recurrence then reads contiguous (batch, size) slices.
        sequence = inputs.transpose(0, 1)
        batch = sequence.shape[1]
        initial = sequence.new_zeros(batch, self.hidden_size) if state is None else state[0][0]
        source = sequence
        if self.window == 2:
            previous_input = sequence.new_zeros(1, batch, self.input_size) if state is None else state[1]
            source = torch.cat([sequence, torch.cat([previous_input, sequence[:-1]])], dim=-1)
        weight = (
            F.dropout(self.weight_ih_raw, self.p, training=True) if self.training and self.p > 0 else self.weight_ih_raw
        )
        candidate, forget, output = F.linear(source, weight, self.bias_ih).chunk(3, dim=-1)
        forget = torch.sigmoid(forget)
        candidate = torch.tanh(candidate) * (1 - forget)
        # The recurrence in at least fp32: a bf16 sum over a long sequence would drift.
        dtype = torch.promote_types(candidate.dtype, torch.float32)
        cells = forget_mult(forget.to(dtype), candidate.to(dtype), initial.to(dtype))
        outputs = torch.sigmoid(output) * cells
        # Copies in their own storage: views would keep the whole sequence's tensors alive until the next batch.
        last = (cells[-1:],) + ((sequence[-1:],) if self.window == 2 else ())
        new_state = tuple(tensor.clone(memory_format=torch.contiguous_format) for tensor in last)
        return outputs.transpose(0, 1), new_state


def recurrent_layer(
    cell: Literal["lstm", "qrnn", "rnn"], input_size: int, output_size: int, weight_dropout: float, index: int
) -> nn.Module:
    """Layer `index` of the stack: forward(inputs, state) -> (outputs, state), DropConnect on its weights."""
    if cell == "qrnn":
        # Window 2 at the bottom, 1 above, as fastai's AWD-QRNN and MultiFiT: the first layer reads token pairs.
        return QRNNLayer(input_size, output_size, weight_dropout, window=2 if index == 0 else 1)
    return WeightDropout(input_size, output_size, weight_dropout, cell)
