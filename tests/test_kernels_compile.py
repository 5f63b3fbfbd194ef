"""Compile every Triton kernel for the H200 (sm_90) on the CPU, without a GPU.

The interpreter runs kernels as numpy and accepts code the real compiler rejects (a non-constexpr global read
inside a kernel, for one). Compiling ahead of time for sm_90 catches that here, and checks what the H200 run
relies on: the attention loops use tensor-core dots and asynchronous copies, and the loads are 16 bytes wide.
Pointers and strides are declared 16-divisible, as Triton specializes them at launch on aligned tensors.
"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from radixgen.kernels import (
    activation_triton,
    bitmask_triton,
    decode_attention_triton,
    extend_attention_triton,
    norm_triton,
    rotary_triton,
    store_kv_triton,
)

H200 = GPUTarget("cuda", 90, 32)
POINTERS = {  # argument name -> pointee type; every other runtime argument is an i32 unless listed in SCALARS
    "q": "bf16", "k_cache": "bf16", "v_cache": "bf16", "o": "bf16", "out": "bf16", "x": "bf16", "residual": "bf16",
    "weight": "bf16", "new_residual": "bf16", "k": "bf16", "v": "bf16", "logits": "fp32", "cos_sin": "fp32",
    "mid_o": "fp32", "mid_lse": "fp32", "req_to_token": "i32", "req_pool_indices": "i64", "seq_lens": "i32",
    "prefix_lens": "i32", "extend_lens": "i32", "extend_start_loc": "i32", "positions": "i64", "loc": "i64",
    "bitmask": "i32", "indices": "i32",
}
SCALARS = {"sm_scale_log2": "fp32", "eps": "fp32"}

_extend_cfg = extend_attention_triton.default_extend_config(128)
_decode_cfg = decode_attention_triton.DecodeConfig()
# (id, kernel, constexprs, launch options, instructions the PTX must contain)
KERNELS = [
    ("extend-d128-gqa4", extend_attention_triton._extend_kernel,
     {"GROUP": 4, "D": 128, "BLOCK_M": _extend_cfg.block_m, "BLOCK_N": _extend_cfg.block_n, "HAS_WINDOW": False,
      "FP8": False},
     {"num_warps": _extend_cfg.num_warps, "num_stages": _extend_cfg.num_stages}, ("wgmma", "cp.async")),
    ("decode-d128-gqa4-split", decode_attention_triton._decode_split_kernel,
     {"GROUP": 4, "BLOCK_H": 16, "D": 128, "BLOCK_N": _decode_cfg.block_n, "DIRECT_OUT": False,
      "HAS_WINDOW": True, "FP8": False},
     {"num_warps": _decode_cfg.num_warps, "num_stages": _decode_cfg.num_stages}, ("mma", "cp.async")),
    ("decode-reduce", decode_attention_triton._decode_reduce_kernel, {"BLOCK_S": 64, "D": 128},
     {"num_warps": 4}, ("ld.global.v4",)),
    ("fused-add-rmsnorm", norm_triton._rmsnorm_kernel, {"N": 4096, "BLOCK": 4096, "HAS_RESIDUAL": True},
     {"num_warps": 8}, ("ld.global.v4",)),
    ("rotary-neox", rotary_triton._rotary_kernel,
     {"HALF": 64, "BLOCK_I": 64, "BLOCK_HQ": 32, "BLOCK_HK": 8, "IS_NEOX": True}, {"num_warps": 4}, ()),
    ("silu-and-mul", activation_triton._silu_and_mul_kernel, {"N": 14336, "BLOCK": 2048}, {"num_warps": 4},
     ("ld.global.v4",)),
    ("token-bitmask", bitmask_triton._bitmask_kernel, {"HAS_INDICES": True, "BLOCK": 4096}, {"num_warps": 4}, ()),
    ("store-kv", store_kv_triton._store_kv_kernel, {"ROW": 1024, "BLOCK": 1024, "D": 128, "FP8": False},
     {"num_warps": 4}, ("ld.global.v4",)),
]


def _source(fn, constexprs: dict) -> ASTSource:
    names = fn.arg_names
    signature, attrs = {}, {}
    for i, name in enumerate(names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in POINTERS:
            signature[name] = "*" + POINTERS[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = SCALARS.get(name, "i32")
            if name.startswith("stride"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return ASTSource(fn=fn, signature=signature, constexprs={(names.index(k),): v for k, v in constexprs.items()},
                     attrs=attrs)


@pytest.mark.parametrize(("name", "fn", "constexprs", "options", "needs"), KERNELS, ids=[k[0] for k in KERNELS])
def test_kernel_compiles_for_h200(name, fn, constexprs, options, needs) -> None:
    compiled = triton.compile(_source(fn, constexprs), target=H200, options=options)
    ptx = compiled.asm["ptx"]
    for instruction in needs:
        assert instruction in ptx, f"{name}: no {instruction} in the sm_90 PTX"
    assert compiled.metadata.shared <= 227 * 1024, f"{name}: {compiled.metadata.shared} B of shared memory"
