"""Attention of one ForwardBatch over the KV pool, each request through the kernel built for its shape.

Decode rows (one new token each) go through the decode kernel: split-K over the context, one read of a KV block
serving every query head of its group. Extend rows (prefill chunks) go through the extend kernel, which tiles
many queries per program. A mixed batch (the scheduler puts running decodes first, then prefill chunks) is split
at `num_decode_rows`: run through the extend kernel, each decode row would fill a 128-query tile with one query
and re-read its whole context once per query head.
"""

from __future__ import annotations

import torch

from radixgen import kernels
from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode


def batch_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch,
                    scale: float, sliding_window: int | None, layer: int = 0) -> torch.Tensor:
    """q [T, Hq, D] (K/V of the new tokens already stored) -> o [T, Hq, D] for model layer `layer`."""
    if batch.mode is ForwardMode.DECODE:
        return _decode(q, k_cache, v_cache, batch, slice(None), scale, sliding_window, layer)
    nd = batch.num_decode_rows
    if nd == 0:
        return _extend(q, k_cache, v_cache, batch, slice(None), scale, sliding_window)
    rows = slice(nd, None)
    # Decode rows are the first nd requests and the first nd tokens; the extend part's offsets shift by nd.
    return torch.cat([_decode(q[:nd], k_cache, v_cache, batch, slice(0, nd), scale, sliding_window, layer),
                      _extend(q[nd:], k_cache, v_cache, batch, rows, scale, sliding_window, start_shift=nd)])


def _decode(q, k_cache, v_cache, batch: ForwardBatch, rows: slice, scale: float, window: int | None, layer: int):
    if batch.kv_copies is not None:  # the CPU decode over the decode rows' K/V copies (runtime/decode_kv_copies.py)
        return kernels.decode_attention_torch(q, k_cache, v_cache, batch.req_to_token, batch.req_pool_indices[rows],
                                              batch.seq_lens[rows], scale, sliding_window=window,
                                              kv_copy=batch.kv_copies[layer])
    return kernels.decode_attention(q, k_cache, v_cache, batch.req_to_token, batch.req_pool_indices[rows],
                                    batch.seq_lens[rows], scale, sliding_window=window, max_seq_len=batch.max_seq_len)


def _extend(q, k_cache, v_cache, batch: ForwardBatch, rows: slice, scale: float, window: int | None,
            start_shift: int = 0):
    start = batch.extend_start_loc[rows]
    if start_shift:
        start = start - start_shift
    return kernels.extend_attention(q, k_cache, v_cache, batch.req_to_token, batch.req_pool_indices[rows],
                                    batch.prefix_lens[rows], batch.extend_lens[rows], start, scale,
                                    sliding_window=window, max_extend_len=batch.max_extend_len,
                                    scratch=batch.attention_scratch)
