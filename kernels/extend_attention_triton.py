"""Triton twin of `extend_attention_reference`: prefill attention over the slot-indexed KV pool.

One program per (query head, block of BLOCK_M new tokens, request). The new tokens of request b sit at
positions prefix_lens[b] .. seq_len - 1; their K/V rows are already in the pool, so the program reads every
position it may see (cached prefix and the new tokens alike) by slot through req_to_token, and never copies
the prefix. Positions every row of the block sees (all before the block's first query) run unmasked; the
diagonal blocks run with the causal mask. With a sliding window every block is masked. Softmax is the online
(streaming) form with fp32 accumulation. Programs of one request's heads are adjacent in the launch order, so
the query heads of a GQA group read the same K/V blocks close in time (from L2); the heaviest (last) query
blocks start first. An FP8 cache is read as the decode kernel reads it (decode_attention_triton's docstring).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixgen.kernels.kv_quant import kv_scales_for
from radixgen.kernels.softmax_triton import NEG_LARGE, attend_kv_blocks, normalised_tile

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class ExtendConfig:
    """Launch shape of the extend kernel."""

    block_m: int = 128
    block_n: int = 128
    num_warps: int = 8
    num_stages: int = 3


def default_extend_config(head_dim: int) -> ExtendConfig:
    """Tile shape by head size (bigger heads need more shared memory per KV block)."""
    if head_dim <= 128:
        # 128x64 tiles with 4 warps: as fast as 128x128 with 8 over the tile sweep (docs/performance-notes.md)
        return ExtendConfig(block_m=128, block_n=64, num_warps=4, num_stages=3)
    return ExtendConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)


@triton.jit
def _extend_kernel(
    q, k_cache, v_cache, k_scale, v_scale, o, req_to_token, req_pool_indices, prefix_lens, extend_lens,
    extend_start_loc,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_ks, stride_kh, stride_vs, stride_vh, stride_rt,
    sm_scale_log2, window,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr, FP8: tl.constexpr,
):
    head = tl.program_id(0)
    m_block = tl.num_programs(1) - 1 - tl.program_id(1)
    b = tl.program_id(2)
    extend_len = tl.load(extend_lens + b).to(tl.int32)
    start_m = m_block * BLOCK_M
    if start_m >= extend_len:
        return
    prefix_len = tl.load(prefix_lens + b).to(tl.int32)
    seq_len = prefix_len + extend_len
    first_token = tl.load(extend_start_loc + b).to(tl.int64)
    req = tl.load(req_pool_indices + b).to(tl.int64)
    kv_head = (head // GROUP).to(tl.int64)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    mask_m = offs_m < extend_len
    q_pos = prefix_len + offs_m
    offs_d = tl.arange(0, D)
    rows = first_token + offs_m
    q_tile = tl.load(q + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :], mask=mask_m[:, None],
                     other=0.0)

    m_i = tl.full([BLOCK_M], NEG_LARGE, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    k_base = k_cache + kv_head * stride_kh
    v_base = v_cache + kv_head * stride_vh
    slots_row = req_to_token + req * stride_rt
    if FP8:  # scores q.k = (q . codes) * k_scale: fold it into the softmax scale
        sm_scale_log2 = sm_scale_log2 * tl.load(k_scale + kv_head)

    first_q = prefix_len + start_m  # position of the block's first query
    kv_end = tl.minimum(first_q + BLOCK_M, seq_len)  # causal: nothing at or past this is seen
    if HAS_WINDOW:
        lo = (tl.maximum(first_q - window + 1, 0) // BLOCK_N) * BLOCK_N
        full_end = lo
    else:
        lo = 0
        full_end = ((first_q + 1) // BLOCK_N) * BLOCK_N  # every row sees all of [0, full_end)

    m_i, l_i, acc = attend_kv_blocks(q_tile, q_pos, m_i, l_i, acc, slots_row, k_base, v_base, stride_ks, stride_vs,
                                     lo, full_end, sm_scale_log2, window, BLOCK_N, D, MASKED=False, CAUSAL=False,
                                     WINDOWED=False, FP8=FP8)
    m_i, l_i, acc = attend_kv_blocks(q_tile, q_pos, m_i, l_i, acc, slots_row, k_base, v_base, stride_ks, stride_vs,
                                     full_end, kv_end, sm_scale_log2, window, BLOCK_N, D, MASKED=True, CAUSAL=True,
                                     WINDOWED=HAS_WINDOW, FP8=FP8)
    out, _ = normalised_tile(acc, l_i, v_scale, kv_head, FP8)
    tl.store(o + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :], out.to(o.dtype.element_ty),
             mask=mask_m[:, None])


def extend_attention_triton(
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
    config: ExtendConfig | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, Hq, D]; k_cache/v_cache [S, Hkv, D] already holding the new rows -> o [T, Hq, D].

    `max_extend_len` (an upper bound of extend_lens) sizes the grid; pass it to avoid a device sync. An FP8 cache
    takes its k_scale and v_scale ([Hkv] fp32).
    """
    scales = kv_scales_for(k_cache, k_scale, v_scale)
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    assert num_q_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    config = config or default_extend_config(head_dim)
    o = torch.empty_like(q)
    batch = int(extend_lens.shape[0])
    if num_tokens == 0 or batch == 0:
        return o
    if max_extend_len is None:
        max_extend_len = int(extend_lens.max())
    grid = (num_q_heads, triton.cdiv(max_extend_len, config.block_m), batch)
    ks, vs = scales if scales is not None else (k_cache, v_cache)  # unread without FP8
    _extend_kernel[grid](
        q, k_cache, v_cache, ks, vs, o, req_to_token, req_pool_indices, prefix_lens, extend_lens, extend_start_loc,
        q.stride(0), q.stride(1), o.stride(0), o.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), req_to_token.stride(0),
        sm_scale * LOG2E, sliding_window or 0,
        GROUP=num_q_heads // num_kv_heads, D=head_dim, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        HAS_WINDOW=sliding_window is not None, FP8=scales is not None, num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return o
