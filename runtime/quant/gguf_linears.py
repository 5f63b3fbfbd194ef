"""GGUF layer linears kept quantized (CUDA): which slots stay packed, and their shards fused once loaded.

A slot stays packed when every shard's type is one the dequantizing matmul decodes (`kernels.BLOCK_FORMATS`).
Q4_0, Q4_1 and Q4_K shards are repacked into Int4Weights, Q8_0 and Q6_K into Int8Weights, as they arrive
(`gguf_repack`: the same values, read by the int4 / int8 matmul); any other type would stay a GGUFWeight, as
stored. Shards that cannot share one layout (a Q4_K q/k with a Q6_K v) become a StackedWeight. Any other slot is
given a dense weight to be filled by the usual dequantize-at-load path.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from radixgen.kernels import BLOCK_FORMATS, GGUFWeight, Int4Weight, Int8Weight, LinearWeight
from radixgen.runtime.errors import CorruptModelFileError
from radixgen.runtime.models.llama import LinearSlot, LlamaForCausalLM
from radixgen.runtime.quant.fuse import fuse_shards
from radixgen.runtime.quant.gguf_repack import REPACKED_TYPES, repack_blocks


class GGUFLinearBlocks:
    """Receives the blocks of packed shards (`wants_blocks` / `put_blocks`); `finish` puts the fused weights in."""

    def __init__(self, model: LlamaForCausalLM, tensor_types: Mapping[str, int], source: str,
                 repack: bool = True) -> None:
        """`tensor_types`: HF tensor name -> GGML type id of every tensor of the file; `repack`: the types of
        `gguf_repack.REPACKED_TYPES` become Int4Weights or Int8Weights (else every shard stays a GGUFWeight)."""
        self.model = model
        self.source = source
        self.repack = repack
        self.packed: list[LinearSlot] = []
        for slot in model.linear_slots():
            types = [tensor_types.get(prefix + ".weight") for prefix, _ in slot.shards]
            if all(t in BLOCK_FORMATS for t in types):
                self.packed.append(slot)
            else:  # decoded at load like every tensor on the CPU
                n, k = slot.weight.shape
                model.set_linear(slot, torch.empty(n, k, device=model.device, dtype=model.dtype))
        self.names = frozenset(prefix + ".weight" for slot in self.packed for prefix, _ in slot.shards)
        self.shards: dict[str, Int4Weight | Int8Weight | GGUFWeight] = {}

    def wants_blocks(self, name: str) -> bool:
        return name in self.names

    def put_blocks(self, name: str, blocks: torch.Tensor, qtype: int, in_features: int) -> None:
        """`blocks`: uint8 [rows, row bytes] of shard `name`, rows in HF order, on the model's device."""
        if self.repack and qtype in REPACKED_TYPES:
            self.shards[name] = repack_blocks(blocks, qtype, in_features)
        else:
            self.shards[name] = GGUFWeight(blocks.contiguous(), qtype, in_features)

    def finish(self) -> None:
        for slot in self.packed:
            missing = [prefix for prefix, _ in slot.shards if prefix + ".weight" not in self.shards]
            if missing:
                raise CorruptModelFileError(f"{self.source}: missing tensor(s) the config requires: "
                                            f"{', '.join(m + '.weight' for m in missing)}")
            parts: list[LinearWeight] = [self.shards.pop(prefix + ".weight") for prefix, _ in slot.shards]
            self.model.set_linear(slot, fuse_shards(parts))
