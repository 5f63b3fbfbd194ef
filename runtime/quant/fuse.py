"""One weight from the row shards a fused slot concatenates (q/k/v, gate/up), whatever they are packed as."""

from __future__ import annotations

import torch

from radixgen.kernels import (
    Fp8Weight,
    GGUFWeight,
    Int4Weight,
    Int8Weight,
    LinearWeight,
    QuantizedWeight,
    StackedWeight,
)


def _same_perm(parts: list[Int4Weight]) -> bool:
    first = parts[0].perm
    return all((p.perm is None and first is None) or (p.perm is not None and first is not None
                                                      and torch.equal(p.perm, first)) for p in parts)


def fuse_shards(shards: list[LinearWeight]) -> LinearWeight:
    """cat(shards, dim=0) as a weight: one packed tensor set where the shards share a layout (dense, int4 with one
    group size and input order, int8 with one group size and scale dtype, all with minimums or none, FP8, GGUF of
    one type), else a StackedWeight of the parts."""
    if len(shards) == 1:
        return shards[0]
    if all(isinstance(s, torch.Tensor) for s in shards):
        return torch.cat([s for s in shards if isinstance(s, torch.Tensor)], dim=0)
    quantized: list[QuantizedWeight] = []
    for s in shards:
        assert not isinstance(s, torch.Tensor), "a fused slot mixes dense and quantized shards"
        quantized.append(s)
    int4 = [s for s in quantized if isinstance(s, Int4Weight)]
    kinds = {(s.group_size, s.mins is None, s.scales.dtype) for s in int4}
    if len(int4) == len(quantized) and len(kinds) == 1 and _same_perm(int4):
        offsets = torch.cat([s.offsets for s in int4], dim=1)
        with_mins = int4[0].mins is not None
        return Int4Weight(torch.cat([s.qweight for s in int4], dim=1), torch.cat([s.scales for s in int4], dim=1),
                          None if with_mins else offsets, int4[0].group_size, int4[0].perm,
                          mins=offsets if with_mins else None)
    int8 = [s for s in quantized if isinstance(s, Int8Weight)]
    if len(int8) == len(quantized) and len({(s.group_size, s.scales.dtype, s.mins is None) for s in int8}) == 1:
        mins = [s.mins for s in int8 if s.mins is not None]
        return Int8Weight(torch.cat([s.qweight for s in int8], dim=1), torch.cat([s.scales for s in int8], dim=1),
                          int8[0].group_size, mins=torch.cat(mins, dim=1) if mins else None)
    fp8 = [s for s in quantized if isinstance(s, Fp8Weight)]
    if len(fp8) == len(quantized):
        return Fp8Weight(torch.cat([s.weight for s in fp8], dim=0), torch.cat([s.scale for s in fp8], dim=0))
    gguf = [s for s in quantized if isinstance(s, GGUFWeight)]
    if len(gguf) == len(quantized) and len({s.qtype for s in gguf}) == 1:
        return GGUFWeight(torch.cat([s.blocks for s in gguf], dim=0), gguf[0].qtype, gguf[0].in_features)
    return StackedWeight(tuple(quantized))
