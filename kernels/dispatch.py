"""One dispatch point per op: the Triton kernel for CUDA tensors, the torch reference elsewhere.

(Where Triton cannot run, attention runs `attention_torch`, the batched torch twin of the per-request reference
loops; the engine's CPU attention backend calls it directly, with plans its layers share. An fp32 `linear` on
the CPU runs oneDNN's matmul where `cpu_features` says so, see `linear_onednn`. A quantized weight
(`quant_weight`) sends `linear` to `quant_linear`: FP8 tensor cores or the dequantizing Triton matmul on CUDA,
`quant_ref` elsewhere.)

Every op here has exactly its reference twin's signature. Triton is chosen when the op's first tensor is on a
CUDA device, Triton imports, and the environment does not set RADIXGEN_FORCE_REFERENCE=1 (read at each call,
so a test or a debugging session can flip it). The Triton modules are imported on first CUDA use only, so
CPU-only users never pay for importing Triton.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor

from radixgen.kernels import attention_ref, attention_torch, elementwise_ref, linear_onednn, quant_ref
from radixgen.kernels.quant_weight import (
    Fp8Weight,
    GGUFWeight,
    Int4Weight,
    Int8Weight,
    LinearWeight,
    QuantizedWeight,
    StackedWeight,
)

FORCE_REFERENCE_ENV = "RADIXGEN_FORCE_REFERENCE"

# op name -> (Triton module, function name in it)
_TRITON_IMPLS = {
    "extend_attention": ("extend_attention_triton", "extend_attention_triton"),
    "decode_attention": ("decode_attention_triton", "decode_attention_triton"),
    "multi_query_decode_attention": ("multi_query_decode_triton", "multi_query_decode_attention_triton"),
    "store_kv": ("store_kv_triton", "store_kv_triton"),
    "rmsnorm": ("norm_triton", "rmsnorm_triton"),
    "fused_add_rmsnorm": ("norm_triton", "fused_add_rmsnorm_triton"),
    "apply_rotary": ("rotary_triton", "apply_rotary_triton"),
    "silu_and_mul": ("activation_triton", "silu_and_mul_triton"),
    "apply_token_bitmask": ("bitmask_triton", "apply_token_bitmask_triton"),
}


@functools.lru_cache(maxsize=1)
def triton_ops() -> SimpleNamespace | None:
    """The Triton implementations by op name, or None when Triton cannot be imported."""
    try:
        found = {}
        for op, (module, fn) in _TRITON_IMPLS.items():
            found[op] = getattr(importlib.import_module(f"radixgen.kernels.{module}"), fn)
        return SimpleNamespace(**found)
    except ImportError:
        return None


def _triton_for(t: Tensor) -> SimpleNamespace | None:
    """The Triton implementations when an op on `t` should run its Triton kernel, else None."""
    if not t.is_cuda or os.environ.get(FORCE_REFERENCE_ENV) == "1":
        return None
    return triton_ops()


def use_triton(t: Tensor) -> bool:
    """True when an op on `t` should run its Triton kernel."""
    return _triton_for(t) is not None


def _supported_head_dim(head_dim: int) -> bool:
    # tl.arange needs a power of two, and tensor-core dots need at least 16
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


def triton_attention_runs(device: torch.device, head_dim: int) -> bool:
    """Whether `extend_attention`, `decode_attention` and `multi_query_decode_attention` run their Triton kernels
    for queries of `head_dim` on `device` (else they run `attention_torch`)."""
    return (device.type == "cuda" and os.environ.get(FORCE_REFERENCE_ENV) != "1" and triton_ops() is not None
            and _supported_head_dim(head_dim))


def linear(x: Tensor, weight: LinearWeight, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T (+ bias): `F.linear`, except fp32 on an AMD CPU, which runs oneDNN's matmul where torch has it
    (about 2.2x MKL's sgemm there; RADIXGEN_FORCE_REFERENCE=1 keeps `F.linear`), a weight packed by
    `linear_onednn.pack_weight`, which only oneDNN's matmul reads, and a quantized weight (`quant_linear`)."""
    if not isinstance(weight, Tensor):
        return quant_linear(x, weight, bias)
    if weight.is_mkldnn:
        return linear_onednn.linear_onednn(x, weight, bias)
    if (x.dtype == torch.float32 and x.device.type == "cpu" and os.environ.get(FORCE_REFERENCE_ENV) != "1"
            and linear_onednn.available()):
        return linear_onednn.linear_onednn(x, weight, bias)
    return F.linear(x, weight, bias)


