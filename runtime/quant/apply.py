"""Quantizing a loaded model's dense linears in place (`quantization="int4" | "fp8" | "gguf-*"`), slot by slot,
so the dense and the quantized copy of only one matmul weight coexist."""

from __future__ import annotations

import logging

import torch

from radixgen.kernels import GGUFWeight, LinearWeight
from radixgen.kernels.gguf_ref import BLOCK_FORMATS
from radixgen.kernels.quant_weight import INT4_GROUP_SIZES
from radixgen.runtime.models.llama import LlamaForCausalLM
from radixgen.runtime.quant.gguf_blocks import quantize_blocks
from radixgen.runtime.quant.gguf_repack import REPACKED_TYPES, repack_blocks
from radixgen.runtime.quant.rtn import quantize_fp8, quantize_int4_rtn
from radixgen.runtime.quant.scheme import RtnTarget

logger = logging.getLogger(__name__)


def int4_group_for(in_features: int, wanted: int) -> int | None:
    """`wanted`, or the largest smaller supported group size that divides `in_features` (None: none does)."""
    return next((g for g in sorted(INT4_GROUP_SIZES, reverse=True) if g <= wanted and in_features % g == 0), None)


def quantize_weight(weight: torch.Tensor, target: RtnTarget) -> LinearWeight:
    """Dense [N, K] -> its quantized form, or the dense weight itself where K does not fit the scheme."""
    k = weight.shape[1]
    if target.scheme == "fp8":
        return quantize_fp8(weight)
    if target.scheme == "int4":
        group = int4_group_for(k, target.group_size)
        if group is None:
            logger.warning("int4: in features %d fit no group size of %s; that linear stays dense", k,
                           INT4_GROUP_SIZES)
            return weight
        return quantize_int4_rtn(weight, group)
    fmt = BLOCK_FORMATS[target.gguf_type]
    if k % fmt.block_elems:
        logger.warning("%s: in features %d are no multiple of %d; that linear stays dense", fmt.name, k,
                       fmt.block_elems)
        return weight
    blocks = quantize_blocks(weight, fmt.code)
    if weight.is_cuda and fmt.code in REPACKED_TYPES:  # as a GGUF file's blocks load on CUDA
        return repack_blocks(blocks, fmt.code, k)
    return GGUFWeight(blocks, fmt.code, k)


@torch.no_grad()
def quantize_linears(model: LlamaForCausalLM, target: RtnTarget) -> None:
    """Replace every dense layer matmul weight of `model` by its `target` quantization (the LM head stays)."""
    for slot in model.linear_slots():
        w = slot.weight
        if isinstance(w, torch.Tensor):
            model.set_linear(slot, quantize_weight(w.data, target))
