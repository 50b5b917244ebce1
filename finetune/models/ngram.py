"""An n-gram language model with interpolated modified Kneser-Ney smoothing, as a Hugging Face model: the baseline.

Chen & Goodman (1998), "An empirical study of smoothing techniques for language modeling" (TR-10-98), interpolated
modified Kneser-Ney. For the order-k n-gram (h, w), h its k-1 words of context:

    p_k(w | h) = max(c_k(h w) - D_k(c_k(h w)), 0) / c_k(h .)  +  gamma_k(h) * p_{k-1}(w | h without its first word)
    gamma_k(h) = (D_k1 N1(h .) + D_k2 N2(h .) + D_k3+ N3+(h .)) / c_k(h .)
    p_0(w)     = 1 / vocab_size                                   (the uniform distribution at the bottom)

where c_k is the raw count for the highest order and, below it, the continuation count N1+(. h w): how many
distinct words precede h w. N_r(h .) is how many words follow h with that count exactly r (N3+: at least 3).
A context never seen at order k passes p_{k-1} through (gamma 1). The three discounts of each order come from its
count-of-counts n_r (how many n-grams of the order have count r): Y = n1 / (n1 + 2 n2), D1 = 1 - 2 Y n2 / n1,
D2 = 2 - 3 Y n3 / n2, D3+ = 3 - 4 Y n4 / n3. Where that closed form fails (no singletons or doubletons, a tiny or
repetitive corpus) or leaves (0, r], the order uses 0.5, 1 and 1.5, as KenLM's `lmplz --discount_fallback` does.
Every p_k sums to 1 over the vocabulary: what gamma collects is exactly what the discounts took.

Counting is vectorised numpy, no Python loop over tokens: an order-k n-gram is the key
`row of its (k-1)-gram prefix * vocab_size + last word`, one `np.unique` per order over the token stream (2.4M
synthetic ids, WikiText-2's size, one thread of a busy CPU: 1.1 s for order 3, 2.3 s for order 5, ~1 GB peak).
Scoring reads the tables by binary search; the most probable next word of every context is found once, in time
linear in the tables (`best_next_words`), so next-token accuracy needs no whole distribution (the same validation:
0.2 s). Libraries checked first: NLTK's `nltk.lm.KneserNeyInterpolated` uses one fixed discount (0.1) instead of
three estimated per order, and its smoothing rescans the stored n-grams for every lower-order probability it
computes: far too slow for millions of tokens. KenLM estimates modified Kneser-Ney with its `lmplz` program, a C++
build (CMake, Boost) that pip does not install; its Python package only queries finished models.

Importing this module registers model type "ngram" with AutoConfig and AutoModelForCausalLM, so a folder written by
`save_pretrained` loads with `AutoModelForCausalLM.from_pretrained(folder)`. `model.generate(...)` samples from the
smoothed distribution (or takes its argmax), reading only the last n - 1 tokens at each step.

Checkpoint format:

- config.json: "model_type": "ngram", vocab_size, order, table_sizes (n-grams stored per order 1..n), discounts
  (D1, D2, D3+ per order, for the record: the tables already hold them), training_tokens, eos_token_id.
- model.safetensors, for k = 1..order:
  keys_k           int64 (table_sizes[k-1],)  sorted: prefix index * vocab_size + word; the prefix index is the
                                              row of the (k-1)-gram in keys_{k-1} (0 for k = 1: the empty context)
  probabilities_k  float32, same shape       the discounted term max(c - D, 0) / c(h .) of each n-gram
  backoffs_k       float32 (table_sizes[k-2],) gamma_k of each (k-1)-gram as a context ((1,) for k = 1), 1 where the
                                              (k-1)-gram never precedes a word
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from finetune.models.generation import StatefulGenerationMixin, refuse_padding
from finetune.models.objectives import LanguageModelLoss

FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)  # KenLM's --discount_fallback defaults, for counts 1, 2 and 3+
MAX_ORDER = 6
DENSE_ENTRIES = 2**22  # probabilities held at once when whole next-token distributions are built (16 MB of fp32)


def modified_kneser_ney_discounts(counts: np.ndarray) -> tuple[float, float, float]:
    """D1, D2, D3+ of one order from the count-of-counts of its (raw or continuation) counts."""
    n1, n2, n3, n4 = (int(np.count_nonzero(counts == count)) for count in (1, 2, 3, 4))
    if n1 == 0 or n2 == 0 or n3 == 0:  # the closed form divides by each of them
        return FALLBACK_DISCOUNTS
    y = n1 / (n1 + 2 * n2)
    discounts = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
    if not all(0 < discount <= count for count, discount in enumerate(discounts, start=1)):
        return FALLBACK_DISCOUNTS
    return discounts


@dataclass
class NGramTables:
    """What the model stores, per order k = 1..n (list index k - 1); see the module docstring."""

    keys: list[np.ndarray]
    probabilities: list[np.ndarray]
    backoffs: list[np.ndarray]
    discounts: list[tuple[float, float, float]]


def estimate_kneser_ney(
    stream: np.ndarray, vocab_size: int, order: int, advance: Callable[[], None] = lambda: None
) -> NGramTables:
    """Count every n-gram of `stream` (token ids, one text) up to `order` and smooth them; `advance()` once per
    order."""
    stream = np.asarray(stream, dtype=np.int64)
    if not 1 <= order <= MAX_ORDER:
        raise ValueError(f"order {order} is outside 1..{MAX_ORDER}")
    if len(stream) < order or stream.min() < 0 or stream.max() >= vocab_size:
        raise ValueError(f"the stream must be at least {order} ids in [0, {vocab_size})")
    # 1. count, order by order: endings[k - 1][i] is the row in table k of the k-gram ending at position k - 1 + i
    keys, counts, first_ends, endings = [], [], [], []
    prefix_rows = np.zeros(len(stream), dtype=np.int64)  # the empty context: row 0 of a one-row order-0 table
    for k in range(1, order + 1):
        starts_at = k - 1  # the first position where a k-gram ends
        grams = prefix_rows[: len(stream) - starts_at] * vocab_size + stream[starts_at:]
        table, first, ending, count = np.unique(grams, return_index=True, return_inverse=True, return_counts=True)
        keys.append(table)
        counts.append(count)
        first_ends.append(first + starts_at)  # where each n-gram first ends in the stream
        endings.append(ending)
        prefix_rows = ending  # prefix_rows[i]: the k-gram ending at position starts_at + i, the next order's prefix
        advance()
    # 2. smooth, bottom up: continuation counts below the top order, then discounts, probabilities and backoffs
    tables = NGramTables([], [], [], [])
    for k in range(1, order + 1):
        if k == order:
            used = counts[k - 1]
        else:  # distinct words before each k-gram: the (k+1)-grams whose last k words it is, counted once each
            suffix_rows = endings[k - 1][first_ends[k] - (k - 1)]
            used = np.bincount(suffix_rows, minlength=len(keys[k - 1]))
        discounts = modified_kneser_ney_discounts(used)
        contexts = keys[k - 1] // vocab_size
        context_count = 1 if k == 1 else len(keys[k - 2])
        totals = np.bincount(contexts, weights=used, minlength=context_count)
        # D_r <= r: the discounted count is never negative, and gamma collects exactly what the discounts took.
        discount = np.where(used > 0, np.asarray((0.0,) + discounts)[np.minimum(used, 3)], 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            probabilities = np.where(totals[contexts] > 0, (used - discount) / totals[contexts], 0.0)
            backoffs = np.where(
                totals > 0, np.bincount(contexts, weights=discount, minlength=context_count) / totals, 1.0
            )
        tables.keys.append(keys[k - 1])
        tables.probabilities.append(probabilities.astype(np.float32))
        tables.backoffs.append(backoffs.astype(np.float32))
        tables.discounts.append((float(discounts[0]), float(discounts[1]), float(discounts[2])))
    return tables


NGRAM_TYPE = "ngram"  # config.json's model_type (and the recipe's model.family)


@strict
class NGramConfig(PretrainedConfig):
    """The shape of an n-gram model: its order, vocabulary and table sizes (the tables are its weights)."""

    model_type = NGRAM_TYPE

    vocab_size: int = 8000  # the uniform distribution at the bottom spreads over every id of the tokenizer
    order: int = 3  # the longest n-gram counted
    table_sizes: list[int] | None = None  # n-grams stored per order 1..order; None: one of each (an empty model)
    discounts: list[list[float]] | None = None  # D1, D2, D3+ per order, as estimated (informative)
    training_tokens: int = 0  # the length of the stream that was counted
    eos_token_id: int | None = None


def _ranges(starts: Tensor, stops: Tensor) -> tuple[Tensor, Tensor]:
    """(which range, position) of every position in the ranges [starts[i], stops[i]), ranges one after another."""
    lengths = stops - starts
    which = torch.repeat_interleave(torch.arange(len(starts), device=starts.device), lengths)
    offsets = torch.arange(len(which), device=starts.device) - (torch.cumsum(lengths, 0) - lengths)[which]
    return which, starts[which] + offsets


class NGramForCausalLM(PreTrainedModel, StatefulGenerationMixin):
    """The tables of `estimate_kneser_ney` and how to read them: next-token distributions and text scores.

    Each row of `input_ids` is its own text: a position's context is the tokens before it in that row (at the start
    of a row, shorter contexts use the lower orders), as a transformer reads a block.
    """

    config_class = NGramConfig
    config: NGramConfig
    main_input_name = "input_ids"
    base_model_prefix = "ngram"

    def __init__(self, config: NGramConfig):
        super().__init__(config)
        self._best_next: list[Tensor] | None = None  # the most probable next word per context (best_next_words)
        sizes = config.table_sizes or [1] * config.order
        for k in range(1, config.order + 1):
            self.register_buffer(f"keys_{k}", torch.zeros(sizes[k - 1], dtype=torch.int64))
            # Parameters (never trained) rather than buffers: transformers finds a model's dtype from its parameters.
            setattr(self, f"probabilities_{k}", nn.Parameter(torch.zeros(sizes[k - 1]), requires_grad=False))
            setattr(self, f"backoffs_{k}", nn.Parameter(torch.ones(1 if k == 1 else sizes[k - 2]), requires_grad=False))
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """Nothing to draw: the tables are counted (estimate_kneser_ney), then loaded."""

    @classmethod
    def count(
        cls,
        stream: np.ndarray,
        vocab_size: int,
        order: int,
        eos_token_id: int | None = None,
        advance: Callable[[], None] = lambda: None,
    ) -> NGramForCausalLM:
        """The model of one token stream (`estimate_kneser_ney`); `advance()` once per order counted."""
        tables = estimate_kneser_ney(stream, vocab_size, order, advance)
        return cls.from_tables(tables, vocab_size, len(stream), eos_token_id)

    @classmethod
    def from_tables(
        cls, tables: NGramTables, vocab_size: int, training_tokens: int, eos_token_id: int | None = None
    ) -> NGramForCausalLM:
        """A model holding `tables`."""
        config = NGramConfig(
            vocab_size=vocab_size,
            order=len(tables.keys),
            eos_token_id=eos_token_id,
            table_sizes=[len(keys) for keys in tables.keys],
            training_tokens=training_tokens,
            discounts=[list(discounts) for discounts in tables.discounts],
        )
        model = cls(config)
        with torch.no_grad():
            for k in range(1, config.order + 1):
                model.table("keys", k).copy_(torch.from_numpy(tables.keys[k - 1]))
                model.table("probabilities", k).copy_(torch.from_numpy(tables.probabilities[k - 1]))
                model.table("backoffs", k).copy_(torch.from_numpy(tables.backoffs[k - 1]))
        return model.eval()

    def table(self, name: str, k: int) -> Tensor:
        """keys_k, probabilities_k or backoffs_k."""
        return getattr(self, f"{name}_{k}")

    def _lookup(self, k: int, keys: Tensor) -> Tensor:
        """The rows of `keys` in table k (keys_k), -1 for keys it does not hold."""
        table = self.table("keys", k)
        found = torch.searchsorted(table, keys).clamp(max=len(table) - 1)
        return torch.where(table[found] == keys, found, -1)

    def _rows(self, input_ids: Tensor, order: int | None = None) -> list[Tensor]:
        """For k = 0..order (the model's by default), the (batch, time) row in table k of the k-gram that ends at
        each position; -1 where it was never counted or the row has fewer than k tokens up to there. Row 0 of order
        0 is the empty context."""
        input_ids = input_ids.long()
        rows = [torch.zeros_like(input_ids)]
        for k in range(1, (self.config.order if order is None else order) + 1):
            if k == 1:
                prefixes = rows[0]
            else:  # the (k-1)-gram ending one position earlier
                prefixes = torch.full_like(input_ids, -1)
                prefixes[:, 1:] = rows[k - 1][:, :-1]
            rows.append(torch.where(prefixes >= 0, self._lookup(k, prefixes * self.config.vocab_size + input_ids), -1))
        return rows

    @torch.no_grad()
    def target_log_probabilities(self, input_ids: Tensor) -> Tensor:
        """(batch, time - 1) float64: log p(input_ids[:, t] | the row's tokens before t), for t = 1..time-1."""
        rows = self._rows(input_ids)
        probability = torch.full(
            input_ids[:, 1:].shape, 1.0 / self.config.vocab_size, dtype=torch.float64, device=input_ids.device
        )
        for k in range(1, self.config.order + 1):
            context, gram = rows[k - 1][:, :-1], rows[k][:, 1:]  # the context ends one position before the word
            seen = context >= 0
            discounted = torch.where(gram >= 0, self.table("probabilities", k)[gram.clamp(min=0)].double(), 0.0)
            backoff = self.table("backoffs", k)[context.clamp(min=0)].double()
            probability = torch.where(seen, discounted + backoff * probability, probability)
        return probability.log()

    @torch.no_grad()
    def nats_per_token(self, input_ids: Tensor | list) -> float:
        """The mean negative log-likelihood of every token after the first of each row (a 1-D sequence or a list of
        ids: one row)."""
        input_ids = torch.as_tensor(input_ids, device=self.table("keys", 1).device)
        input_ids = input_ids if input_ids.dim() == 2 else input_ids.unsqueeze(0)
        return -self.target_log_probabilities(input_ids).mean().item()

    def _distributions(self, rows: list[Tensor]) -> Tensor:
        """(positions, vocab) next-token probabilities after positions whose context rows (orders 0..n-1) are given,
        each (positions,)."""
        vocab_size = self.config.vocab_size
        probabilities = torch.full((len(rows[0]), vocab_size), 1.0 / vocab_size, device=rows[0].device)
        for k in range(1, self.config.order + 1):
            context = rows[k - 1]
            seen = (context >= 0).nonzero().squeeze(1)
            if not len(seen):
                continue
            probabilities[seen] *= self.table("backoffs", k)[context[seen]].float().unsqueeze(1)
            # The n-grams of each context are the keys in [context * V, (context + 1) * V): one sorted run.
            keys = self.table("keys", k)
            starts = torch.searchsorted(keys, context[seen] * vocab_size)
            stops = torch.searchsorted(keys, (context[seen] + 1) * vocab_size)
            which, entries = _ranges(starts, stops)
            probabilities.index_put_(
                (seen[which], keys[entries] % vocab_size),
                self.table("probabilities", k)[entries].float(),
                accumulate=True,
            )
        return probabilities

    def _chunked_distributions(self, input_ids: Tensor, last: int = 0):
        """(first flat position, (positions, vocab) probabilities) over the flattened positions (of each row's
        `last` positions only, when given), a chunk at a time."""
        rows = [row[:, -last:] if last else row for row in self._rows(input_ids)[: self.config.order]]
        rows = [row.reshape(-1) for row in rows]
        chunk = max(1, DENSE_ENTRIES // self.config.vocab_size)
        for start in range(0, len(rows[0]), chunk):
            yield start, self._distributions([row[start : start + chunk] for row in rows])

    @torch.no_grad()
    def best_next_words(self) -> list[Tensor]:
        """For k = 1..order, the most probable word after each row of table k - 1 as a context, by p_k (one word for
        k = 1, the empty context); computed once, in time linear in the tables.

        The argmax of p_k(. | c) is a word that follows c in the corpus or the argmax of p_{k-1}(. | suffix of c):
        any other word w gets gamma_k(c) p_{k-1}(w | suffix), at most what that argmax gets. So each order needs the
        full p_k of its stored n-grams only, and each of those is its discounted term plus gamma_k times the full
        p_{k-1} of its suffix, an n-gram stored one order below: one table lookup per n-gram.
        """
        keys = self.table("keys", 1)
        if self._best_next is not None and self._best_next[0].device == keys.device:
            return self._best_next
        vocab_size = self.config.vocab_size
        best_words, best_values = [], []
        suffixes = torch.zeros_like(keys)  # of table k's n-grams: the row of their last k - 1 words in table k - 1
        full = self.table("probabilities", 1).double() + self.table("backoffs", 1).double() / vocab_size  # p_1
        unigram = torch.full(
            (vocab_size,), float(self.table("backoffs", 1)[0]) / vocab_size, dtype=torch.float64, device=keys.device
        )
        unigram[keys] = full
        best_words.append(unigram.argmax().view(1))
        best_values.append(unigram.max().view(1))
        for k in range(2, self.config.order + 1):
            keys = self.table("keys", k)
            contexts, words = keys // vocab_size, keys % vocab_size
            suffix_contexts = suffixes  # of table k - 1's rows: the contexts one order below
            suffixes = self._lookup(k - 1, suffix_contexts[contexts] * vocab_size + words)
            backoffs = self.table("backoffs", k).double()
            full = self.table("probabilities", k).double() + backoffs[contexts] * full[suffixes]
            # Below: the lower order's best after the suffix; then any stored n-gram that beats it (ties: lower id).
            value = backoffs * best_values[-1][suffix_contexts]
            word = best_words[-1][suffix_contexts].clone()
            best = value.scatter_reduce(0, contexts, full, reduce="amax")
            at_best = full == best[contexts]
            first = torch.full_like(word, len(keys)).scatter_reduce(
                0, contexts[at_best], torch.arange(len(keys), device=keys.device)[at_best], reduce="amin"
            )
            stored = first < len(keys)
            stored_word = words[first.clamp(max=len(keys) - 1)]
            replace = stored & ((best > value) | (stored_word < word))
            word[replace] = stored_word[replace]
            best_words.append(word)
            best_values.append(best)
        self._best_next = best_words
        return best_words

    @torch.no_grad()
    def next_token_predictions(self, input_ids: Tensor) -> Tensor:
        """(batch, time): the most probable next token after each position (the argmax of its distribution)."""
        best = self.best_next_words()
        rows = self._rows(input_ids, self.config.order - 1)
        predictions = best[0].expand(input_ids.shape).clone()
        for k in range(2, self.config.order + 1):  # the longest counted context decides: a shorter one is its suffix
            context = rows[k - 1]
            predictions = torch.where(context >= 0, best[k - 1][context.clamp(min=0)], predictions)
        return predictions

    @torch.no_grad()
    def forward(
        self,
        input_ids: Tensor,
        labels: Tensor | None = None,
        attention_mask: Tensor | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> CausalLMOutput:
        """Log-probabilities of the next token at every position as the logits (batch, time, vocab): the whole
        distribution, so for short inputs (`logits_to_keep`: of the last positions only). With `labels` (usually
        the input ids, shifted inside as everywhere in transformers) the mean next-token loss. `attention_mask` is
        accepted and ignored (rows read left to right)."""
        chunks = self._chunked_distributions(input_ids, logits_to_keep)
        logits = torch.cat([probabilities.log() for _, probabilities in chunks])
        logits = logits.view(input_ids.shape[0], -1, self.config.vocab_size)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, logits_to_keep: int = 0, **kwargs
    ) -> dict:
        """The last n - 1 tokens: the longest context the model reads (no state carried)."""
        refuse_padding(attention_mask, type(self).__name__)
        return {"input_ids": input_ids[:, -max(1, self.config.order - 1) :], "logits_to_keep": logits_to_keep}


class NGramNextTokenLM(LanguageModelLoss):
    """The n-gram model behind the pretraining stage's validation contract: forward(input_ids, labels) ->
    (mean loss, labelled tokens, correct next-token predictions), on next-token blocks (labels: the inputs shifted
    by one), so that it is scored by the very code that scores the neural families."""

    def __init__(self, ngram: NGramForCausalLM):
        super().__init__()
        self.ngram = ngram

    @property
    def language_model(self) -> NGramForCausalLM:
        """The Hugging Face model inside, the one a checkpoint saves."""
        return self.ngram

    @torch.no_grad()
    def forward(self, input_ids: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if not torch.equal(input_ids[:, 1:], labels[:, :-1]):
            raise ValueError("labels must be the input ids shifted by one (next-token blocks)")
        blocks = torch.cat([input_ids[:, :1], labels], dim=1)  # each row whole again: its own context
        loss = -self.ngram.target_log_probabilities(blocks).mean()
        correct = (self.ngram.next_token_predictions(input_ids) == labels).sum()
        return loss, torch.tensor(labels.numel(), device=labels.device), correct


AutoConfig.register(NGramConfig.model_type, NGramConfig, exist_ok=True)
AutoModelForCausalLM.register(NGramConfig, NGramForCausalLM, exist_ok=True)
