"""A WeightSink for pre-quantized checkpoints (runtime/quant/): the tensors of each quantized linear are gathered
per checkpoint module, converted to our packed layout once all have arrived (`finish`), and fused per slot."""

from __future__ import annotations

import torch
from torch import Tensor

from radixgen.kernels import LinearWeight, QuantizedWeight, dequantize_weight
from radixgen.runtime.errors import CorruptModelFileError
from radixgen.runtime.loader.weight_sink import WeightSink
from radixgen.runtime.models.llama import LlamaForCausalLM
from radixgen.runtime.quant.fp8_checkpoint import fp8_from_checkpoint
from radixgen.runtime.quant.fuse import fuse_shards
from radixgen.runtime.quant.int4_checkpoint import int4_from_checkpoint
from radixgen.runtime.quant.rtn import quantize_fp8, quantize_int4_rtn
from radixgen.runtime.quant.scheme import CheckpointQuant, Int4Checkpoint

# "weight" also covers modules a checkpoint left unquantized: those are quantized here like the rest
_INT4_PARTS = frozenset({"qweight", "qzeros", "scales", "g_idx", "weight"})
_FP8_PARTS = frozenset({"weight", "weight_scale", "weight_scale_inv", "input_scale"})


class PackedLinearSink(WeightSink):
    """WeightSink whose layer linears come as a quantized checkpoint's tensors; `dequantize` stores them dense."""

    def __init__(self, model: LlamaForCausalLM, source: str, scheme: CheckpointQuant, dequantize: bool) -> None:
        self.model = model
        self.scheme = scheme
        self.dequantize = dequantize
        self.slots = model.linear_slots()
        self.shard_rows = {prefix: rows for slot in self.slots for prefix, rows in slot.shards}
        super().__init__(model, source, exclude=frozenset(p + ".weight" for p in self.shard_rows))
        self.part_names = _INT4_PARTS if isinstance(scheme, Int4Checkpoint) else _FP8_PARTS
        self.parts: dict[str, dict[str, Tensor]] = {}

    def _packed(self, name: str) -> tuple[str, str] | None:
        prefix, _, part = name.rpartition(".")
        return (prefix, part) if prefix in self.shard_rows and part in self.part_names else None

    def wants(self, name: str) -> bool:
        return self._packed(name) is not None or super().wants(name)

    def put(self, name: str, tensor: Tensor, origin: str | None = None) -> None:
        packed = self._packed(name)
        if packed is None:
            super().put(name, tensor, origin)
        else:
            self.parts.setdefault(packed[0], {})[packed[1]] = tensor

    def _convert(self, prefix: str, in_features: int) -> QuantizedWeight:
        parts = self.parts.pop(prefix, None)
        if parts is None:
            raise CorruptModelFileError(f"{self.source}: missing the quantized tensors of {prefix}")
        s = self.scheme
        dense = parts.get("weight")
        if dense is not None and dense.dtype != torch.float8_e4m3fn and "qweight" not in parts:
            return quantize_int4_rtn(dense, s.group_size) if isinstance(s, Int4Checkpoint) else quantize_fp8(dense)
        try:
            if isinstance(s, Int4Checkpoint):
                w: QuantizedWeight = int4_from_checkpoint(parts, s, prefix, self.source)
            else:
                w = fp8_from_checkpoint(parts, s, prefix, self.source)
        except KeyError as e:
            raise CorruptModelFileError(f"{self.source}: {prefix} misses its {e.args[0]} tensor") from None
        if w.shape != (self.shard_rows[prefix], in_features):
            raise CorruptModelFileError(f"{self.source}: {prefix} holds a {w.shape[0]}x{w.shape[1]} weight, the "
                                        f"config implies {self.shard_rows[prefix]}x{in_features}")
        return w

    @torch.no_grad()
    def finish(self) -> None:
        super().finish()
        for slot in self.slots:
            in_features = slot.weight.shape[1]
            shards: list[LinearWeight] = [self._convert(prefix, in_features) for prefix, _ in slot.shards]
            fused = fuse_shards(shards)
            if self.dequantize and not isinstance(fused, Tensor):
                fused = dequantize_weight(fused, self.model.dtype)
            self.model.set_linear(slot, fused)
