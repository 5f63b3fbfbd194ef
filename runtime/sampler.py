"""Sampler: one vectorised pass from the logits of a batch to its next tokens (and their logprobs).

Order of the stages, each skipped when no row of the batch needs it (host flags, no device sync):

    1. logit bias, then penalties (repetition, frequency, presence); then -inf for the ids at and past
       `token_count` (the tokenizer's size, when the model's embedding has padding rows past it, as Qwen2's
       151,936 rows for 151,665 tokens): such ids are never drawn      -> "processed logits"
    2. grammar mask (packed bitmask, `radixgen.kernels.apply_token_bitmask`)
    3. min_new_tokens: EOS and stop ids get -inf until enough tokens exist (unless that leaves a row with no
       token at all, e.g. a finished grammar that only allows EOS: the grammar wins)
    4. greedy rows: argmax. Other rows: softmax(logits / temperature), then top-k / top-p (a partial top-k
       of a few hundred candidates for rows whose nucleus lies within them, one batched sort of the other
       rows; only when some row uses top-p), then min-p
    5. draw: argmax(p / E) with E ~ Exp(1) (the exponential race, equivalent to Gumbel-max). E comes from a
       counter-based hash of (seed, step, token id) (`counter_rng`), so a seeded row draws the same tokens
       whatever else is in the batch; unseeded rows get a fresh random key per step from the engine's
       generator.

Logprobs (when any row asks) follow the SGLang/vLLM convention of reporting the model's distribution, not
the truncated sampling one: log_softmax of the processed logits (bias and penalties applied) at temperature 1,
before the grammar mask, min-token blocking, temperature and top-k/top-p/min-p. The chosen token's logprob and
the top `max(top_logprobs_num)` entries come from that one tensor.

Top-k ties: with top-k alone, tokens tied with the k-th probability are all kept. Top-p keeps the smallest
prefix of the sorted distribution (after top-k, renormalised) whose mass reaches top_p, as in HF and vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixgen.kernels import apply_token_bitmask
from radixgen.runtime.counter_rng import exponential, row_keys, token_keys
from radixgen.runtime.sampling_batch import SamplingBatch


@dataclass(frozen=True)
class SampleOutput:
    next_token_ids: torch.Tensor  # [B] int64
    # When any row asked for logprobs (values for every row; the engine reads the rows that asked):
    next_token_logprobs: torch.Tensor | None = None  # [B] float32
    top_logprobs_values: torch.Tensor | None = None  # [B, K] float32, K = max top_logprobs_num of the batch
    top_logprobs_ids: torch.Tensor | None = None  # [B, K] int64


class Sampler:
    """Turns logits into tokens for a `SamplingBatch`. Holds only vocabulary-level constants and the engine's
    random generator (for unseeded rows); all per-request state lives in the batch."""

    def __init__(self, vocab_size: int, device: torch.device | str = "cpu", seed: int = 0,
                 top_p_candidates: int = 256, token_count: int | None = None) -> None:
        """`top_p_candidates`: top-p first looks for the nucleus among this many most likely tokens (a partial
        top-k, much cheaper than sorting the vocabulary) and sorts only the rows whose nucleus is wider.
        `token_count`: only ids below it are drawn (and reported as top logprobs): the tokenizer's size, when
        the model's `vocab_size` logits include padding ids; None (or a larger count) allows every id."""
        self.vocab_size = vocab_size
        self.token_count = vocab_size if token_count is None else min(token_count, vocab_size)
        self.top_p_candidates = top_p_candidates
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self._token_keys = token_keys(vocab_size, self.device)

    def sample(self, batch: SamplingBatch, logits: torch.Tensor, grammar_bitmask: torch.Tensor | None = None,
               bitmask_rows: torch.Tensor | list[int] | None = None) -> SampleOutput:
        """Next token per row. `logits` [B, V] (not modified). Grammar masks: `grammar_bitmask` [R, ceil(V/32)]
        int32, row r allowing the tokens whose bit is set (bit v % 32 of word v // 32) in logits row
        `bitmask_rows[r]` (the kernels' convention; None: R == B, row r for row r); rows without a grammar
        stay unmasked. Call `batch.append(out.next_token_ids)` once the tokens are accepted."""
        if logits.dim() != 2 or logits.shape[0] != batch.batch_size or logits.shape[1] != self.vocab_size:
            raise ValueError(f"logits must be [{batch.batch_size}, {self.vocab_size}], got {list(logits.shape)}")
        # Greedy rows with nothing to apply read the logits as they are; anything else works on a copy.
        if (batch.all_greedy and grammar_bitmask is None and batch.block_ids is None and batch.logit_bias is None
                and batch.seen is None and batch.output_counts is None and logits.dtype == torch.float32):
            return self._greedy_fast(batch, logits[:, : self.token_count])
        x = self.process_logits(batch, logits.to(torch.float32, copy=True))
        if self.token_count < self.vocab_size:
            x[:, self.token_count :] = float("-inf")
        logprobs = torch.log_softmax(x, dim=-1) if batch.needs_logprobs else None
        if grammar_bitmask is not None:
            apply_grammar(x, grammar_bitmask, bitmask_rows)
        if batch.block_ids is not None:
            _block_until_min_tokens(x, batch)
        next_ids = self._choose(batch, x)
        if logprobs is None:
            return SampleOutput(next_ids)
        chosen = logprobs.gather(1, next_ids[:, None]).squeeze(1)
        if batch.max_top_logprobs == 0:
            return SampleOutput(next_ids, chosen)
        top = logprobs.topk(min(batch.max_top_logprobs, self.token_count), dim=-1)
        return SampleOutput(next_ids, chosen, top.values, top.indices)

    def _greedy_fast(self, batch: SamplingBatch, logits: torch.Tensor) -> SampleOutput:
        """All rows greedy, no bias, penalty, grammar or min-token block: argmax without copying the logits
        (`logits` [B, token_count], a view that leaves the padding ids out)."""
        next_ids = logits.argmax(dim=-1)
        if not batch.needs_logprobs:
            return SampleOutput(next_ids)
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logprobs.gather(1, next_ids[:, None]).squeeze(1)
        if batch.max_top_logprobs == 0:
            return SampleOutput(next_ids, chosen)
        top = logprobs.topk(min(batch.max_top_logprobs, self.token_count), dim=-1)
        return SampleOutput(next_ids, chosen, top.values, top.indices)

    @staticmethod
    def process_logits(batch: SamplingBatch, x: torch.Tensor) -> torch.Tensor:
        """Logit bias and penalties, on float32 logits [B, V]; returns the processed logits (may reuse x)."""
        if batch.logit_bias is not None:
            x += batch.logit_bias
        if batch.seen is not None:
            rp = batch.repetition_penalties[:, None]
            x = torch.where(batch.seen, torch.where(x > 0, x / rp, x * rp), x)
        if batch.output_counts is not None:
            counts = batch.output_counts
            if batch.needs_frequency:
                x -= batch.frequency_penalties[:, None] * counts
            if batch.needs_presence:
                x -= batch.presence_penalties[:, None] * (counts > 0)
        return x

    def _choose(self, batch: SamplingBatch, x: torch.Tensor) -> torch.Tensor:
        argmax = x.argmax(dim=-1)
        if batch.all_greedy:
            return argmax
        probs = torch.softmax(x / batch.temperatures[:, None], dim=-1)
        if batch.needs_top_p:
            probs = _top_k_top_p(probs, batch.top_ks, batch.top_ps, batch.greedy, self.top_p_candidates)
        elif batch.needs_top_k:
            probs = _top_k_partial(probs, batch.top_ks, batch.max_top_k)
        if batch.needs_min_p:
            floor = probs.amax(dim=-1, keepdim=True) * batch.min_ps[:, None]
            probs = probs.masked_fill(probs < floor, 0.0)
        drawn = (probs / exponential(self._row_keys(batch), self._token_keys)).argmax(dim=-1)
        return torch.where(batch.greedy, argmax, drawn)

    def _row_keys(self, batch: SamplingBatch) -> torch.Tensor:
        """Seeded rows: a key from (seed, step). Others: a fresh key from the engine generator."""
        seeded = row_keys(batch.seed_lo, batch.seed_hi, batch.output_lens)
        fresh = torch.randint(-(2**31), 2**31 - 1, (batch.batch_size,), generator=self.generator,
                              device=self.device, dtype=torch.int32)
        return torch.where(batch.seeded, seeded, fresh)


