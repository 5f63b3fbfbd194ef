"""Triton twin of `silu_and_mul_reference`: the gated MLP activation in one pass."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(x, out, stride_x, stride_o, N: tl.constexpr, BLOCK: tl.constexpr):
    """Row r, block c: out[r, j] = silu(x[r, j]) * x[r, N + j] for j in block c (fp32 math)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    gate = tl.load(x + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x + row * stride_x + N + offs, mask=mask, other=0.0).to(tl.float32)
    act = gate / (1.0 + tl.exp(-gate))
    tl.store(out + row * stride_o + offs, (act * up).to(out.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2n] -> silu(x[..., :n]) * x[..., n:] in x.dtype."""
    n = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows == 0 or n == 0:
        return out
    block = min(triton.next_power_of_2(n), 2048)
    _silu_and_mul_kernel[(rows, triton.cdiv(n, block))](x2, out.view(-1, n), x2.stride(0), n, N=n, BLOCK=block,
                                                        num_warps=4)
    return out
