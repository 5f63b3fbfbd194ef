"""Shared Triton device helper for the attention kernels: one step of the online (streaming) softmax."""

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
