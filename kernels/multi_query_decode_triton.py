"""Triton twin of `multi_query_decode_attention_reference`: decode attention for rows of a few new tokens each.

A speculative verify row (1 + k drafts) or a multi-token row (forced text) appends 2..8 tokens after a long
cached prefix. This is the decode kernel's design (decode_attention_triton's docstring) with the new tokens in
the M dimension too: stage 1 runs one program per (request, KV head, split), whose query tile holds every
(new token, query head of the KV head's group) pair of the row, row r = token (r // GROUP_P2) and head
(r % GROUP_P2), padded to 16 rows for the tensor cores. Each K/V block is read once per group and row, not
once per query head and query block as in the extend kernel. New token j (position prefix_len + j) sees the
prefix and new tokens 0..j: the causal and sliding-window masks are per tile row.

Each request divides its own visible range, [max(prefix_len + 1 - window, 0), seq_len), into the launch's
splits, rounded to whole blocks; a split writes its normalised partial and log2-sum-exp per (token, head), and
a merge program per (request, head, new token) combines them as the decode kernel's merge does. One split
writes the output directly.

The launch is fixed by (number of requests, number of flat tokens, max_extend_len, split count): pass
`max_extend_len` and `max_seq_len` (or `num_splits`) and it reads the real lengths from device memory, so a
CUDA graph captured for a bucket replays it for any rows within those bounds. A request of 0 new tokens (graph
padding) does nothing; flat tokens no request owns are left unwritten, as the extend kernel leaves them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixgen.kernels.decode_attention_triton import LOG2E, DecodeConfig, merge_splits_row, num_kv_splits, sm_count
from radixgen.kernels.extend_attention_triton import extend_attention_triton
from radixgen.kernels.kv_quant import kv_scales_for
from radixgen.kernels.softmax_triton import NEG_LARGE, attend_kv_blocks, normalised_tile

MAX_TILE_ROWS = 128  # (new tokens x group heads) rows of one query tile; a launch needing more runs the extend kernel


@triton.jit
def _multi_query_split_kernel(
    q, k_cache, v_cache, k_scale, v_scale, out, mid_o, mid_lse, req_to_token, req_pool_indices, prefix_lens,
    extend_lens, extend_start_loc,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_ks, stride_kh, stride_vs, stride_vh, stride_rt,
    stride_mt, stride_mh, stride_ms, stride_lt, stride_lh,
    sm_scale_log2, window, num_splits,
    GROUP: tl.constexpr, GROUP_P2: tl.constexpr, BLOCK_M: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
    DIRECT_OUT: tl.constexpr, HAS_WINDOW: tl.constexpr, FP8: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    extend_len = tl.load(extend_lens + b).to(tl.int32)
    if extend_len == 0:  # a padding request: no tokens, nothing to read or write
        return
    prefix_len = tl.load(prefix_lens + b).to(tl.int32)
    seq_len = prefix_len + extend_len
    first_token = tl.load(extend_start_loc + b).to(tl.int64)
    req = tl.load(req_pool_indices + b).to(tl.int64)
    lo = 0
    if HAS_WINDOW:  # the first new token, at position prefix_len, sees positions > prefix_len - window
        lo = tl.maximum(prefix_len + 1 - window, 0)
    split_len = tl.cdiv(tl.cdiv(seq_len - lo, num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_m = tl.arange(0, BLOCK_M)
    tok = offs_m // GROUP_P2  # new token of tile row r
    head_in_group = offs_m % GROUP_P2
    valid = (tok < extend_len) & (head_in_group < GROUP)
    q_pos = prefix_len + tok
    rows = first_token + tok
    heads = kv_head * GROUP + head_in_group
    offs_d = tl.arange(0, D)
    q_tile = tl.load(q + rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                     mask=valid[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], NEG_LARGE, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    k_base = k_cache + kv_head.to(tl.int64) * stride_kh
    v_base = v_cache + kv_head.to(tl.int64) * stride_vh
    slots_row = req_to_token + req * stride_rt
    if FP8:  # scores q.k = (q . codes) * k_scale: fold it into the softmax scale
        sm_scale_log2 = sm_scale_log2 * tl.load(k_scale + kv_head)
    m_i, l_i, acc = attend_kv_blocks(q_tile, q_pos, m_i, l_i, acc, slots_row, k_base, v_base, stride_ks, stride_vs,
                                     start, end, sm_scale_log2, window, BLOCK_N, D, MASKED=True, CAUSAL=True,
                                     WINDOWED=HAS_WINDOW, FP8=FP8)
    part, l_safe = normalised_tile(acc, l_i, v_scale, kv_head, FP8)
    if DIRECT_OUT:  # a single split: its normalised partial is the output
        tl.store(out + rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 part.to(out.dtype.element_ty), mask=valid[:, None])
    else:  # a split that sees none of a token's keys (past it, or before its window) has lse -inf: weight 0
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        mid_row = rows * stride_mt + heads * stride_mh + split * stride_ms
        tl.store(mid_o + mid_row[:, None] + offs_d[None, :], part, mask=valid[:, None])
        tl.store(mid_lse + rows * stride_lt + heads * stride_lh + split, lse, mask=valid)


@triton.jit
def _multi_query_merge_kernel(mid_o, mid_lse, out, extend_lens, extend_start_loc, stride_mt, stride_mh, stride_ms,
                              stride_lt, stride_lh, stride_ot, stride_oh, num_splits,
                              BLOCK_S: tl.constexpr, D: tl.constexpr):
    """The splits of new token j of request b merged, for one head (the decode kernel's merge); tokens no request
    owns are never read (their partials were never written) nor written."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    j = tl.program_id(2)
    if j >= tl.load(extend_lens + b):
        return
    t = tl.load(extend_start_loc + b).to(tl.int64) + j
    merge_splits_row(mid_o + t * stride_mt + h * stride_mh, mid_lse + t * stride_lt + h * stride_lh,
                     out + t * stride_ot + h * stride_oh, stride_ms, num_splits, BLOCK_S, D)


def tile_rows(group: int, max_extend_len: int) -> tuple[int, int]:
    """(GROUP_P2, BLOCK_M): the group padded to a power of two, and the query tile's rows (new tokens padded to
    a power of two, times GROUP_P2, at least 16 for the tensor cores)."""
    group_p2 = triton.next_power_of_2(group)
    return group_p2, max(16, group_p2 * triton.next_power_of_2(max(max_extend_len, 1)))


def default_multi_query_config(block_m: int) -> DecodeConfig:
    """The decode kernel's launch shape (each program moves the same K/V blocks), with 8 warps from 64 tile rows
    on: the fp32 accumulator grows with the rows, and at 128 rows 4 warps spill registers (sm_90)."""
    return DecodeConfig() if block_m <= 32 else DecodeConfig(num_warps=8)


def multi_query_decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    sm_scale: float,
    sliding_window: int | None = None,
    max_extend_len: int | None = None,
    max_seq_len: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    config: DecodeConfig | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """q [T, Hq, D] (request b's new tokens at rows extend_start_loc[b] + j, positions prefix_lens[b] + j) ->
    o [T, Hq, D]; k_cache/v_cache [S, Hkv, D] already hold the new rows.

    `max_extend_len` (an upper bound of extend_lens, it sizes the query tile) and `max_seq_len` (of prefix_lens
    + extend_lens, it sizes the split count) avoid device syncs; a CUDA graph passes its bucket's bounds, or a
    fixed `num_splits`. An FP8 cache takes its k_scale and v_scale ([Hkv] fp32).
    """
    scales = kv_scales_for(k_cache, k_scale, v_scale)
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    assert num_q_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(q)
    batch = int(extend_lens.shape[0])
    if num_tokens == 0 or batch == 0:
        return out
    if max_extend_len is None:
        max_extend_len = int(extend_lens.max())
    group_p2, block_m = tile_rows(group, max_extend_len)
    if block_m > MAX_TILE_ROWS:  # too many queries for one tile: the extend kernel tiles them
        return extend_attention_triton(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens,
                                       extend_lens, extend_start_loc, sm_scale, sliding_window, max_extend_len,
                                       k_scale=k_scale, v_scale=v_scale)
    config = config or default_multi_query_config(block_m)
    if num_splits is None:
        if max_seq_len is None:
            max_seq_len = int((prefix_lens + extend_lens).max())
        if sliding_window is not None:  # a row's tokens see at most its last window + extend_len - 1 positions
            max_seq_len = min(max_seq_len, sliding_window + max_extend_len - 1)
        sms = sm_count(q.device.index or 0) if q.is_cuda else 132
        num_splits = num_kv_splits(batch, num_kv_heads, max_seq_len, sms, config)
    if num_splits > 1:
        mid_o = torch.empty(num_tokens, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        mid_lse = torch.empty(num_tokens, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
    else:  # unused by the kernel; any float32 tensors keep the signature uniform
        mid_o = torch.empty(1, 1, 1, 1, dtype=torch.float32, device=q.device)
        mid_lse = torch.empty(1, 1, 1, dtype=torch.float32, device=q.device)
    ks, vs = scales if scales is not None else (k_cache, v_cache)  # unread without FP8
    _multi_query_split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, ks, vs, out, mid_o, mid_lse, req_to_token, req_pool_indices, prefix_lens,
        extend_lens, extend_start_loc,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), req_to_token.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        sm_scale * LOG2E, sliding_window or 0, num_splits,
        GROUP=group, GROUP_P2=group_p2, BLOCK_M=block_m, D=head_dim, BLOCK_N=config.block_n,
        DIRECT_OUT=num_splits == 1, HAS_WINDOW=sliding_window is not None, FP8=scales is not None,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if num_splits > 1:
        _multi_query_merge_kernel[(batch, num_q_heads, max_extend_len)](
            mid_o, mid_lse, out, extend_lens, extend_start_loc, mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
            mid_lse.stride(0), mid_lse.stride(1), out.stride(0), out.stride(1), num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits), D=head_dim, num_warps=4,
        )
    return out
