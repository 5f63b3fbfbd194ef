"""Shared Triton device helpers of the attention kernels (decode, multi-query decode, extend): one step of the
online (streaming) softmax, the pass of a query tile over K/V blocks read by slot, and the tile's epilogue."""

from __future__ import annotations

import triton
import triton.language as tl

# Running maxima start at a large finite negative instead of -inf, so a row whose scores are all masked (-inf)
# in a block gets exp2(-inf - m) = 0 and a rescale factor exp2(m - m) = 1, never inf - inf = NaN.
NEG_LARGE = tl.constexpr(-1.0e30)


@triton.jit
def online_softmax_step(qk, m_i, l_i, acc, v, scale):
    """Fold one KV block into the running state.

    qk [M, N] are fp32 raw scores q.k (masked entries -inf); `scale` = sm_scale * log2(e), applied here so that
    scaling and the max subtraction fuse into one multiply-add per score (the softmax, not the matmuls, bounds
    short causal blocks); m_i, l_i [M] are the running max and sum in the log2 domain; acc [M, D] is the fp32
    un-normalised output, accumulated by the P.V matmul in place; v [N, D] the values.
    """
    m_new = tl.maximum(m_i, tl.max(qk, 1) * scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk * scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def attend_kv_blocks(q_tile, q_pos, m_i, l_i, acc, slots_row, k_base, v_base, stride_ks, stride_vs, start, end,
                     sm_scale_log2, window, BLOCK_N: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr,
                     CAUSAL: tl.constexpr, WINDOWED: tl.constexpr, FP8: tl.constexpr):
    """Fold the key positions [start, end) into a query tile's running softmax state. K and V are read by slot
    (`slots_row`: the request's row of req_to_token; `k_base`/`v_base` at the KV head), FP8 codes widened to the
    query's dtype (their scales are the caller's). MASKED: the last block may run past `end`; with CAUSAL tile row
    r (at position q_pos[r]) sees keys <= q_pos[r], with WINDOWED keys > q_pos[r] - window (both need MASKED).
    Unmasked blocks load without bounds checks."""
    offs_d = tl.arange(0, D)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        if MASKED:
            mask_n = offs_n < end
            slots = tl.load(slots_row + offs_n, mask=mask_n, other=0).to(tl.int64)
            k = tl.load(k_base + slots[:, None] * stride_ks + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        else:
            slots = tl.load(slots_row + offs_n).to(tl.int64)
            k = tl.load(k_base + slots[:, None] * stride_ks + offs_d[None, :])
        if FP8:
            k = k.to(q_tile.dtype)
        qk = tl.dot(q_tile, tl.trans(k))
        if MASKED:
            visible = mask_n[None, :]
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= q_pos[:, None])
            if WINDOWED:
                visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
            qk = tl.where(visible, qk, float("-inf"))
            v = tl.load(v_base + slots[:, None] * stride_vs + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        else:
            v = tl.load(v_base + slots[:, None] * stride_vs + offs_d[None, :])
        if FP8:
            v = v.to(q_tile.dtype)
        m_i, l_i, acc = online_softmax_step(qk, m_i, l_i, acc, v, sm_scale_log2)
    return m_i, l_i, acc


@triton.jit
def normalised_tile(acc, l_i, v_scale, kv_head, FP8: tl.constexpr):
    """The tile's output acc / l (rows that saw no key: 0) and its safe denominators; an FP8 cache's V scale
    applied here once (P @ (codes * v_scale) = (P @ codes) * v_scale)."""
    if FP8:
        acc = acc * tl.load(v_scale + kv_head)
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    return acc / l_safe[:, None], l_safe