def apply_grammar(x: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | list[int] | None) -> None:
    """-inf in place where the packed masks refuse a token: mask r on row rows[r] (None: row r)."""
    bitmask = bitmask.to(x.device, non_blocking=True)
    if rows is None:
        apply_token_bitmask(x, bitmask)
        return
    idx = rows.to(x.device) if isinstance(rows, torch.Tensor) else torch.as_tensor(rows, dtype=torch.int64,
                                                                                   device=x.device)
    if bitmask.shape[0] != idx.shape[0]:
        raise ValueError(f"grammar_bitmask has {bitmask.shape[0]} rows for {idx.shape[0]} bitmask_rows")
    if idx.numel():
        apply_token_bitmask(x, bitmask, idx)


def _block_until_min_tokens(x: torch.Tensor, batch: SamplingBatch) -> None:
    """-inf on EOS / stop ids of rows below min_new_tokens, in place; rows left with no finite logit (their
    grammar allows nothing else) get their values back."""
    ids, has_ids = batch.block_ids, batch.has_block_ids
    assert ids is not None and has_ids is not None, "called only for a batch with min_new_tokens"
    active = (batch.output_lens < batch.min_new_tokens) & has_ids
    old = x.gather(1, ids)
    neg_inf = torch.full_like(old, float("-inf"))
    x.scatter_(1, ids, torch.where(active[:, None], neg_inf, old))
    dead = torch.isneginf(x.amax(dim=-1))
    x.scatter_(1, ids, torch.where((active & ~dead)[:, None], neg_inf, old))


