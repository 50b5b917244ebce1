"""The decoder and the cross-entropy in one pass over row chunks: no (rows x vocabulary) logits tensor.

Every language model here ends by projecting rows of hidden states onto the whole vocabulary and taking the
cross-entropy against the next (or masked) token. As two operations, the logits (an AWD-LSTM batch of 64 x 70
tokens onto 8,000 words: 143 MB of floats) are allocated fresh (page faults), written, read by log-softmax, written
again as its output, and backward writes and reads two more tensors of that size plus a zero-filled one. On a CPU
these passes over memory cost about as much as the matrix products.

`linear_cross_entropy` goes through the rows a chunk at a time in one reused buffer: each chunk's logits become
its softmax and then, in place, the gradient of the loss with respect to them, and the gradients of the inputs,
the weight and the bias are taken right there in the forward (as Liger-Kernel's fused linear cross-entropy does
on GPUs); backward only scales them. Same loss and gradients as `F.cross_entropy(F.linear(x, W, b), labels)` up to
float rounding (tests/models/test_linear_cross_entropy.py). Forward + backward on 2 CPU cores (2026-11-24):
4,480 x 200 -> 8,000 (the AWD-LSTM): 293 -> 143 ms; 4,096 x 256 -> 16,000 (a small GPT-2): 575 -> 316 ms;
614 x 256 -> 30,522 (BERT-mini's masked rows): 160 -> 99 ms.

The chunked route serves float32 without autocast (CPU training and evaluation); elsewhere (bf16, autocast on a
GPU) the plain two operations run, as their kernels are fused and fast there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from finetune.tasks.specs import IGNORE_INDEX

CHUNK_BYTES = 30 * 1024**2  # fp32 logits per chunk: large products, yet below glibc's 32 MiB mmap threshold
# Vocabulary columns per forward product: a 256 x 1024 weight slice stays in cache; one 30522-wide
# product ran at ~45 GFLOP/s on one core, 1024-wide slices at ~70.
VOCAB_SLICE = 1024


def linear_cross_entropy(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, count_correct: bool = False
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Mean cross-entropy of `hidden @ weight.T + bias` against `labels` (IGNORE_INDEX rows skipped), the number
    of labelled rows, and with `count_correct` how many of them the argmax predicts (else None).

    `hidden` is (..., features) and `labels` the matching (...); `weight` is (vocabulary, features) as in
    nn.Linear. With no labelled row the loss is 0 (still part of the graph).
    """
    hidden, labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    count = (labels != IGNORE_INDEX).sum()
    chunked = hidden.dtype == weight.dtype == torch.float32 and not torch.is_autocast_enabled(hidden.device.type)
    if not chunked:
        return logits_cross_entropy(F.linear(hidden, weight, bias), labels, count_correct)
    needs_gradient = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    if needs_gradient:
        loss, correct = _ChunkedLinearCrossEntropy.apply(hidden, weight, bias, labels, count_correct)
        return loss, count, (correct if count_correct else None)
    loss, correct = _chunked_loss(hidden, weight, bias, labels, count_correct)
    return loss, count, correct


def logits_cross_entropy(
    logits: Tensor, labels: Tensor, count_correct: bool = False
) -> tuple[Tensor, Tensor, Tensor | None]:
    """What `linear_cross_entropy` returns, from logits already computed (..., vocabulary): the mean cross-entropy
    over labelled rows, their number, and with `count_correct` how many the argmax predicts (else None)."""
    logits, labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    selected = labels != IGNORE_INDEX
    count = selected.sum()
    loss = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum") / count.clamp(min=1)
    correct = ((logits.argmax(dim=-1) == labels) & selected).sum() if count_correct else None
    return loss, count, correct


