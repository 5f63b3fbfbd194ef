"""Triton twin of `apply_rotary_reference`: rotate q and k in place, one program per token."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(x, stride_t, stride_h, t, num_heads, cos, sin, offs_i, mask_i,
                  HALF: tl.constexpr, BLOCK_H: tl.constexpr, IS_NEOX: tl.constexpr):
    """Rotate the first 2*HALF features of every head of token t of x (in place)."""
    offs_h = tl.arange(0, BLOCK_H)
    if IS_NEOX:  # pairs (i, i + HALF)
        off1 = offs_i
        off2 = offs_i + HALF
    else:  # interleaved pairs (2i, 2i + 1)
        off1 = 2 * offs_i
        off2 = 2 * offs_i + 1
    base = x + t * stride_t + offs_h[:, None] * stride_h
    mask = (offs_h[:, None] < num_heads) & mask_i[None, :]
    x1 = tl.load(base + off1[None, :], mask=mask, other=0.0)
    x2 = tl.load(base + off2[None, :], mask=mask, other=0.0)
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(base + off1[None, :], (x1f * cos[None, :] - x2f * sin[None, :]).to(x1.dtype), mask=mask)
    tl.store(base + off2[None, :], (x2f * cos[None, :] + x1f * sin[None, :]).to(x1.dtype), mask=mask)


@triton.jit
def _rotary_kernel(q, k, positions, cos_sin, stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
                   num_q_heads, num_kv_heads, HALF: tl.constexpr, BLOCK_I: tl.constexpr,
                   BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, IS_NEOX: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions + t).to(tl.int64)
    offs_i = tl.arange(0, BLOCK_I)
    mask_i = offs_i < HALF
    cos = tl.load(cos_sin + pos * stride_cs + offs_i, mask=mask_i, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin + pos * stride_cs + HALF + offs_i, mask=mask_i, other=0.0).to(tl.float32)
    _rotate_heads(q, stride_qt, stride_qh, t, num_q_heads, cos, sin, offs_i, mask_i, HALF, BLOCK_HQ, IS_NEOX)
    _rotate_heads(k, stride_kt, stride_kh, t, num_kv_heads, cos, sin, offs_i, mask_i, HALF, BLOCK_HK, IS_NEOX)


def apply_rotary_triton(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                        cos_sin_cache: torch.Tensor, is_neox: bool = True) -> None:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place by cos_sin_cache[positions] (cat(cos, sin) rows).

    q and k may be strided views (e.g. slices of a fused qkv projection) as long as features are contiguous.
    """
    num_tokens = q.shape[0]
    if num_tokens == 0:
        return
    assert q.stride(-1) == 1 and k.stride(-1) == 1, "rotary needs contiguous features"
    assert cos_sin_cache.stride(-1) == 1
    half = cos_sin_cache.shape[-1] // 2
    _rotary_kernel[(num_tokens,)](
        q, k, positions, cos_sin_cache, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        cos_sin_cache.stride(0), q.shape[1], k.shape[1], HALF=half, BLOCK_I=triton.next_power_of_2(half),
        BLOCK_HQ=triton.next_power_of_2(q.shape[1]), BLOCK_HK=triton.next_power_of_2(k.shape[1]),
        IS_NEOX=is_neox, num_warps=4,
    )
