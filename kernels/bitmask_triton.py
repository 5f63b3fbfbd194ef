"""Triton twin of `apply_token_bitmask_reference`: -inf every logit whose grammar bit is 0, in place."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _bitmask_kernel(logits, bitmask, indices, stride_l, stride_b, stride_i, vocab, num_words,
                    HAS_INDICES: tl.constexpr, BLOCK: tl.constexpr):
    """Program (n, c): logits row indices[n] (or n), vocab block c; bit v of the row lives in word v // 32."""
    n = tl.program_id(0).to(tl.int64)
    if HAS_INDICES:
        row = tl.load(indices + n * stride_i).to(tl.int64)
    else:
        row = n
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    word = offs // 32
    # Words past the mask's end read as 0: tokens the mask does not cover are disallowed, like the reference.
    bits = tl.load(bitmask + n * stride_b + word, mask=(offs < vocab) & (word < num_words), other=0)
    allowed = ((bits >> (offs % 32)) & 1) != 0
    neg_inf = tl.full([BLOCK], float("-inf"), logits.dtype.element_ty)
    tl.store(logits + row * stride_l + offs, neg_inf, mask=(offs < vocab) & ~allowed)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor,
                               indices: torch.Tensor | None = None) -> None:
    """logits [R, V]; bitmask [N, W] int32 (N == R without indices; rows may be strided); indices [N] (any
    stride: the engine's staging keeps each row's index in the word after its mask) names the rows masked."""
    assert logits.stride(-1) == 1 and bitmask.stride(-1) == 1 and bitmask.dtype == torch.int32
    bitmask2 = bitmask.reshape(-1, bitmask.shape[-1])
    rows, vocab = bitmask2.shape[0], logits.shape[-1]
    if rows == 0:
        return
    block = 4096
    _bitmask_kernel[(rows, triton.cdiv(vocab, block))](
        logits, bitmask2, indices if indices is not None else bitmask2, logits.stride(0), bitmask2.stride(0),
        indices.stride(0) if indices is not None else 0,
        vocab, bitmask2.shape[1], HAS_INDICES=indices is not None, BLOCK=block, num_warps=4,
    )
