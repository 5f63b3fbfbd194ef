"""Reference twins of the quantized matmuls: dequantize the weight as its dataclass docstring says, then F.linear.

    quant_linear_reference(x, w, bias) = F.linear(x', dequantize(w, dtype), bias)
        x' = x[:, perm] for an act-order Int4Weight; for an Fp8Weight x' = xq * xs, x quantized per token to
        e4m3 exactly as the CUDA path does (`quantize_fp8_per_token`), the product in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from radixgen.kernels.gguf_ref import dequantize_blocks
from radixgen.kernels.quant_weight import (
    Fp8Weight,
    GGUFWeight,
    Int4Weight,
    Int8Weight,
    QuantizedWeight,
    StackedWeight,
)

FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_MIN_SCALE = 1e-12  # an all-zero row quantizes with this scale instead of dividing by zero


def unpack_int4(qweight: Tensor) -> Tensor:
    """int32 [K // 8, N] (8 nibbles along K per word, lowest first) -> int32 [K, N] in 0..15."""
    shifts = torch.arange(0, 32, 4, device=qweight.device, dtype=torch.int32)
    q = (qweight.unsqueeze(1) >> shifts.view(1, -1, 1)) & 0xF
    return q.reshape(-1, qweight.shape[1])


def pack_int4(q: Tensor) -> Tensor:
    """int [K, N] in 0..15 -> int32 [K // 8, N]: the inverse of `unpack_int4`."""
    k, n = q.shape
    q = q.to(torch.int32).reshape(k // 8, 8, n)
    shifts = torch.arange(0, 32, 4, device=q.device, dtype=torch.int32)
    return (q << shifts.view(1, -1, 1)).sum(dim=1, dtype=torch.int32)


def unpack_int8(qweight: Tensor) -> Tensor:
    """int32 [K // 4, N] (4 bytes along K per word, lowest first, two's complement) -> int32 [K, N] in -128..127."""
    shifts = torch.arange(0, 32, 8, device=qweight.device, dtype=torch.int32)
    q = (qweight.unsqueeze(1) >> shifts.view(1, -1, 1)) & 0xFF
    return (q - ((q & 0x80) << 1)).reshape(-1, qweight.shape[1])


def pack_int8(q: Tensor) -> Tensor:
    """int [K, N] in -128..127 -> int32 [K // 4, N]: the inverse of `unpack_int8`, by viewing each column's
    bytes as words (little-endian: byte k % 4 of a word is its bits 8 * (k % 4) and up), one byte per value
    in flight."""
    return q.to(torch.int8).t().contiguous().view(torch.int32).t().contiguous()


def dequantize(w: QuantizedWeight, dtype: torch.dtype = torch.float32) -> Tensor:
    """The [N, K] matrix `w` stands for, in `dtype` (an Int4Weight's rows in its stored, perm-ed K order)."""
    if isinstance(w, Int4Weight):
        q = unpack_int4(w.qweight).float()
        g = w.group_size
        scales = w.scales.float().repeat_interleave(g, dim=0)
        if w.mins is not None:
            return (q * scales - w.mins.float().repeat_interleave(g, dim=0)).t().to(dtype)
        return ((q - w.offsets.float().repeat_interleave(g, dim=0)) * scales).t().to(dtype)
    if isinstance(w, Int8Weight):
        scales = w.scales.float().repeat_interleave(w.group_size, dim=0)
        q = unpack_int8(w.qweight).float() * scales
        if w.mins is not None:
            q = q - w.mins.float().repeat_interleave(w.group_size, dim=0)
        return q.t().to(dtype)
    if isinstance(w, Fp8Weight):
        return (w.weight.float() * w.scale.view(-1, 1)).to(dtype)
    if isinstance(w, GGUFWeight):
        return dequantize_blocks(w.blocks, w.qtype).to(dtype)
    return torch.cat([dequantize(p, dtype) for p in w.parts], dim=0)


def quantize_fp8_per_token(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [M, K] -> (xq float8_e4m3fn [M, K], xs float32 [M, 1]) with x ~ xq * xs, xs = max |x[m]| / 448."""
    xs = (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=FP8_MIN_SCALE)
    xq = (x.float() / xs).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return xq, xs


def quant_linear_reference(x: Tensor, w: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
    """x @ dequantize(w).T (+ bias) in x's dtype; see the module docstring for each scheme's x'."""
    if isinstance(w, StackedWeight):
        out = torch.cat([quant_linear_reference(x, p) for p in w.parts], dim=-1)
        return out if bias is None else out + bias
    if isinstance(w, Fp8Weight):
        x2 = x.reshape(-1, x.shape[-1])
        xq, xs = quantize_fp8_per_token(x2)
        out = F.linear(xq.float() * xs, dequantize(w, torch.float32)).to(x.dtype)
        out = out.reshape(*x.shape[:-1], out.shape[-1])
        return out if bias is None else out + bias
    if isinstance(w, Int4Weight) and w.perm is not None:
        x = x.index_select(-1, w.perm)
    return F.linear(x, dequantize(w, x.dtype), bias)
