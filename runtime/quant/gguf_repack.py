"""GGUF's 4-bit blocks (Q4_0, Q4_1, Q4_K) repacked into an Int4Weight, exactly, so that the int4 matmul, which
reads whole [K // 8, N] words, runs them instead of the GGUF kernels, which gather bytes block by block.

Per group of 32 inputs (a Q4_0 / Q4_1 block, a Q4_K sub-block), as `kernels.gguf_ref` decodes them:

    Q4_0  w = d * (q - 8)                 scales = d,       zeros = 8         (float16: d as stored)
    Q4_1  w = d * q + m                   scales = d,       mins = -m         (float16: d and m as stored)
    Q4_K  w = (d * sc) * q - dmin * mn    scales = d * sc,  mins = dmin * mn  (float32)

Every value is the reference's bit for bit: d * sc and dmin * mn (11-bit times 6-bit significands) and the
products with q are exact in fp32, the reference computes the same products, and q * d - (-m) is d * q + m in
IEEE arithmetic; so the only rounding is the final add or subtract, the same in both.
"""

from __future__ import annotations

import torch
from torch import Tensor

from radixgen.kernels import Int4Weight, pack_int4
from radixgen.kernels.gguf_ref import BLOCK_FORMATS, Q4_0, Q4_1, Q4_K, q4_k_scale_min

REPACK_GROUP = 32
REPACKED_TYPES = frozenset({Q4_0.code, Q4_1.code, Q4_K.code})


def _halves(b: Tensor) -> Tensor:
    """uint8 [..., 2] (little-endian halves) -> float16 [...]."""
    return b.contiguous().view(torch.float16).squeeze(-1)


def _nibbles(qs: Tensor, chunk: int) -> Tensor:
    """uint8 [..., c * chunk] -> uint8 [..., 2 * c * chunk] in GGUF's element order: per chunk of bytes, their
    low nibbles, then their high nibbles."""
    q = qs.reshape(*qs.shape[:-1], -1, 1, chunk)
    return torch.cat([q & 0x0F, q >> 4], dim=-2).reshape(*qs.shape[:-1], -1)


@torch.no_grad()
def repack_blocks(blocks: Tensor, qtype: int, in_features: int) -> Int4Weight:
    """Rows of GGUF blocks (uint8 [N, row bytes], type `qtype` in REPACKED_TYPES) -> the Int4Weight (group 32)
    that dequantizes to exactly `kernels.gguf_ref.dequantize_blocks(blocks, qtype)`, built on blocks' device."""
    if qtype not in REPACKED_TYPES:
        raise ValueError(f"GGML type {qtype} is not one of the 4-bit types repacked as int4")
    fmt = BLOCK_FORMATS[qtype]
    n = blocks.shape[0]
    if in_features % fmt.block_elems or blocks.shape[1] * fmt.block_elems != in_features * fmt.block_bytes:
        raise ValueError(f"{fmt.name} rows of {blocks.shape[1]} bytes do not hold {in_features} inputs")
    b = blocks.reshape(n, in_features // fmt.block_elems, fmt.block_bytes)
    zeros = mins = None
    if qtype == Q4_K.code:
        sc, mn = q4_k_scale_min(b[..., 4:16].reshape(-1, 12))
        d = _halves(b[..., 0:2]).float().reshape(-1, 1)
        dmin = _halves(b[..., 2:4]).float().reshape(-1, 1)
        scales = (d * sc.float()).reshape(n, -1)  # the reference's products, in its order
        mins = (dmin * mn.float()).reshape(n, -1)
        q = _nibbles(b[..., 16:], 32)
    elif qtype == Q4_1.code:
        scales = _halves(b[..., 0:2])
        mins = -_halves(b[..., 2:4])
        q = _nibbles(b[..., 4:], 16)
    else:
        scales = _halves(b[..., 0:2])
        zeros = torch.full_like(scales, 8.0)
        q = _nibbles(b[..., 2:], 16)
    qweight = pack_int4(q.reshape(n, in_features).t())

    def by_group(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.t().contiguous()  # [N, K // 32] -> [K // 32, N]

    return Int4Weight(qweight, scales.t().contiguous(), by_group(zeros), REPACK_GROUP, mins=by_group(mins))
