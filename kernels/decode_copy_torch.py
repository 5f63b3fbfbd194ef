"""The CPU decode step over per-request K/V copies carried from one step to the next (no Triton twin: the GPU
kernel reads the pool in place).

On the CPU the gather of every decode request's context from the slot pool costs about as much as the attention
that reads it, and consecutive steps gather the same keys again plus one new key per request. The caller keeps
each request's keys and values in a row of per-layer buffers and decides per forward which buffer row each
request holds and which of its positions must be (re)filled from the pool (`CopyPlacement`, the policy in
runtime/attention/decode_kv_copies.py). `plan_copy_step` turns that into the index tensors every layer of the
forward shares, and `decode_attention_from_copy` brings one layer's buffers up to date and attends over them.
The copies hold K/V in the query dtype: rows read from an FP8 pool are dequantized as they are copied.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from radixgen.kernels.attention_torch import (
    _additive,
    _cascade_attention,
    _cascade_own_mask,
    _gather_kv,
    _padded_attention,
    _padded_mask,
)
from radixgen.kernels.kv_quant import dequantize_kv, kv_scales_for


@dataclass(frozen=True)
class CopyPlacement:
    """Where one forward's decode requests sit in the copy buffers [R, Hkv, capacity, D]: buffer row r, column j
    holds position `shared + j` of the request assigned to row r."""

    rows: Tensor  # [B] int64: buffer row of decode request b
    fill: Tensor  # [F] int64: the requests b whose rows are (re)filled from the pool before this step's append
    fill_from: Tensor  # [F] int64: the first position each of them fills (what their rows hold already ends there)
    num_rows: int  # attention runs over buffer rows [0, num_rows); rows no request holds are fully masked
    shared: int = 0  # leading slots every request has in common: read from the pool once per step (cascade)
    in_order: bool = False  # rows == arange(B) and num_rows == B: no scatter of queries or gather of outputs


@dataclass(frozen=True)
class CopyFill:
    """The pool slots a step's fills read and the buffer cells they write (positions fill_from .. seq - 1 of each
    filled request; shorter ranges repeat their last position, the same slot written twice with the same values)."""

    slots: Tensor  # [F * n] int64
    rows: Tensor  # [F, n] buffer rows
    cols: Tensor  # [F, n] buffer columns


@dataclass(frozen=True)
class CopyStep:
    """The index tensors of one forward's copy updates and attention, the same for every layer."""

    placement: CopyPlacement
    fill: CopyFill | None  # None: every request only appends its newest key and value
    newest: Tensor  # [B] pool slot of each request's newest key (written by this forward)
    newest_cols: Tensor  # [B] its buffer column
    length: int  # the longest request's length
    seq_rows: Tensor  # [num_rows] length of each buffer row's request (0: a row no request holds)
    q_pos: Tensor  # [num_rows, 1] position of each row's query
    shared_slots: Tensor | None  # [1, shared] pool slots of the shared prefix, None without one


def plan_copy_step(req_to_token: Tensor, req_pool_indices: Tensor, seq_lens: Tensor,
                   placement: CopyPlacement) -> CopyStep:
    """The CopyStep of decode requests (table rows `req_pool_indices`, lengths `seq_lens` after this step)."""
    seq = seq_lens.long()
    p, rows = placement.shared, placement.rows
    fill = None
    if len(placement.fill):
        f, start = placement.fill, placement.fill_from
        end = seq[f]
        n = int((end - start).max())
        pos = torch.minimum(start[:, None] + torch.arange(n, device=seq.device), end[:, None] - 1)  # [F, n]
        fill = CopyFill(req_to_token[req_pool_indices[f][:, None], pos].long().reshape(-1),
                        rows[f][:, None].expand(-1, n), pos - p)
    if placement.in_order:
        seq_rows = seq
    else:
        seq_rows = seq.new_zeros(placement.num_rows)
        seq_rows[rows] = seq
    return CopyStep(placement, fill, newest=req_to_token[req_pool_indices, seq - 1].long(), newest_cols=seq - 1 - p,
                    length=int(seq.max()), seq_rows=seq_rows, q_pos=(seq_rows - 1)[:, None],
                    shared_slots=req_to_token[req_pool_indices[:1], :p].long() if p else None)


def copy_step_mask(step: CopyStep, group: int, dtype: torch.dtype, sliding_window: int | None) -> Tensor:
    """The additive mask `decode_attention_from_copy` applies for query dtype `dtype` and `group` query heads per
    KV head: over each row's own keys after a shared prefix (which every query sees: no window then), else over
    each row's keys within its length and `sliding_window`."""
    p = step.placement.shared
    if p:
        return _cascade_own_mask(step.q_pos, step.seq_rows, p, step.length - p, group, dtype)
    return _additive(_padded_mask(step.q_pos, step.seq_rows, step.length, group, sliding_window), dtype)


def decode_attention_from_copy(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_copy: Tensor, v_copy: Tensor,
                               step: CopyStep, mask: Tensor, sm_scale: float, k_scale: Tensor | None = None,
                               v_scale: Tensor | None = None) -> Tensor:
    """q [B, Hq, D] of the decode requests -> o [B, Hq, D], like `decode_attention_torch` (with the window that
    `mask`, `copy_step_mask`'s result, was made for), each request's own keys read from one layer's copy
    buffers (k_copy, v_copy [R, Hkv, capacity, D]) after this step's fills and appends from the pool (an FP8
    pool's dequantized by k_scale / v_scale)."""
    pl = step.placement
    p, rows = pl.shared, pl.rows
    scales = kv_scales_for(k_cache, k_scale, v_scale)
    ks, vs = scales if scales is not None else (None, None)
    if step.fill is not None:
        shape = (*step.fill.rows.shape, *k_cache.shape[1:])
        k_copy.permute(0, 2, 1, 3)[step.fill.rows, step.fill.cols] = (
            dequantize_kv(k_cache.index_select(0, step.fill.slots), ks, k_copy.dtype).view(shape))
        v_copy.permute(0, 2, 1, 3)[step.fill.rows, step.fill.cols] = (
            dequantize_kv(v_cache.index_select(0, step.fill.slots), vs, v_copy.dtype).view(shape))
    k_copy.permute(0, 2, 1, 3)[rows, step.newest_cols] = dequantize_kv(k_cache.index_select(0, step.newest), ks,
                                                                       k_copy.dtype)
    v_copy.permute(0, 2, 1, 3)[rows, step.newest_cols] = dequantize_kv(v_cache.index_select(0, step.newest), vs,
                                                                       v_copy.dtype)
    kt = k_copy[: pl.num_rows, :, : step.length - p]  # [R', Hkv, L - P, D] views: no copy
    vt = v_copy[: pl.num_rows, :, : step.length - p]
    qr = q
    if not pl.in_order:  # queries into their rows; rows no request holds get length 0 (every key masked)
        qr = q.new_zeros(pl.num_rows, *q.shape[1:])
        qr[rows] = q
    if step.shared_slots is not None:
        k_shared, v_shared = _gather_kv(k_cache, v_cache, step.shared_slots, q.dtype, scales)
        out = _cascade_attention(qr[:, None], k_shared, v_shared, kt, vt, step.q_pos, step.seq_rows, p, sm_scale,
                                 mask)[:, 0]
    else:  # the mask holds the window
        out = _padded_attention(qr[:, None], kt, vt, step.q_pos, step.seq_rows, sm_scale, None, mask)[:, 0]
    return out if pl.in_order else out[rows]
