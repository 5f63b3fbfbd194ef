"""FP8 checkpoint tensors of one linear -> Fp8Weight with a scale per output row.

`weight` is e4m3 [N, K]; `weight_scale` multiplies it per tensor ([] or [1]) or per row ([N] or [N, 1]: the
Hugging Face "fp8" and compressed-tensors layouts), and is taken over as it is; `weight_scale_inv` multiplies it
per [rows, cols] block (block-wise "fp8", DeepSeek's layout), which one scale per row cannot express, so that
weight is dequantized and quantized again per row. A static `input_scale` is not used: activations are always
scaled per token.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from radixgen.kernels import Fp8Weight
from radixgen.runtime.errors import CorruptModelFileError, UnsupportedQuantizationError
from radixgen.runtime.quant.rtn import quantize_fp8
from radixgen.runtime.quant.scheme import Fp8Checkpoint


def fp8_from_checkpoint(parts: Mapping[str, Tensor], scheme: Fp8Checkpoint, name: str, source: str) -> Fp8Weight:
    weight = parts["weight"]
    if weight.dtype != torch.float8_e4m3fn:
        raise UnsupportedQuantizationError(f"{source}: {name}.weight is {weight.dtype}; supported FP8 weights: "
                                           f"float8_e4m3fn")
    n, k = weight.shape
    if "weight_scale_inv" in parts:
        s = parts["weight_scale_inv"].float()
        rows, cols = scheme.block_size or (-(-n // s.shape[0]), -(-k // s.shape[1]))
        full = s.repeat_interleave(rows, dim=0)[:n].repeat_interleave(cols, dim=1)[:, :k]
        return quantize_fp8(weight.float() * full)
    if "weight_scale" not in parts:
        raise CorruptModelFileError(f"{source}: {name} has an FP8 weight without weight_scale or weight_scale_inv")
    s = parts["weight_scale"].float().reshape(-1)
    if s.numel() not in (1, n):
        raise CorruptModelFileError(f"{source}: {name}.weight_scale has {s.numel()} values for {n} rows")
    return Fp8Weight(weight.contiguous(), s.expand(n).contiguous())
