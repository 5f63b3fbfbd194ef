"""GGUF blocks repacked exactly into the packed-integer layout: the 4-bit types (Q4_0, Q4_1, Q4_K) into an
Int4Weight, Q8_0, Q5_K and Q6_K into an Int8Weight, so that the int4 / int8 matmul, which reads whole [K // 4 or 8, N]
words, runs them instead of the GGUF kernels, which gather bytes block by block.

Per group of inputs (a Q4_0 / Q4_1 / Q8_0 block or a Q4_K sub-block of 32, a Q6_K sub-block of 16), as
`kernels.gguf_ref` decodes them:

    Q4_0  w = d * (q - 8)                 int4, scales = d,       zeros = 8         (float16: d as stored)
    Q4_1  w = d * q + m                   int4, scales = d,       mins = -m         (float16: d and m as stored)
    Q4_K  w = (d * sc) * q - dmin * mn    int4, scales = d * sc,  mins = dmin * mn  (float32)
    Q8_0  w = d * q                       int8 q, scales = d                        (float16: d as stored)
    Q5_K  w = (d * sc) * q - dmin * mn    int8 q (0..31), scales = d * sc, mins = dmin * mn  (float32)
    Q6_K  w = (d * sc) * (q - 32)         int8 q - 32, scales = d * sc, group 16   (float32)

Every value is the reference's bit for bit: d * sc and dmin * mn (11-bit times 6- or 8-bit significands) are
exact in fp32, and the reference multiplies the same two numbers (q and the scale) that the Int4Weight's or
Int8Weight's dequantization does; q * d - (-m) is d * q + m in IEEE arithmetic; so the only rounding is the
final product or add, the same in both.
"""

from __future__ import annotations

import torch
from torch import Tensor

from radixgen.kernels import Int4Weight, Int8Weight, pack_int4, pack_int8
from radixgen.kernels.gguf_ref import (
    BLOCK_FORMATS,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_0,
    k_scales_mins,
    q5_k_values,
    q6_k_values,
)

REPACK_GROUP = 32  # every repacked type's group but Q6_K's
Q6_K_GROUP = 16
INT4_TYPES = frozenset({Q4_0.code, Q4_1.code, Q4_K.code})
INT8_TYPES = frozenset({Q8_0.code, Q5_K.code, Q6_K.code})
REPACKED_TYPES = INT4_TYPES | INT8_TYPES


def _halves(b: Tensor) -> Tensor:
    """uint8 [..., 2] (little-endian halves) -> float16 [...]."""
    return b.contiguous().view(torch.float16).squeeze(-1)


def _nibbles(qs: Tensor, chunk: int) -> Tensor:
    """uint8 [..., c * chunk] -> uint8 [..., 2 * c * chunk] in GGUF's element order: per chunk of bytes, their
    low nibbles, then their high nibbles."""
    q = qs.reshape(*qs.shape[:-1], -1, 1, chunk)
    return torch.cat([q & 0x0F, q >> 4], dim=-2).reshape(*qs.shape[:-1], -1)


def _by_group(t: Tensor) -> Tensor:
    return t.t().contiguous()  # [N, K // g] -> [K // g, N]


def _repack_int8(b: Tensor, qtype: int, n: int, k: int) -> Int8Weight:
    """Q8_0 / Q5_K / Q6_K blocks [N, blocks per row, block bytes] -> their Int8Weight."""
    if qtype == Q8_0.code:
        q = b[..., 2:].contiguous().view(torch.int8).reshape(n, k)
        return Int8Weight(pack_int8(q.t()), _by_group(_halves(b[..., 0:2])), REPACK_GROUP)
    if qtype == Q5_K.code:
        flat = b.reshape(-1, Q5_K.block_bytes)
        scales, mins = k_scales_mins(flat)  # the reference's products
        q = q5_k_values(flat).to(torch.int8).reshape(n, k)
        return Int8Weight(pack_int8(q.t()), _by_group(scales.reshape(n, -1)), REPACK_GROUP,
                          mins=_by_group(mins.reshape(n, -1)))
    q, scales = q6_k_values(b.reshape(-1, Q6_K.block_bytes))  # the reference's d * sc, in its order
    return Int8Weight(pack_int8(q.reshape(n, k).t()), _by_group(scales.reshape(n, -1)), Q6_K_GROUP)


def _repack_int4(b: Tensor, qtype: int, n: int, k: int) -> Int4Weight:
    """Q4_0 / Q4_1 / Q4_K blocks [N, blocks per row, block bytes] -> their Int4Weight."""
    zeros = mins = None
    if qtype == Q4_K.code:
        k_scales, k_mins = k_scales_mins(b.reshape(-1, Q4_K.block_bytes))  # the reference's products
        scales = k_scales.reshape(n, -1)
        mins = _by_group(k_mins.reshape(n, -1))
        q = _nibbles(b[..., 16:], 32)
    elif qtype == Q4_1.code:
        scales = _halves(b[..., 0:2])
        mins = _by_group(-_halves(b[..., 2:4]))
        q = _nibbles(b[..., 4:], 16)
    else:
        scales = _halves(b[..., 0:2])
        zeros = _by_group(torch.full_like(scales, 8.0))
        q = _nibbles(b[..., 2:], 16)
    return Int4Weight(pack_int4(q.reshape(n, k).t()), _by_group(scales), zeros, REPACK_GROUP, mins=mins)


@torch.no_grad()
def repack_blocks(blocks: Tensor, qtype: int, in_features: int) -> Int4Weight | Int8Weight:
    """Rows of GGUF blocks (uint8 [N, row bytes], type `qtype` in REPACKED_TYPES) -> the Int4Weight (4-bit
    types) or Int8Weight (Q8_0, Q5_K, Q6_K) that dequantizes to exactly `kernels.gguf_ref.dequantize_blocks(blocks,
    qtype)`, built on blocks' device."""
    if qtype not in REPACKED_TYPES:
        raise ValueError(f"GGML type {qtype} is not one of the types repacked as int4 or int8")
    fmt = BLOCK_FORMATS[qtype]
    n = blocks.shape[0]
    if in_features % fmt.block_elems or blocks.shape[1] * fmt.block_elems != in_features * fmt.block_bytes:
        raise ValueError(f"{fmt.name} rows of {blocks.shape[1]} bytes do not hold {in_features} inputs")
    b = blocks.reshape(n, in_features // fmt.block_elems, fmt.block_bytes)
    if qtype in INT8_TYPES:
        return _repack_int8(b, qtype, n, in_features)
    return _repack_int4(b, qtype, n, in_features)
