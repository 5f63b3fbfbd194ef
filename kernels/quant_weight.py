"""Quantized linear weights: one frozen dataclass per scheme, holding the packed data `kernels.linear` reads.

A linear weight is either a plain tensor [out, in] (bf16/fp16/fp32) or one of these; each says, in its
docstring, how element w[n, k] of the [out, in] matrix it stands for is computed, which is exactly what its
reference twin (`quant_ref.dequantize`) computes. Shapes use N = out features, K = in features.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

INT4_GROUP_SIZES = (32, 64, 128)
INT4_PACK = 8  # int4 values per int32
INT8_GROUP_SIZES = (16, 32, 64, 128)
INT8_PACK = 4  # int8 values per int32
SPLIT_TILE_COLUMNS = 32  # the narrowest output tile of a split-K matmul: one lock per tile of it per 16 rows
SPLIT_ROW_TILES = 8  # ... for the rows a split-K matmul takes (fewer than 128)


def _split_locks(n: int, device: torch.device) -> Tensor:
    """Zeroed counters, one per output tile of a split-K matmul over this weight: the last slice of a tile to
    finish adds the slices' partial sums (the kernels reset them)."""
    return torch.zeros(-(-n // SPLIT_TILE_COLUMNS) * SPLIT_ROW_TILES, dtype=torch.int32, device=device)


@dataclass(frozen=True)
class Int4Weight:
    """W4A16 with group scales and either zero points (GPTQ, AWQ, round-to-nearest) or group minimums (GGUF's
    Q4_1 and Q4_K, repacked), in the GPTQ packing along K:

        q[k, n]   = (qweight[k // 8, n] >> 4 * (k % 8)) & 15
        w[n, k']  = (q[k, n] - zeros[k // g, n]) * scales[k // g, n]     with zeros,
                  = q[k, n] * scales[k // g, n] - mins[k // g, n]        with mins;  k' = perm[k] (k without perm)

    `perm` (act-order checkpoints) lists, for each stored row k, the input channel it multiplies, so that every
    group's rows are contiguous; the matmul reads x[:, perm]."""

    qweight: Tensor  # int32 [K // 8, N]
    scales: Tensor  # float16 (float32 for repacked GGUF) [K // g, N]
    zeros: Tensor | None  # float16 [K // g, N]: zero points in units of q (8 for a symmetric scheme)
    group_size: int
    perm: Tensor | None = None  # int64 [K]
    mins: Tensor | None = None  # float16 or float32 [K // g, N], instead of zeros
    locks: Tensor = field(init=False, repr=False, compare=False)  # the split-K matmul's tile counters

    def __post_init__(self) -> None:
        if (self.zeros is None) == (self.mins is None):
            raise ValueError("an Int4Weight has zero points or group minimums, exactly one of them")
        object.__setattr__(self, "locks", _split_locks(self.qweight.shape[1], self.qweight.device))

    @property
    def shape(self) -> tuple[int, int]:
        return self.qweight.shape[1], self.qweight.shape[0] * INT4_PACK

    @property
    def offsets(self) -> Tensor:
        """The zero points or the minimums, whichever the weight has."""
        offsets = self.zeros if self.zeros is not None else self.mins
        assert offsets is not None, "checked at construction"
        return offsets

    def nbytes(self) -> int:
        parts = (self.qweight, self.scales, self.offsets) + ((self.perm,) if self.perm is not None else ())
        return sum(t.numel() * t.element_size() for t in parts)


@dataclass(frozen=True)
class Int8Weight:
    """W8A16 with group scales and, optionally, group minimums (GGUF's Q8_0 and Q6_K, and Q5_K with minimums,
    repacked), packed along K in int32 words as Int4Weight is, four signed bytes to a word, lowest first:

        q[k, n]  = byte k % 4 of qweight[k // 4, n], as a two's complement int8
        w[n, k]  = q[k, n] * scales[k // g, n]                        without mins,
                 = q[k, n] * scales[k // g, n] - mins[k // g, n]      with mins"""

    qweight: Tensor  # int32 [K // 4, N]
    scales: Tensor  # float16 (Q8_0's d as stored) or float32 (Q6_K's and Q5_K's d * sub-block scale) [K // g, N]
    group_size: int
    mins: Tensor | None = None  # float32 [K // g, N] (Q5_K's dmin * sub-block min)
    locks: Tensor = field(init=False, repr=False, compare=False)  # the split-K matmul's tile counters

    def __post_init__(self) -> None:
        if self.group_size not in INT8_GROUP_SIZES:
            raise ValueError(f"int8 group size {self.group_size} is not one of {INT8_GROUP_SIZES}")
        object.__setattr__(self, "locks", _split_locks(self.qweight.shape[1], self.qweight.device))

    @property
    def shape(self) -> tuple[int, int]:
        return self.qweight.shape[1], self.qweight.shape[0] * INT8_PACK

    def nbytes(self) -> int:
        parts = (self.qweight, self.scales) if self.mins is None else (self.qweight, self.scales, self.mins)
        return sum(t.numel() * t.element_size() for t in parts)


@dataclass(frozen=True)
class Fp8Weight:
    """FP8 e4m3 with one scale per output channel: w[n, k] = weight[n, k] * scale[n]; activations are quantized
    per token at each matmul (x[m, k] ~ xq[m, k] * xs[m], xs[m] = max_k |x[m, k]| / 448)."""

    weight: Tensor  # float8_e4m3fn [N, K]
    scale: Tensor  # float32 [N]
    locks: Tensor = field(init=False, repr=False, compare=False)  # the split-K GEMV's tile counters

    def __post_init__(self) -> None:
        object.__setattr__(self, "locks", _split_locks(self.weight.shape[0], self.weight.device))

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
    locks: Tensor = field(init=False, repr=False, compare=False)  # the split-K matmul's tile counters

    def __post_init__(self) -> None:
        object.__setattr__(self, "locks", _split_locks(self.blocks.shape[0], self.blocks.device))

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


QuantizedWeight = Int4Weight | Int8Weight | Fp8Weight | GGUFWeight | StackedWeight
LinearWeight = Tensor | QuantizedWeight


def weight_nbytes(weight: LinearWeight) -> int:
    """Bytes a linear weight holds on its device."""
    if isinstance(weight, torch.Tensor):
        return weight.numel() * weight.element_size()
    return weight.nbytes()
