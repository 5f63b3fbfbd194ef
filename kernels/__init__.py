"""radixgen.kernels: Triton kernels and their torch reference twins, behind one dispatch per op.

Each op `name(...)` runs the Triton kernel when its tensors are on CUDA (and Triton imports) and the torch
reference otherwise; `name_reference(...)` is always the reference, for tests. `linear` is `F.linear`, except
fp32 on an AMD CPU, which runs oneDNN's matmul (`linear_onednn`; `linear_weight_packer` pre-packs weights for
it). `decode_attention_torch` with a `DecodeKVCopy` is the CPU decode over per-request K/V copies the caller
carries across steps (no Triton twin: the GPU kernel reads the pool in place).
"""

from radixgen.kernels.attention_ref import (
    decode_attention_reference,
    extend_attention_reference,
    store_kv_reference,
)
from radixgen.kernels.attention_torch import DecodeKVCopy, cascade_prefix_len, decode_attention_torch
from radixgen.kernels.dispatch import (
    apply_rotary,
    apply_token_bitmask,
    decode_attention,
    extend_attention,
    fused_add_rmsnorm,
    linear,
    linear_weight_packer,
    rmsnorm,
    silu_and_mul,
    store_kv,
)
from radixgen.kernels.elementwise_ref import (
    apply_rotary_reference,
    apply_token_bitmask_reference,
    fused_add_rmsnorm_reference,
    rmsnorm_reference,
    silu_and_mul_reference,
)
from radixgen.kernels.rotary_cache import rope_cos_sin_cache, rope_inv_freq

__all__ = [
    "DecodeKVCopy",
    "apply_rotary",
    "apply_rotary_reference",
    "apply_token_bitmask",
    "apply_token_bitmask_reference",
    "cascade_prefix_len",
    "decode_attention",
    "decode_attention_reference",
    "decode_attention_torch",
    "extend_attention",
    "extend_attention_reference",
    "fused_add_rmsnorm",
    "fused_add_rmsnorm_reference",
    "linear",
    "linear_weight_packer",
    "rmsnorm",
    "rmsnorm_reference",
    "rope_cos_sin_cache",
    "rope_inv_freq",
    "silu_and_mul",
    "silu_and_mul_reference",
    "store_kv",
    "store_kv_reference",
]
