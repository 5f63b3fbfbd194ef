"""Triton twins of `rmsnorm_reference` and `fused_add_rmsnorm_reference`: one program per row, fp32 math."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(x, residual, weight, out, new_residual, stride_x, stride_r, stride_o, stride_nr, eps,
                    N: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """Row r: s = x[r] (+ residual[r], rounded to x's dtype and stored); out[r] = s * rsqrt(mean(s^2) + eps) * w."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    xr = tl.load(x + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        rr = tl.load(residual + row * stride_r + offs, mask=mask, other=0.0)
        s = (xr.to(tl.float32) + rr.to(tl.float32)).to(xr.dtype)
        tl.store(new_residual + row * stride_nr + offs, s, mask=mask)
        xf = s.to(tl.float32)
    else:
        xf = xr.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
    w = tl.load(weight + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + row * stride_o + offs, (xf * inv * w).to(out.dtype.element_ty), mask=mask)


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
            eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    n = x.shape[-1]
    x2 = _as_rows(x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out2 = out.view(-1, n)
    if residual is not None:
        r2 = _as_rows(residual)
        new_res = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        nr2 = new_res.view(-1, n)
    else:
        r2, new_res, nr2 = x2, None, out2
    rows = x2.shape[0]
    if rows == 0:
        return out, new_res
    block = triton.next_power_of_2(n)
    num_warps = min(max(block // 512, 1), 16)
    _rmsnorm_kernel[(rows,)](x2, r2, weight, out2, nr2, x2.stride(0), r2.stride(0), out2.stride(0),
                             nr2.stride(0), eps, N=n, BLOCK=block, HAS_RESIDUAL=residual is not None,
                             num_warps=num_warps)
    return out, new_res


def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dim, fp32 math, returned in x.dtype."""
    return _launch(x, None, weight, eps)[0]


def fused_add_rmsnorm_triton(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                             eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """residual' = x + residual (in x.dtype); returns (rmsnorm(residual'), residual') in one pass."""
    out, new_res = _launch(x, residual, weight, eps)
    assert new_res is not None
    return out, new_res