@functools.lru_cache(maxsize=1)
def _dequant_matmul_triton() -> Callable[..., Tensor] | None:
    try:
        return importlib.import_module("radixgen.kernels.dequant_matmul_triton").dequant_matmul_triton
    except ImportError:
        return None


def quant_linear(x: Tensor, weight: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
    """x @ dequantize(weight).T (+ bias) in x's dtype: on CUDA an Fp8Weight through the FP8 GEMV (few rows) or
    `torch._scaled_mm`, an Int4Weight, Int8Weight or GGUFWeight through the dequantizing Triton matmul; elsewhere
    `quant_linear_reference`."""
    if isinstance(weight, StackedWeight):
        out = torch.cat([quant_linear(x, part) for part in weight.parts], dim=-1)
        return out if bias is None else out + bias
    if x.is_cuda and os.environ.get(FORCE_REFERENCE_ENV) != "1":
        if isinstance(weight, Fp8Weight):
            from radixgen.kernels.quant_fp8 import fp8_cuda_runs, fp8_linear_cuda

            if fp8_cuda_runs(x.numel() // weight.shape[1], weight):
                return fp8_linear_cuda(x, weight, bias)
        kernel = _dequant_matmul_triton() if isinstance(weight, Int4Weight | Int8Weight | GGUFWeight) else None
        if kernel is not None:
            return kernel(x, weight, bias)
    return quant_ref.quant_linear_reference(x, weight, bias)


def linear_weight_packer(dtype: torch.dtype, device: torch.device) -> Callable[[Tensor], Tensor] | None:
    """The function that stores a weight in the layout `linear` reads fastest for this dtype and device (fp32 on
    an AMD CPU: oneDNN's blocked layout, see `linear_onednn.pack_weight`), or None: use weights as they are."""
    if (dtype == torch.float32 and device.type == "cpu" and os.environ.get(FORCE_REFERENCE_ENV) != "1"
            and linear_onednn.available() and linear_onednn.packing_runs()):
        return linear_onednn.pack_weight
    return None


def extend_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, req_to_token: Tensor, req_pool_indices: Tensor,
                     prefix_lens: Tensor, extend_lens: Tensor, extend_start_loc: Tensor, sm_scale: float,
                     sliding_window: int | None = None, max_extend_len: int | None = None,
                     k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> Tensor:
    ops = _triton_for(q)
    if ops is not None and _supported_head_dim(q.shape[-1]):
        return ops.extend_attention(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens,
                                    extend_lens, extend_start_loc, sm_scale, sliding_window, max_extend_len,
                                    k_scale=k_scale, v_scale=v_scale)
    return attention_torch.extend_attention_torch(q, k_cache, v_cache, req_to_token, req_pool_indices,
                                                  prefix_lens, extend_lens, extend_start_loc, sm_scale,
                                                  sliding_window, max_extend_len, k_scale=k_scale, v_scale=v_scale)


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, req_to_token: Tensor, req_pool_indices: Tensor,
                     seq_lens: Tensor, sm_scale: float, sliding_window: int | None = None,
                     max_seq_len: int | None = None, k_scale: Tensor | None = None,
                     v_scale: Tensor | None = None) -> Tensor:
    ops = _triton_for(q)
    if ops is not None and _supported_head_dim(q.shape[-1]):
        return ops.decode_attention(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, sm_scale,
                                    sliding_window, max_seq_len, k_scale=k_scale, v_scale=v_scale)
    return attention_torch.decode_attention_torch(q, k_cache, v_cache, req_to_token, req_pool_indices,
                                                  seq_lens, sm_scale, sliding_window, max_seq_len, k_scale, v_scale)


def multi_query_decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, req_to_token: Tensor,
                                 req_pool_indices: Tensor, prefix_lens: Tensor, extend_lens: Tensor,
                                 extend_start_loc: Tensor, sm_scale: float, sliding_window: int | None = None,
                                 max_extend_len: int | None = None, max_seq_len: int | None = None,
                                 k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> Tensor:
    ops = _triton_for(q)
    if ops is not None and _supported_head_dim(q.shape[-1]):
        return ops.multi_query_decode_attention(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens,
                                                extend_lens, extend_start_loc, sm_scale, sliding_window,
                                                max_extend_len, max_seq_len, k_scale=k_scale, v_scale=v_scale)
    # the same maths as an extend: the batched torch extend (which sends one-token rows down its decode path)
    return attention_torch.extend_attention_torch(q, k_cache, v_cache, req_to_token, req_pool_indices,
                                                  prefix_lens, extend_lens, extend_start_loc, sm_scale,
                                                  sliding_window, max_extend_len, k_scale=k_scale, v_scale=v_scale)


def store_kv(k_cache: Tensor, v_cache: Tensor, loc: Tensor, k: Tensor, v: Tensor, k_scale: Tensor | None = None,
             v_scale: Tensor | None = None) -> None:
    ops = _triton_for(k_cache)
    if ops is not None and k_cache.is_contiguous() and v_cache.is_contiguous():
        return ops.store_kv(k_cache, v_cache, loc, k, v, k_scale, v_scale)
    return attention_ref.store_kv_reference(k_cache, v_cache, loc, k, v, k_scale, v_scale)


def rmsnorm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    ops = _triton_for(x)
    if ops is not None:
        return ops.rmsnorm(x, weight, eps)
    return elementwise_ref.rmsnorm_reference(x, weight, eps)


def fused_add_rmsnorm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    ops = _triton_for(x)
    if ops is not None:
        return ops.fused_add_rmsnorm(x, residual, weight, eps)
    return elementwise_ref.fused_add_rmsnorm_reference(x, residual, weight, eps)


def apply_rotary(q: Tensor, k: Tensor, positions: Tensor, cos_sin_cache: Tensor, is_neox: bool = True) -> None:
    ops = _triton_for(q)
    if ops is not None and q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1:
        return ops.apply_rotary(q, k, positions, cos_sin_cache, is_neox)
    return elementwise_ref.apply_rotary_reference(q, k, positions, cos_sin_cache, is_neox)


def silu_and_mul(x: Tensor) -> Tensor:
    ops = _triton_for(x)
    if ops is not None:
        return ops.silu_and_mul(x)
    return elementwise_ref.silu_and_mul_reference(x)


def apply_token_bitmask(logits: Tensor, bitmask: Tensor, indices: Tensor | None = None) -> None:
    ops = _triton_for(logits)
    if ops is not None and logits.stride(-1) == 1:
        # the grammar fills masks on the host while the forward runs: bring them over without a sync
        bitmask = bitmask.to(device=logits.device, dtype=torch.int32, non_blocking=True)
        if bitmask.stride(-1) != 1:
            bitmask = bitmask.contiguous()
        if indices is not None:
            indices = indices.to(device=logits.device, non_blocking=True)
        return ops.apply_token_bitmask(logits, bitmask, indices)
    return elementwise_ref.apply_token_bitmask_reference(logits, bitmask, indices)


# Each dispatcher carries its reference twin's docstring.
_TWINS: list[tuple[str, Callable[..., object]]] = [
    ("extend_attention", attention_ref.extend_attention_reference),
    ("decode_attention", attention_ref.decode_attention_reference),
    ("multi_query_decode_attention", attention_ref.multi_query_decode_attention_reference),
    ("store_kv", attention_ref.store_kv_reference),
    ("rmsnorm", elementwise_ref.rmsnorm_reference),
    ("fused_add_rmsnorm", elementwise_ref.fused_add_rmsnorm_reference),
    ("apply_rotary", elementwise_ref.apply_rotary_reference),
    ("silu_and_mul", elementwise_ref.silu_and_mul_reference),
    ("apply_token_bitmask", elementwise_ref.apply_token_bitmask_reference),
]
for _name, _ref in _TWINS:
    functools.update_wrapper(globals()[_name], _ref, assigned=("__doc__",), updated=())

__all__ = ["FORCE_REFERENCE_ENV", "apply_rotary", "apply_token_bitmask", "decode_attention", "extend_attention",
           "fused_add_rmsnorm", "linear", "linear_weight_packer", "multi_query_decode_attention", "quant_linear",
           "rmsnorm", "silu_and_mul", "store_kv", "triton_attention_runs", "triton_ops", "use_triton"]
