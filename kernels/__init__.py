"""radixgen.kernels: Triton kernels and their torch reference twins, behind one dispatch per op.

Each op `name(...)` runs the Triton kernel when its tensors are on CUDA (and Triton imports) and the torch
reference otherwise; `name_reference(...)` is always the reference, for tests. `multi_query_decode_attention` is
the decode kernel's split-K design for rows of a few new tokens (speculative verify, multi-token rows), with an
extend's maths. `linear` is `F.linear`, except fp32 on an AMD CPU, which runs oneDNN's matmul (`linear_onednn`;
`linear_weight_packer` pre-packs weights for it); `cpu_features` holds the CPU-vendor policy behind both choices.
The batched torch attention (`decode_attention_torch`, `extend_attention_torch` with a `plan_extend` plan its
layers share) and the CPU decode over per-request K/V copies carried across steps (`decode_copy_torch`: no Triton
twin, the GPU kernel reads the pool in place) are what the CPU attention backend (runtime/attention/) calls.

Quantized linear weights (`Int4Weight`, `Int8Weight`, `Fp8Weight`, `GGUFWeight`, `StackedWeight`: one dataclass
per scheme)
go through the same `linear`, which hands them to `quant_linear`; `quant_linear_reference` dequantizes
(`dequantize_weight`) and multiplies.
"""

from radixgen.kernels.attention_ref import (
    decode_attention_reference,
    extend_attention_reference,
    multi_query_decode_attention_reference,
    store_kv_reference,
)
from radixgen.kernels.attention_torch import (
    ExtendPlan,
    cascade_prefix_len,
    decode_attention_torch,
    extend_attention_torch,
    plan_extend,
)
from radixgen.kernels.decode_copy_torch import (
    CopyPlacement,
    CopyStep,
    copy_step_mask,
    decode_attention_from_copy,
    plan_copy_step,
)
from radixgen.kernels.dispatch import (
    apply_rotary,
    apply_token_bitmask,
    decode_attention,
    extend_attention,
    fused_add_rmsnorm,
    linear,
    linear_weight_packer,
    multi_query_decode_attention,
    quant_linear,
    rmsnorm,
    silu_and_mul,
    store_kv,
    triton_attention_runs,
)
from radixgen.kernels.elementwise_ref import (
    apply_rotary_reference,
    apply_token_bitmask_reference,
    fused_add_rmsnorm_reference,
    rmsnorm_reference,
    silu_and_mul_reference,
)
from radixgen.kernels.gguf_ref import BLOCK_FORMATS, BlockFormat
from radixgen.kernels.quant_fp8 import fp8_unsupported_reason
from radixgen.kernels.quant_ref import dequantize as dequantize_weight
from radixgen.kernels.quant_ref import (
    pack_int4,
    pack_int8,
    quant_linear_reference,
    quantize_fp8_per_token,
    unpack_int4,
    unpack_int8,
)
from radixgen.kernels.quant_weight import (
    Fp8Weight,
    GGUFWeight,
    Int4Weight,
    Int8Weight,
    LinearWeight,
    QuantizedWeight,
    StackedWeight,
    weight_nbytes,
)
from radixgen.kernels.rotary_cache import rope_cos_sin_cache, rope_inv_freq

__all__ = [
    "BLOCK_FORMATS",
    "BlockFormat",
    "CopyPlacement",
    "CopyStep",
    "ExtendPlan",
    "Fp8Weight",
    "GGUFWeight",
    "Int4Weight",
    "Int8Weight",
    "LinearWeight",
    "QuantizedWeight",
    "StackedWeight",
    "apply_rotary",
    "apply_rotary_reference",
    "apply_token_bitmask",
    "apply_token_bitmask_reference",
    "cascade_prefix_len",
    "copy_step_mask",
    "decode_attention",
    "decode_attention_from_copy",
    "decode_attention_reference",
    "decode_attention_torch",
    "dequantize_weight",
    "extend_attention",
    "extend_attention_reference",
    "extend_attention_torch",
    "fp8_unsupported_reason",
    "fused_add_rmsnorm",
    "fused_add_rmsnorm_reference",
    "linear",
    "linear_weight_packer",
    "multi_query_decode_attention",
    "multi_query_decode_attention_reference",
    "pack_int4",
    "pack_int8",
    "plan_copy_step",
    "plan_extend",
    "quant_linear",
    "quant_linear_reference",
    "quantize_fp8_per_token",
    "rmsnorm",
    "rmsnorm_reference",
    "rope_cos_sin_cache",
    "rope_inv_freq",
    "silu_and_mul",
    "silu_and_mul_reference",
    "store_kv",
    "store_kv_reference",
    "triton_attention_runs",
    "unpack_int4",
    "unpack_int8",
    "weight_nbytes",
]