def _chunks(rows: int, vocab: int):
    """(start, stop) of equal chunks of at most CHUNK_BYTES of fp32 logits: 614 rows -> 3 x 205, not 257+257+100."""
    most = max(1, CHUNK_BYTES // (4 * vocab))
    size = -(-rows // -(-rows // most)) if rows else 1
    return size, [(start, min(start + size, rows)) for start in range(0, rows, size)]


def _project(part: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> None:
    """out = part @ weight.T (+ bias), a vocabulary slice at a time (each slice of the weight stays in cache)."""
    for first in range(0, weight.shape[0], VOCAB_SLICE):
        columns = slice(first, first + VOCAB_SLICE)
        if bias is None:
            torch.mm(part, weight[columns].t(), out=out[:, columns])
        else:
            torch.addmm(bias[columns], part, weight[columns].t(), out=out[:, columns])


def _chunked_loss(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, count_correct: bool
) -> tuple[Tensor, Tensor | None]:
    """Forward only (evaluation): the mean loss over labelled rows and the correct count (or None)."""
    vocab = weight.shape[0]
    size, bounds = _chunks(hidden.shape[0], vocab)
    buffer = hidden.new_empty((size, vocab))
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    correct = torch.zeros((), dtype=torch.long, device=hidden.device)
    for start, stop in bounds:
        logits, part_labels = buffer[: stop - start], labels[start:stop]
        _project(hidden[start:stop], weight, bias, logits)
        keep = part_labels != IGNORE_INDEX
        targets = part_labels.clamp(min=0).unsqueeze(1)
        if count_correct:
            correct += ((logits.argmax(dim=1) == part_labels) & keep).sum()
        row_losses = torch.logsumexp(logits, dim=1) - logits.gather(1, targets).squeeze(1)
        total += row_losses.masked_fill_(~keep, 0.0).sum()
    loss = total / (labels != IGNORE_INDEX).sum().clamp(min=1)
    return loss, (correct if count_correct else None)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Training: the loss (and, when asked, the correct count), with every gradient computed in the forward while
    each chunk is in cache."""

    @staticmethod
    def forward(
        ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, count_correct: bool
    ) -> tuple[Tensor, Tensor]:
        rows, vocab = hidden.shape[0], weight.shape[0]
        size, bounds = _chunks(rows, vocab)
        grad_hidden, grad_weight = torch.empty_like(hidden), torch.zeros_like(weight)
        grad_bias = None if bias is None else torch.zeros(vocab, dtype=torch.float32, device=bias.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        buffer = hidden.new_empty((size, vocab))  # reused by every chunk
        selected = labels != IGNORE_INDEX
        every_row_labelled = bool(selected.all())
        for start, stop in bounds:
            part, logits = hidden[start:stop], buffer[: stop - start]
            keep = selected[start:stop]
            targets = labels[start:stop].clamp(min=0)  # an index for ignored rows too; they are zeroed below
            _project(part, weight, bias, logits)
            if count_correct:  # before the logits become gradients (an eval-mode pass that also wants them)
                correct += ((logits.argmax(dim=1) == labels[start:stop]) & keep).sum()
            logits -= logits.amax(dim=1, keepdim=True)  # log-sum-exp without overflow
            target_logits = logits.gather(1, targets[:, None]).squeeze(1)
            logits.exp_()
            sums = logits.sum(dim=1, keepdim=True)
            row_losses = sums.squeeze(1).log() - target_logits
            logits /= sums  # softmax; minus one at the target: d(sum of losses)/d(logits)
            logits[torch.arange(stop - start, device=logits.device), targets] -= 1.0
            if every_row_labelled:
                total += row_losses.sum()
            else:  # ignored rows carry neither loss nor gradient
                total += row_losses.masked_fill_(~keep, 0.0).sum()
                logits.mul_(keep.unsqueeze(1))
            torch.mm(logits, weight, out=grad_hidden[start:stop])
            grad_weight.addmm_(logits.t(), part)
            if grad_bias is not None:
                grad_bias += logits.sum(dim=0)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.denominator = max(1, int(selected.sum()))
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.mark_non_differentiable(correct)
        return total / ctx.denominator, correct

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_correct: Tensor | None):
        # Scaled in place: these tensors serve this one backward. A second one (retain_graph) is refused by
        # autograd itself, as the saved tensors' versions changed.
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        scale = grad_loss / ctx.denominator  # the gradients above are of the sum; the loss is the mean
        if grad_bias is not None:
            grad_bias = grad_bias.mul_(scale).to(ctx.bias_dtype)
        return grad_hidden.mul_(scale), grad_weight.mul_(scale), grad_bias, None, None
