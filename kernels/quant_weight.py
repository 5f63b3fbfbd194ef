"""Quantized linear weights: one frozen dataclass per scheme, holding the packed data `kernels.linear` reads.

A linear weight is either a plain tensor [out, in] (bf16/fp16/fp32) or one of these; each says, in its
docstring, how element w[n, k] of the [out, in] matrix it stands for is computed, which is exactly what its
reference twin (`quant_ref.dequantize`) computes. Shapes use N = out features, K = in features.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

INT4_GROUP_SIZES = (32, 64, 128)
INT4_PACK = 8  # int4 values per int32


@dataclass(frozen=True)
class Int4Weight:
    """W4A16 with group scales and zero points (the GPTQ packing along K, zeros unpacked):

        q[k, n]   = (qweight[k // 8, n] >> 4 * (k % 8)) & 15
        w[n, k']  = (q[k, n] - zeros[k // g, n]) * scales[k // g, n],  k' = perm[k] (k' = k without perm)

    `perm` (act-order checkpoints) lists, for each stored row k, the input channel it multiplies, so that every
    group's rows are contiguous; the matmul reads x[:, perm]."""

    qweight: Tensor  # int32 [K // 8, N]
    scales: Tensor  # float16 [K // g, N]
    zeros: Tensor  # float16 [K // g, N]: zero points in units of q (8 for a symmetric scheme)
    group_size: int
    perm: Tensor | None = None  # int64 [K]

    @property
    def shape(self) -> tuple[int, int]:
        return self.qweight.shape[1], self.qweight.shape[0] * INT4_PACK

    def nbytes(self) -> int:
        parts = (self.qweight, self.scales, self.zeros) + ((self.perm,) if self.perm is not None else ())
        return sum(t.numel() * t.element_size() for t in parts)


@dataclass(frozen=True)
class Fp8Weight:
    """FP8 e4m3 with one scale per output channel: w[n, k] = weight[n, k] * scale[n]; activations are quantized
    per token at each matmul (x[m, k] ~ xq[m, k] * xs[m], xs[m] = max_k |x[m, k]| / 448)."""

    weight: Tensor  # float8_e4m3fn [N, K]
    scale: Tensor  # float32 [N]

    @property
    def shape(self) -> tuple[int, int]:
        return self.weight.shape[0], self.weight.shape[1]

    def nbytes(self) -> int:
        return self.weight.numel() + self.scale.numel() * 4


@dataclass(frozen=True)
class GGUFWeight:
    """llama.cpp blocks, kept as stored: row n of the matrix is `blocks[n]`, K / block_elems blocks of one GGML
    type (`qtype`, its integer code) back to back; w[n, k] is element k % block_elems of block k // block_elems,
    decoded as gguf.quants does."""

    blocks: Tensor  # uint8 [N, K // block_elems * block_bytes]
    qtype: int
    in_features: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.blocks.shape[0], self.in_features

    def nbytes(self) -> int:
        return self.blocks.numel()


@dataclass(frozen=True)
class StackedWeight:
    """Output rows split among parts that cannot share one layout (a fused q/k/v whose GGUF types differ):
    w = cat([part weights], dim=0)."""

    parts: tuple[QuantizedWeight, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return sum(p.shape[0] for p in self.parts), self.parts[0].shape[1]

    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.parts)


QuantizedWeight = Int4Weight | Fp8Weight | GGUFWeight | StackedWeight
LinearWeight = Tensor | QuantizedWeight


def weight_nbytes(weight: LinearWeight) -> int:
    """Bytes a linear weight holds on its device."""
    if isinstance(weight, torch.Tensor):
        return weight.numel() * weight.element_size()
    return weight.nbytes()
