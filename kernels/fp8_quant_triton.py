"""Triton twin of `quant_ref.quantize_fp8_per_token`: one program per row, the row's amax, scale and e4m3 values
in one pass (the torch form launches a kernel per op, which at batch 1 costs more than the FP8 matmul saves)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixgen.kernels.quant_ref import FP8_MAX, FP8_MIN_SCALE


@triton.jit
def _fp8_per_token_kernel(x, xq, xs, stride_x, K, FP8_MAX: tl.constexpr, MIN_SCALE: tl.constexpr,
                          BLOCK: tl.constexpr):
    """Row r: xs[r] = max(max_k |x[r, k]| / 448, min scale); xq[r] = e4m3(clamp(x[r] / xs[r], -448, 448))."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < K
    v = tl.load(x + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(v), axis=0) / FP8_MAX, MIN_SCALE)
    q = tl.minimum(tl.maximum(v / scale, -FP8_MAX), FP8_MAX)
    tl.store(xq + row * K + offs, q.to(xq.dtype.element_ty), mask=mask)
    tl.store(xs + row, scale)


def quantize_fp8_per_token_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (xq float8_e4m3fn [M, K], xs float32 [M, 1]), as `quantize_fp8_per_token`."""
    m, k = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    xq = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    xs = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m > 0:
        block = triton.next_power_of_2(k)
        _fp8_per_token_kernel[(m,)](x, xq, xs, x.stride(0), k, FP8_MAX=FP8_MAX, MIN_SCALE=FP8_MIN_SCALE,
                                    BLOCK=block, num_warps=min(max(block // 512, 1), 16))
    return xq, xs
