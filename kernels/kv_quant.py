"""The FP8 (e4m3) KV cache's number format, shared by the store and the attention ops and their torch twins.

A cache in `FP8_KV_DTYPE` holds x / scale saturated to +-`FP8_KV_MAX` and reads back code * scale, with one fp32
scale per (layer, KV head) for K and one for V (vLLM's convention of the scale, per head instead of per tensor).
Any other cache dtype holds K/V as they are and takes no scales.
"""

from __future__ import annotations

import torch
from torch import Tensor

FP8_KV_DTYPE: torch.dtype | None = getattr(torch, "float8_e4m3fn", None)  # None: this torch has no float8 dtypes
FP8_KV_MAX = 448.0  # the largest finite e4m3fn value


def is_fp8_cache(cache: Tensor) -> bool:
    return FP8_KV_DTYPE is not None and cache.dtype == FP8_KV_DTYPE


def kv_scales_for(k_cache: Tensor, k_scale: Tensor | None, v_scale: Tensor | None) -> tuple[Tensor, Tensor] | None:
    """(k_scale, v_scale) for an FP8 cache, None for any other; refuses an FP8 cache without both scales."""
    if not is_fp8_cache(k_cache):
        return None
    if k_scale is None or v_scale is None:
        raise ValueError("an fp8_e4m3 KV cache needs its k_scale and v_scale ([num_kv_heads] fp32 each)")
    return k_scale, v_scale


def quantize_kv(x: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """x [..., Hkv, D] / scale [Hkv], saturated to the e4m3 range, as `dtype` codes (fp32 math)."""
    return (x.float() / scale.float()[:, None]).clamp_(-FP8_KV_MAX, FP8_KV_MAX).to(dtype)


def dequantize_kv(codes: Tensor, scale: Tensor | None, dtype: torch.dtype, heads_at: int = -2) -> Tensor:
    """codes * scale [Hkv] in `dtype` (fp32 math), the KV heads at dimension `heads_at` of codes (default: codes
    [..., Hkv, D]); without a scale, codes.to(dtype)."""
    if scale is None:
        return codes.to(dtype)
    shape = [1] * codes.dim()
    shape[heads_at] = -1
    return codes.float().mul_(scale.float().view(shape)).to(dtype)