def _top_k_top_p(probs: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor, greedy: torch.Tensor,
                 candidates: int) -> torch.Tensor:
    """Top-k then top-p, looking only at each row's `candidates` most likely tokens where that provably holds
    the row's kept set (the same result as sorting the row); the other rows, if any, are sorted in full.

    Covered rows: no truncation at all, top_k <= candidates, or top-k off and the candidates' mass reaching
    top_p of the total. Which path a row takes depends on that row alone, so a seeded row draws the same
    tokens whatever shares its batch. (Checking costs one device sync; the engine syncs on the tokens right
    after anyway.)
    """
    V = probs.shape[-1]
    K = min(candidates, V)
    vals, idx = probs.topk(K, dim=-1)  # descending
    truncated = ((top_ps < 1.0) | (top_ks < V)) & ~greedy
    ranks = torch.arange(K, device=probs.device)
    vals = vals.masked_fill(ranks[None, :] >= top_ks[:, None], 0.0)
    cum = vals.cumsum(dim=-1)
    total = torch.where(top_ks <= K, cum[:, -1], probs.sum(dim=-1))
    limit = torch.where(top_ps < 1.0, top_ps * total, torch.full_like(total, float("inf")))
    keep = (cum - vals) < limit[:, None]  # mass before the token below top_p of the total; rank 0 always
    keep &= ranks[None, :] < top_ks[:, None]
    keep_by_token = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, idx, keep)
    keep_by_token |= ~truncated[:, None]
    out = probs.masked_fill(~keep_by_token, 0.0)
    covered = ~truncated | (top_ks <= K) | ((top_ks == V) & (cum[:, -1] >= limit))
    uncovered = (~covered).nonzero().squeeze(1)
    if uncovered.numel():
        out[uncovered] = _top_k_top_p_sorted(probs[uncovered], top_ks[uncovered], top_ps[uncovered])
    return out


def _top_k_top_p_sorted(probs: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Zero the tokens outside each row's top-k and then outside its top-p nucleus, with one sort."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(probs.shape[-1], device=probs.device)
    remove = ranks[None, :] >= top_ks[:, None]
    sorted_p = sorted_p.masked_fill(remove, 0.0)
    cum = sorted_p.cumsum(dim=-1)
    # Keep a token while the mass before it is below top_p of the (top-k renormalised) total; rank 0 always.
    limit = torch.where(top_ps < 1.0, top_ps, torch.full_like(top_ps, float("inf")))[:, None] * cum[:, -1:]
    remove |= (cum - sorted_p) >= limit
    remove_by_token = torch.empty_like(remove).scatter_(1, order, remove)
    return probs.masked_fill(remove_by_token, 0.0)


def _top_k_partial(probs: torch.Tensor, top_ks: torch.Tensor, max_k: int) -> torch.Tensor:
    """Top-k without a full sort: keep probabilities >= the row's k-th largest (rows with top-k off keep all)."""
    kth_index = (top_ks.clamp(max=max_k) - 1)[:, None]
    kth = probs.topk(max_k, dim=-1).values.gather(1, kth_index)
    kth = torch.where(top_ks[:, None] < probs.shape[-1], kth, torch.zeros_like(kth))
    return probs.masked_fill(probs < kth, 0.0)
