"""FP8 (e4m3) linears on CUDA: one row through the Triton GEMV on the activations as they are (weight-only); more
rows with activations quantized per token, then the Triton GEMV below GEMV_ROWS_BELOW rows (`fp8_gemv_triton`) or
`torch._scaled_mm` with row-wise scales.

From two rows on, the twin of `quant_ref.quant_linear_reference` for an Fp8Weight: the same per-token
quantization (one Triton kernel, `fp8_quant_triton`, the torch form where Triton does not import), the product
accumulated in fp32 and scaled by xs[m] * ws[n]; one row's twin is dequantize-then-matmul.
Row-wise scaled FP8 matmuls need compute capability 8.9 (Ada) or newer; `fp8_unsupported_reason` says why a
device cannot run them, for the loader to refuse early.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from radixgen.kernels.quant_ref import quantize_fp8_per_token
from radixgen.kernels.quant_weight import Fp8Weight

FP8_MIN_CAPABILITY = (8, 9)
GEMV_ROWS_BELOW = 16  # fewer rows than this run the Triton GEMV; from here on the tensor-core GEMM wins


def fp8_unsupported_reason(device: torch.device) -> str | None:
    """None when FP8 linears run on `device` (any CPU runs the reference), else a one-line reason."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return (f"FP8 linears need a GPU of compute capability >= 8.9 (Ada, Hopper or newer); {device} ({name}) "
                f"has {major}.{minor}: use quantization='int4' or none")
    return None


@functools.lru_cache(maxsize=1)
def _per_token() -> Callable[[Tensor], tuple[Tensor, Tensor]]:
    try:
        from radixgen.kernels.fp8_quant_triton import quantize_fp8_per_token_triton
    except ImportError:
        return quantize_fp8_per_token
    return quantize_fp8_per_token_triton


@functools.lru_cache(maxsize=1)
def _gemv() -> Callable[..., Tensor] | None:
    try:
        from radixgen.kernels.fp8_gemv_triton import fp8_gemv_triton
    except ImportError:
        return None
    return fp8_gemv_triton


def fp8_cuda_runs(rows: int, w: Fp8Weight) -> bool:
    """Whether `fp8_linear_cuda` takes `rows` rows of x for `w`: the GEMV takes any shape, `_scaled_mm` needs
    N and K multiples of 16."""
    n, k = w.shape
    return (rows < GEMV_ROWS_BELOW and _gemv() is not None) or (n % 16 == 0 and k % 16 == 0)


def fp8_linear_cuda(x: Tensor, w: Fp8Weight, bias: Tensor | None = None) -> Tensor:
    """x @ dequantize(w).T (+ bias) in x's dtype: the Triton GEMV for fewer than GEMV_ROWS_BELOW rows, else the
    FP8 tensor cores through `torch._scaled_mm` (see `fp8_cuda_runs`). One row skips the activation quantization
    (the one-row GEMV multiplies on the CUDA cores, where x needs no FP8 form): decode at batch 1 saves a launch
    per matmul and is closer to the unquantized model than the reference's quantized row."""
    n, k = w.shape
    lead = x.shape[:-1]
    gemv = _gemv()
    x2 = x.reshape(-1, k)
    if x2.shape[0] == 1 and gemv is not None:
        return gemv(x2, None, w, bias, x.dtype).reshape(*lead, n)
    xq, xs = _per_token()(x2)
    if xq.shape[0] < GEMV_ROWS_BELOW and gemv is not None:
        return gemv(xq, xs, w, bias, x.dtype).reshape(*lead, n)
    # row-wise scaling writes bf16; mat2 must be column-major, which the [N, K] weight's transpose is
    out = torch._scaled_mm(xq, w.weight.t(), scale_a=xs, scale_b=w.scale.view(1, n), out_dtype=torch.bfloat16)
    out = out.to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, n)
