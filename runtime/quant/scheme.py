"""What the linears of a model become at load: the `quantization` option (runtime/quant/options.py) and a
checkpoint's `quantization_config` (GPTQ, AWQ, FP8, compressed-tensors FP8).

Every refusal is an UnsupportedQuantizationError whose one line names what is supported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from radixgen.kernels.gguf_ref import Q4_K, Q5_K, Q6_K, Q8_0
from radixgen.kernels.quant_weight import INT4_GROUP_SIZES
from radixgen.runtime.errors import UnsupportedQuantizationError
from radixgen.runtime.quant.options import check_quantization

CHECKPOINT_METHODS = ("gptq", "awq", "fp8", "compressed-tensors")
_GGUF_TARGETS = {"gguf-q8_0": Q8_0.code, "gguf-q4_k": Q4_K.code, "gguf-q5_k": Q5_K.code, "gguf-q6_k": Q6_K.code}


@dataclass(frozen=True)
class Int4Checkpoint:
    """A GPTQ or AWQ checkpoint: per linear `qweight`, `qzeros`, `scales` (and GPTQ's `g_idx`)."""

    method: Literal["gptq", "awq"]
    group_size: int
    zero_offset: int  # added to every stored zero point: GPTQ's original format stores zero - 1


@dataclass(frozen=True)
class Fp8Checkpoint:
    """An FP8 checkpoint: per linear an e4m3 `weight` and its `weight_scale` (per tensor or channel) or
    `weight_scale_inv` (per [rows, cols] block of `block_size`)."""

    method: Literal["fp8", "compressed-tensors"]
    block_size: tuple[int, int] | None


CheckpointQuant = Int4Checkpoint | Fp8Checkpoint


@dataclass(frozen=True)
class RtnTarget:
    """Quantize dense linears after loading: "int4" (with `group_size`), "fp8" or GGUF blocks (`gguf_type`)."""

    scheme: Literal["int4", "fp8", "gguf"]
    group_size: int = 128
    gguf_type: int = 0


@dataclass(frozen=True)
class LoadQuant:
    """The load plan of the linears: read `checkpoint`'s packed tensors, keep GGUF blocks, then quantize `rtn`;
    `dequantize` turns whatever was packed back into dense weights."""

    checkpoint: CheckpointQuant | None = None
    gguf_blocks: bool = False
    rtn: RtnTarget | None = None
    dequantize: bool = False

    @property
    def dense_linears(self) -> bool:
        """Whether the model needs dense linear weights allocated before the checkpoint streams in."""
        return self.checkpoint is None and not self.gguf_blocks


def _refuse(source: str, what: str, supported: str) -> UnsupportedQuantizationError:
    return UnsupportedQuantizationError(f"{source}: {what} is not supported (supported: {supported})")


def _int4_group(source: str, method: str, group: Any) -> int:
    if group not in INT4_GROUP_SIZES:
        raise _refuse(source, f"{method} group_size {group!r}", ", ".join(map(str, INT4_GROUP_SIZES)))
    return int(group)


def _compressed_tensors(cfg: Mapping[str, Any], source: str) -> Fp8Checkpoint:
    """Only the FP8 layout: every config group quantizes weights to 8-bit floats per tensor or channel."""
    supported = "compressed-tensors with 8-bit float weights, strategy tensor or channel"
    groups = cfg.get("config_groups") or {}
    if not isinstance(groups, Mapping) or not groups:
        raise _refuse(source, "compressed-tensors without config_groups", supported)
    for group in groups.values():
        w = group.get("weights") or {} if isinstance(group, Mapping) else {}
        if w.get("type") != "float" or w.get("num_bits") != 8 or w.get("strategy") not in ("tensor", "channel"):
            desc = f"{w.get('num_bits')}-bit {w.get('type')} weights, strategy {w.get('strategy')}"
            raise _refuse(source, f"compressed-tensors {desc}", supported)
    return Fp8Checkpoint("compressed-tensors", None)


def checkpoint_quant(quant_config: Mapping[str, Any] | None, source: str) -> CheckpointQuant | None:
    """The scheme of a config.json's `quantization_config` (None when there is none)."""
    if quant_config is None:
        return None
    method = str(quant_config.get("quant_method", "")).lower()
    if method == "gptq":
        bits = quant_config.get("bits", 4)
        if bits != 4:
            raise _refuse(source, f"gptq with bits={bits}", "gptq with bits=4")
        group = _int4_group(source, method, quant_config.get("group_size", 128))
        v2 = quant_config.get("checkpoint_format") == "gptq_v2"
        return Int4Checkpoint("gptq", group, 0 if v2 else 1)
    if method == "awq":
        bits = quant_config.get("bits", quant_config.get("w_bit", 4))
        version = str(quant_config.get("version", "gemm")).lower()
        if bits != 4 or version != "gemm" or not quant_config.get("zero_point", True):
            raise _refuse(source, f"awq bits={bits} version={version}", "awq with bits=4, version gemm, zero_point")
        group = _int4_group(source, method, quant_config.get("group_size", quant_config.get("q_group_size", 128)))
        return Int4Checkpoint("awq", group, 0)
    if method == "fp8":
        block = quant_config.get("weight_block_size")
        if block is not None and (not isinstance(block, list | tuple) or len(block) != 2):
            raise _refuse(source, f"fp8 weight_block_size {block!r}", "fp8 with weight_block_size [rows, cols]")
        return Fp8Checkpoint("fp8", (int(block[0]), int(block[1])) if block is not None else None)
    if method == "compressed-tensors":
        return _compressed_tensors(quant_config, source)
    raise _refuse(source, f"quant_method {method or quant_config.get('quant_method')!r}", ", ".join(CHECKPOINT_METHODS))


def rtn_target(quantization: str) -> RtnTarget | None:
    """The at-load quantization an option value asks for (None for auto and none)."""
    if quantization in ("auto", "none", "gguf"):
        return None
    if quantization.startswith("int4"):
        return RtnTarget("int4", group_size=int(quantization[len("int4-g"):]) if "-g" in quantization else 128)
    if quantization == "fp8":
        return RtnTarget("fp8")
    return RtnTarget("gguf", gguf_type=_GGUF_TARGETS[quantization])


def plan_load(quantization: str, checkpoint: CheckpointQuant | None, is_gguf: bool, on_cuda: bool,
              source: str) -> LoadQuant:
    """The load plan for option `quantization` and what the checkpoint holds."""
    check_quantization(quantization)
    if quantization == "none":
        return LoadQuant(checkpoint=checkpoint, dequantize=checkpoint is not None)
    rtn = rtn_target(quantization)
    if rtn is None:  # auto keeps a GGUF file dense: its packed kernels are still slower than bf16 (docs/benchmarks.md)
        return LoadQuant(checkpoint=checkpoint, gguf_blocks=quantization == "gguf" and is_gguf and on_cuda)
    if checkpoint is not None:
        already = "int4" if isinstance(checkpoint, Int4Checkpoint) else "fp8"
        if rtn.scheme == already:  # an int4 (fp8) checkpoint asked to be int4 (fp8): load it as it is
            return LoadQuant(checkpoint=checkpoint)
        raise UnsupportedQuantizationError(f"{source}: the checkpoint is already quantized ({checkpoint.method}); "
                                           f"load it with quantization='auto' (or 'none' to dequantize it)")
    return LoadQuant(rtn=rtn)
