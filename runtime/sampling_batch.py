"""SamplingBatch: the sampling options of the rows of one batch as contiguous tensors, plus penalty state.

One row per request that samples a token this step, in the order of the logits rows. Built once from the
requests' `SamplingParams`, then kept in step with the running batch:

    batch = SamplingBatch.build(params, vocab_size, device, eos_token_ids, prompt_ids=..., output_ids=...)
    out = sampler.sample(batch, logits)        # logits [B, V], row b <-> params[b]
    batch.append(out.next_token_ids)           # counts the new tokens (penalties, min_new_tokens, seeds)
    batch = batch.filter(keep_rows)            # requests finished
    batch = SamplingBatch.concat([batch, b2])  # requests joined
    rows = batch.positions(counts)             # a verify step: request i's row for each of its counts[i] positions

Rebuilding with `build` from the requests' token lists is always equivalent (after preemption, say); it costs
one scatter over the tokens instead of one per step.

Optional state exists only when some row needs it (a [B, V] tensor is ~0.6 MB per row at V = 150k):
    logit_bias        [B, V] float32   when any row has logit_bias
    output_counts     [B, V] int32     when any row has a frequency or presence penalty: generated tokens only
    seen              [B, V] bool      when any row has a repetition penalty: prompt and generated tokens
    block_ids         [B, S] int64     when any row has min_new_tokens > 0: EOS (unless ignore_eos) and
                                       stop_token_ids, blocked while output_lens < min_new_tokens. Rows with
                                       fewer ids repeat their first id (scatter writes then agree); rows with
                                       none are marked by has_block_ids = False.
Penalty semantics follow vLLM / OpenAI: frequency and presence count generated tokens only; repetition (HF's
CTRL-style divide-positive / multiply-negative) counts prompt and generated tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from radixgen.runtime.counter_rng import split_seed
from radixgen.runtime.forward_batch import host_to_device
from radixgen.runtime.sampling_params import SamplingParams

TokenIds = Sequence[int] | np.ndarray | torch.Tensor
POSITIONS_KEPT = 16  # `SamplingBatch.positions` results a batch keeps: at batch 1, one per number of drafts


@dataclass(eq=False)
class SamplingBatch:
    params: list[SamplingParams]
    vocab_size: int
    temperatures: torch.Tensor  # [B] float32; 1.0 on greedy rows (they take the argmax and never divide)
    greedy: torch.Tensor  # [B] bool
    top_ps: torch.Tensor  # [B] float32; 1.0 = off
    top_ks: torch.Tensor  # [B] int64; vocab_size = off
    min_ps: torch.Tensor  # [B] float32; 0.0 = off
    frequency_penalties: torch.Tensor  # [B] float32
    presence_penalties: torch.Tensor  # [B] float32
    repetition_penalties: torch.Tensor  # [B] float32
    min_new_tokens: torch.Tensor  # [B] int64
    output_lens: torch.Tensor  # [B] int64: tokens generated so far = the step index of the next draw
    seed_lo: torch.Tensor  # [B] int32: low half of the request seed (0 when unseeded)
    seed_hi: torch.Tensor  # [B] int32
    seeded: torch.Tensor  # [B] bool
    return_logprob: list[bool]
    top_logprobs_num: list[int]
    logit_bias: torch.Tensor | None = None
    output_counts: torch.Tensor | None = None
    seen: torch.Tensor | None = None
    block_ids: torch.Tensor | None = None
    has_block_ids: torch.Tensor | None = None  # [B] bool, with block_ids

    def __post_init__(self) -> None:
        # Host-side flags, so the sampler skips whole stages with no device sync.
        p = self.params
        V = self.vocab_size
        self.all_greedy = all(x.is_greedy for x in p)
        self.needs_top_p = any(x.top_p < 1.0 and not x.is_greedy for x in p)
        self.needs_top_k = any(0 < x.top_k < V and not x.is_greedy for x in p)
        self.max_top_k = max((x.top_k for x in p if 0 < x.top_k < V and not x.is_greedy), default=0)
        self.needs_min_p = any(x.min_p > 0.0 and not x.is_greedy for x in p)
        self.needs_frequency = any(x.frequency_penalty != 0.0 for x in p)
        self.needs_presence = any(x.presence_penalty != 0.0 for x in p)
        self.needs_repetition = any(x.repetition_penalty != 1.0 for x in p)
        self.needs_logprobs = any(self.return_logprob)
        self.max_top_logprobs = max((k for k, r in zip(self.top_logprobs_num, self.return_logprob) if r),
                                    default=0)
        self._positions: dict[bytes, _Positions] = {}  # `positions` results by their counts, the oldest first

    @property
    def batch_size(self) -> int:
        return len(self.params)

    @property
    def device(self) -> torch.device:
        return self.temperatures.device

    # ---------------------------------------------------------------- construction

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        vocab_size: int,
        device: torch.device | str = "cpu",
        eos_token_ids: Sequence[int] = (),
        prompt_ids: Sequence[TokenIds] | None = None,
        output_ids: Sequence[TokenIds] | None = None,
        return_logprob: Sequence[bool] | None = None,
        top_logprobs_num: Sequence[int] | None = None,
    ) -> SamplingBatch:
        """Tensors for `params` (one per row). `prompt_ids` feed the repetition penalty; `output_ids` (tokens
        generated so far, e.g. after a preemption) feed all penalties, min_new_tokens and the seed step."""
        params = list(params)
        B, V = len(params), vocab_size
        dev = torch.device(device)

        greedy = [p.is_greedy for p in params]
        seeds = [split_seed(p.seed) if p.seed is not None else (0, 0) for p in params]
        out_lists = [_as_np(x) for x in output_ids] if output_ids is not None else [np.zeros(0, np.int64)] * B
        # Two host-to-device copies for all the per-row columns (the engine may rebuild every step).
        # (through pinned memory: a pageable copy would wait for the forward queued before it)
        floats = host_to_device(np.array([
            [1.0 if g else p.temperature for p, g in zip(params, greedy)],
            [p.top_p for p in params], [p.min_p for p in params], [p.frequency_penalty for p in params],
            [p.presence_penalty for p in params], [p.repetition_penalty for p in params],
        ], dtype=np.float32).reshape(6, B), dev)
        ints = host_to_device(np.array([
            [p.top_k if 0 < p.top_k < V else V for p in params], [p.min_new_tokens for p in params],
            [len(x) for x in out_lists], [s[0] for s in seeds], [s[1] for s in seeds], greedy,
            [p.seed is not None for p in params],
        ], dtype=np.int64).reshape(7, B), dev)
        batch = cls(
            params=params,
            vocab_size=V,
            temperatures=floats[0],
            greedy=ints[5] != 0,
            top_ps=floats[1],
            top_ks=ints[0],
            min_ps=floats[2],
            frequency_penalties=floats[3],
            presence_penalties=floats[4],
            repetition_penalties=floats[5],
            min_new_tokens=ints[1],
            output_lens=ints[2],
            seed_lo=ints[3].to(torch.int32),
            seed_hi=ints[4].to(torch.int32),
            seeded=ints[6] != 0,
            return_logprob=list(return_logprob) if return_logprob is not None else [False] * B,
            top_logprobs_num=list(top_logprobs_num) if top_logprobs_num is not None else [0] * B,
        )
        if len(batch.return_logprob) != B or len(batch.top_logprobs_num) != B:
            raise ValueError("return_logprob and top_logprobs_num need one entry per row")
        if any(p.logit_bias for p in params):
            batch.logit_bias = _bias_tensor(params, V, dev)
        if batch.needs_frequency or batch.needs_presence:
            batch.output_counts = _count_tokens(out_lists, V, dev)
        if batch.needs_repetition:
            seen_lists = out_lists if prompt_ids is None else [
                np.concatenate([_as_np(a), b]) for a, b in zip(prompt_ids, out_lists)]
            batch.seen = _mark_tokens(seen_lists, V, dev)
        if any(p.min_new_tokens > 0 for p in params):
            batch.block_ids, batch.has_block_ids = _block_ids(params, eos_token_ids, dev)
        return batch

    # ---------------------------------------------------------------- keeping in step with the batch

    def append(self, token_ids: torch.Tensor) -> None:
        """Count one new token per row ([B] int64, on this batch's device): penalties, min-tokens, seed step."""
        ids = token_ids.to(self.device, torch.int64)
        rows = torch.arange(ids.shape[0], device=self.device)
        if self.output_counts is not None:
            self.output_counts.index_put_((rows, ids), torch.ones_like(ids, dtype=torch.int32), accumulate=True)
        if self.seen is not None:
            self.seen[rows, ids] = True
        self.output_lens += 1

    def positions(self, counts: np.ndarray) -> SamplingBatch:
        """The rows of a verify step: row i repeated `counts[i]` times, its j-th copy drawn at output index
        output_lens[i] + j, as plain decoding would draw it there. A batch without penalty state (the only state
        that changes as tokens are counted, besides output_lens) keeps the results of the last few counts (a
        request's drafts vary in number from step to step); a kept one only recomputes its output_lens, two
        device ops instead of a gather per column."""
        key = np.asarray(counts, dtype=np.int64).tobytes()
        kept = self._positions.get(key)
        if kept is not None:
            kept.batch.output_lens = self.output_lens.index_select(0, kept.rows) + kept.within
            return kept.batch
        total = int(counts.sum())
        owner = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        idx = host_to_device(np.concatenate([owner, within]), self.device)
        rows, within_t = idx[:total], idx[total:]
        batch = self._take(owner.tolist(), rows)
        batch.output_lens = batch.output_lens + within_t
        if self.output_counts is None and self.seen is None:
            if len(self._positions) >= POSITIONS_KEPT:
                del self._positions[next(iter(self._positions))]
            self._positions[key] = _Positions(rows, within_t, batch)
        return batch

    def filter(self, keep: Sequence[int] | torch.Tensor) -> SamplingBatch:
        """A new batch of rows `keep` (in that order)."""
        rows = keep.tolist() if isinstance(keep, torch.Tensor) else [int(i) for i in keep]
        return self._take(rows, host_to_device(np.asarray(rows, dtype=np.int64), self.device))

    def _take(self, rows: list[int], idx: torch.Tensor) -> SamplingBatch:
        """`filter` with the rows both as a list and on this batch's device."""
        kw: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                kw[f.name] = v[idx]
            elif isinstance(v, list):
                kw[f.name] = [v[i] for i in rows]
            else:
                kw[f.name] = v
        out = SamplingBatch(**kw)
        out._drop_unused_state()
        return out

    @staticmethod
    def concat(batches: Sequence[SamplingBatch]) -> SamplingBatch:
        """Rows of `batches` one after the other; optional state is created (zeros) for batches that lack it."""
        batches = list(batches)
        if not batches:
            raise ValueError("concat needs at least one batch")
        V = batches[0].vocab_size
        if any(b.vocab_size != V for b in batches):
            raise ValueError("concat: batches have different vocab sizes")
        dev = batches[0].device
        kw: dict = {"vocab_size": V}
        for f in fields(SamplingBatch):
            if f.name == "vocab_size":
                continue
            values = [getattr(b, f.name) for b in batches]
            if isinstance(values[0], list):
                kw[f.name] = [x for v in values for x in v]
            elif f.name in ("block_ids", "has_block_ids"):
                continue
            elif all(v is None for v in values):
                kw[f.name] = None
            else:
                filled = [v if v is not None else _empty_state(f.name, b, V) for v, b in zip(values, batches)]
                kw[f.name] = torch.cat([t.to(dev) for t in filled])
        if any(b.block_ids is not None for b in batches):
            width = max(b.block_ids.shape[1] for b in batches if b.block_ids is not None)
            ids, has = [], []
            for b in batches:
                if b.block_ids is not None and b.has_block_ids is not None:
                    pad = b.block_ids[:, :1].expand(-1, width - b.block_ids.shape[1])
                    ids.append(torch.cat([b.block_ids, pad], dim=1))
                    has.append(b.has_block_ids)
                else:
                    ids.append(torch.zeros(b.batch_size, width, dtype=torch.int64, device=dev))
                    has.append(torch.zeros(b.batch_size, dtype=torch.bool, device=dev))
            kw["block_ids"], kw["has_block_ids"] = torch.cat(ids), torch.cat(has)
        return SamplingBatch(**kw)

    def _drop_unused_state(self) -> None:
        """After filtering, release [B, V] state no remaining row needs."""
        if not any(p.logit_bias for p in self.params):
            self.logit_bias = None
        if not (self.needs_frequency or self.needs_presence):
            self.output_counts = None
        if not self.needs_repetition:
            self.seen = None
        if not any(p.min_new_tokens > 0 for p in self.params):
            self.block_ids = self.has_block_ids = None


@dataclass(frozen=True)
class _Positions:
    """A `SamplingBatch.positions` result and what refreshes it: per row its source row and its position within
    its request, on the device."""

    rows: torch.Tensor
    within: torch.Tensor
    batch: SamplingBatch


def _as_np(ids: TokenIds) -> np.ndarray:
    if isinstance(ids, torch.Tensor):
        return ids.detach().cpu().numpy().astype(np.int64, copy=False)
    return np.asarray(ids, dtype=np.int64).reshape(-1)


def _flat_token_index(lists: Sequence[np.ndarray], V: int, device: torch.device) -> torch.Tensor:
    """Indices into a flattened [B, V] tensor of every (row, token) pair of `lists`."""
    lens = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
    if lens.sum() == 0:
        return torch.zeros(0, dtype=torch.int64, device=device)
    flat = np.concatenate(lists) + np.repeat(np.arange(len(lists), dtype=np.int64) * V, lens)
    return host_to_device(flat, device)


def _count_tokens(lists: Sequence[np.ndarray], V: int, device: torch.device) -> torch.Tensor:
    """[B, V] int32 count of each token id per row: one scatter-add over all tokens (no loop over the vocab)."""
    idx = _flat_token_index(lists, V, device)
    counts = torch.zeros(len(lists) * V, dtype=torch.int32, device=device)
    counts.index_add_(0, idx, torch.ones(idx.shape[0], dtype=torch.int32, device=device))
    return counts.view(len(lists), V)


def _mark_tokens(lists: Sequence[np.ndarray], V: int, device: torch.device) -> torch.Tensor:
    """[B, V] bool: which token ids occur in each row."""
    seen = torch.zeros(len(lists) * V, dtype=torch.bool, device=device)
    seen.index_fill_(0, _flat_token_index(lists, V, device), True)
    return seen.view(len(lists), V)


def _bias_tensor(params: Sequence[SamplingParams], V: int, device: torch.device) -> torch.Tensor:
    rows = [b for b, p in enumerate(params) for _ in p.logit_bias]
    cols = [t for p in params for t in p.logit_bias]
    vals = [v for p in params for v in p.logit_bias.values()]
    bias = torch.zeros(len(params), V, dtype=torch.float32, device=device)
    index = host_to_device(np.array([rows, cols], dtype=np.int64).reshape(2, len(rows)), device)
    bias[index[0], index[1]] = host_to_device(np.array(vals, dtype=np.float32), device)
    return bias


def _block_ids(params: Sequence[SamplingParams], eos_token_ids: Sequence[int],
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    per_row = [list(dict.fromkeys([*p.stop_token_ids, *(() if p.ignore_eos else eos_token_ids)])) for p in params]
    width = max(1, max(len(r) for r in per_row))
    padded = [(r + [r[0]] * (width - len(r))) if r else [0] * width for r in per_row]
    ids = host_to_device(np.array(padded, dtype=np.int64).reshape(len(params), width), device)
    has = host_to_device(np.array([bool(r) for r in per_row], dtype=np.bool_), device)
    return ids, has


def _empty_state(name: str, batch: SamplingBatch, V: int) -> torch.Tensor:
    """Neutral optional state for a batch that lacks it, when concatenated with one that has it."""
    dtypes = {"logit_bias": torch.float32, "output_counts": torch.int32, "seen": torch.bool}
    return torch.zeros(batch.batch_size, V, dtype=dtypes[name], device=batch.device)
