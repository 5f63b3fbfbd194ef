"""cos/sin tables for rotary embeddings, with the rope-scaling schemes of the Llama family."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch


def rope_inv_freq(rotary_dim: int, base: float, rope_scaling: Mapping[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies [rotary_dim / 2], adjusted for `linear` and `llama3` scaling."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    if not rope_scaling:
        return inv_freq.float()
    kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if kind in ("default", None):
        return inv_freq.float()
    if kind == "linear":
        return (inv_freq / float(rope_scaling["factor"])).float()
    if kind == "llama3":
        factor = float(rope_scaling["factor"])
        low = float(rope_scaling.get("low_freq_factor", 1.0))
        high = float(rope_scaling.get("high_freq_factor", 4.0))
        old_ctx = float(rope_scaling.get("original_max_position_embeddings", 8192))
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(is_medium, smoothed, scaled).float()
    raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: default, linear, llama3")


def rope_cos_sin_cache(rotary_dim: int, max_position: int, base: float, rope_scaling: Mapping[str, Any] | None = None,
                       dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """[max_position, rotary_dim] = cat(cos(pos * f), sin(pos * f)) for each inverse frequency f."""
    inv_freq = rope_inv_freq(rotary_dim, base, rope_scaling)
    t = torch.arange(max_position, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(device=device, dtype=dtype)
