"""One dispatch point per op: Triton on CUDA tensors, the torch reference elsewhere.

(Triton implementations are registered here as they land; until then every op is the reference.)
"""

from __future__ import annotations

from radixgen.kernels.attention_ref import (
    decode_attention_reference as decode_attention,
    extend_attention_reference as extend_attention,
    store_kv_reference as store_kv,
)
from radixgen.kernels.elementwise_ref import (
    apply_rotary_reference as apply_rotary,
    apply_token_bitmask_reference as apply_token_bitmask,
    fused_add_rmsnorm_reference as fused_add_rmsnorm,
    rmsnorm_reference as rmsnorm,
    silu_and_mul_reference as silu_and_mul,
)

__all__ = ["apply_rotary", "apply_token_bitmask", "decode_attention", "extend_attention", "fused_add_rmsnorm",
           "rmsnorm", "silu_and_mul", "store_kv"]
