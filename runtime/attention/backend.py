"""The attention backend interface, and the split of a forward's requests into decode rows and extend rows.

A backend is planned once per forward, `plan(batch) -> metadata` (by the model runner, or inside the captured
region by the CUDA-graph runner), and called by every attention layer, `forward(q, k_cache, v_cache, layer,
metadata) -> o`, after the layer has stored its new tokens' K/V in the pool: attention then reads every
position of every request by slot, the new tokens included. The metadata is one frozen dataclass per backend
holding what all layers of the forward index with. An FP8 pool's layer comes with its `kv_scales`, (k_scale,
v_scale) [Hkv] fp32, which the layer's store used and the backend's reads dequantize by.

Requests keep ForwardBatch's description, (prefix_len, extend_len) per request. `split_rows` is the one place
that says which of them the decode kernel serves: the leading run of requests extending by one token (running
decodes, which the scheduler puts first); the rest go through the extend kernel, which tiles many queries per
program (a decode row there would fill a query tile with one query). A backend with a multi-query decode kernel
(decode's split-K with several new tokens per row) names the most new tokens it takes per row: an EXTEND batch
none of whose requests extends by more (a speculative verify step, a multi-token CUDA graph's rows: 1 + k tokens
after a cached prefix) goes through it whole, as the `multi` part. `Rows` counts tokens apart from rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from radixgen.runtime.config import ModelConfig
from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode

MetadataT = TypeVar("MetadataT")
KVScales = tuple[torch.Tensor, torch.Tensor]  # (k_scale, v_scale) [Hkv] fp32 of one layer of an FP8 pool


@dataclass(frozen=True)
class AttentionShape:
    """What a backend knows of the model's attention layers."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_windows: tuple[int | None, ...]  # per layer: attend to the last this many positions (None: all)

    @classmethod
    def of(cls, config: ModelConfig) -> AttentionShape:
        return cls(config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                   tuple(config.layer_sliding_window(i) for i in range(config.num_hidden_layers)))

    @property
    def scale(self) -> float:
        return float(self.head_dim ** -0.5)

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.num_kv_heads


class AttentionBackend(Protocol[MetadataT]):
    """Attention over the KV pool for one kind of device: planned per forward, called per layer."""

    def plan(self, batch: ForwardBatch) -> MetadataT:
        """What every layer of `batch`'s forward indexes with. Call once per forward, before the layers."""
        ...

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, layer: int,
                metadata: MetadataT, kv_scales: KVScales | None = None) -> torch.Tensor:
        """q [T, Hq, D] of the forward's new tokens -> o [T, Hq, D] for model layer `layer`, whose K/V pool
        buffers (the new tokens' K/V already stored) are k_cache and v_cache (FP8 codes: with `kv_scales`)."""
        ...


@dataclass(frozen=True)
class Rows:
    """A run of consecutive requests of one forward and their new tokens, flat rows [first_token, first_token +
    num_tokens) of q. Per-request tensors [N] on the model's device; extend_start_loc counts from first_token."""

    req_pool_indices: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    seq_lens: torch.Tensor
    extend_start_loc: torch.Tensor
    first_token: int
    num_tokens: int
    max_extend_len: int  # at least every extend_len of the run


@dataclass(frozen=True)
class RowSplit:
    """A forward's requests as the decode rows (first) and the extend rows, either part possibly absent; or, as
    `multi` (the other two then None), all of them as rows of a few new tokens each."""

    req_to_token: torch.Tensor
    max_seq_len: int  # at least every seq_len of the forward
    decode: Rows | None
    extend: Rows | None
    multi: Rows | None = None


def split_rows(batch: ForwardBatch, multi_query_max_tokens: int = 0) -> RowSplit:
    """Every request of a DECODE batch is a decode row, in an EXTEND batch the leading `num_decode_rows`; but an
    EXTEND batch whose `max_extend_len` is at most `multi_query_max_tokens` is one `multi` part. Only views of
    the batch's tensors, except the extend part's shifted starts in a mixed batch (a DECODE batch's split, and a
    multi part, thus read the batch's buffers, as a captured CUDA graph needs) and the extend part's copies of
    the parts a view would start off a 16-byte boundary."""
    if batch.mode is ForwardMode.EXTEND and batch.max_extend_len <= multi_query_max_tokens:
        multi = Rows(batch.req_pool_indices, batch.prefix_lens, batch.extend_lens, batch.seq_lens,
                     batch.extend_start_loc, first_token=0, num_tokens=batch.num_tokens,
                     max_extend_len=batch.max_extend_len)
        return RowSplit(batch.req_to_token, batch.max_seq_len, None, None, multi)
    n = batch.batch_size
    nd = n if batch.mode is ForwardMode.DECODE else batch.num_decode_rows
    decode = extend = None
    if nd:  # one token per decode row: the decode part's tokens are the first nd
        decode = Rows(batch.req_pool_indices[:nd], batch.prefix_lens[:nd], batch.extend_lens[:nd],
                      batch.seq_lens[:nd], batch.extend_start_loc[:nd], first_token=0, num_tokens=nd,
                      max_extend_len=1)
    if nd < n:
        start = batch.extend_start_loc[nd:]
        extend = Rows(_aligned_tail(batch.req_pool_indices, nd), _aligned_tail(batch.prefix_lens, nd),
                      _aligned_tail(batch.extend_lens, nd), _aligned_tail(batch.seq_lens, nd),
                      start - nd if nd else start, first_token=nd,
                      num_tokens=batch.num_tokens - nd, max_extend_len=batch.max_extend_len)
    return RowSplit(batch.req_to_token, batch.max_seq_len, decode, extend)


def _aligned_tail(values: torch.Tensor, start: int) -> torch.Tensor:
    """`values[start:]`, copied where the view would not start on a 16-byte boundary: Triton specializes a kernel
    on its pointers' alignment, so an unaligned view (a mixed batch's extend rows after an odd number of decode
    rows) compiles another variant of the kernel, seconds in the middle of a run, and runs it unvectorized."""
    tail = values[start:]
    return tail if tail.data_ptr() % 16 == 0 else tail.clone()


def attend_split(q: torch.Tensor, split: RowSplit, decode: Callable[[torch.Tensor, Rows], torch.Tensor],
                 extend: Callable[[torch.Tensor, Rows], torch.Tensor],
                 multi: Callable[[torch.Tensor, Rows], torch.Tensor] | None = None) -> torch.Tensor:
    """o for q [T, Hq, D]: the decode rows' tokens through `decode`, the extend rows' through `extend` (each
    given its part of q and its Rows), concatenated in token order; a split's `multi` part through `multi`."""
    if split.multi is not None:
        assert multi is not None, "a split with a multi part needs the multi-query op"
        return multi(q, split.multi)
    if split.extend is None:
        return decode(q, split.decode) if split.decode is not None else torch.empty_like(q)
    if split.decode is None:
        return extend(q, split.extend)
    nd = split.decode.num_tokens
    return torch.cat([decode(q[:nd], split.decode), extend(q[nd:], split.extend)])
