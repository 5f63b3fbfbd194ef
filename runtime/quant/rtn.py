"""Quantizing a dense weight at load, without calibration data: round-to-nearest int4 with group scales, and FP8.

    int4: per group of g inputs of one output row, scale = (max - min) / 15, zero = round(-min / scale);
          q = clamp(round(w / scale) + zero, 0, 15)   (asymmetric, as GPTQ with sym=False stores it)
    fp8:  per output row, scale = max |w| / 448; q = e4m3(w / scale)
"""

from __future__ import annotations

import torch
from torch import Tensor

from radixgen.kernels import Fp8Weight, Int4Weight, pack_int4
from radixgen.kernels.quant_ref import FP8_MAX, FP8_MIN_SCALE


@torch.no_grad()
def quantize_int4_rtn(weight: Tensor, group_size: int = 128) -> Int4Weight:
    """Dense [N, K] -> Int4Weight (K must be a multiple of `group_size`), on weight's device."""
    n, k = weight.shape
    groups = weight.float().reshape(n, k // group_size, group_size)
    lo = groups.amin(dim=-1).clamp(max=0.0)
    hi = groups.amax(dim=-1).clamp(min=0.0)
    scale = ((hi - lo) / 15.0).clamp(min=1e-8).half().float()  # the stored (fp16) scale is what q is rounded to
    zero = (-lo / scale).round().clamp(0, 15)
    q = (groups / scale.unsqueeze(-1)).round() + zero.unsqueeze(-1)
    q = q.clamp(0, 15).to(torch.int32).reshape(n, k)
    return Int4Weight(qweight=pack_int4(q.t().contiguous()), scales=scale.t().contiguous().half(),
                      zeros=zero.t().contiguous().half(), group_size=group_size)


@torch.no_grad()
def quantize_fp8(weight: Tensor) -> Fp8Weight:
    """Dense [N, K] -> Fp8Weight with one scale per output row."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / FP8_MAX).clamp(min=FP8_MIN_SCALE)
    q = (w / scale.unsqueeze(1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return Fp8Weight(weight=q.contiguous(), scale=scale.contiguous())
