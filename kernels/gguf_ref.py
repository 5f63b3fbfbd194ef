"""GGUF block formats decoded with torch ops on any device: the reference twin of the dequantizing matmul kernels.

Each decoder takes rows of blocks (uint8 [N, row_bytes]) and returns fp32 [N, K], bit-identical to gguf.quants
(tests compare them). Layouts, per block (f16 values little-endian):

    Q8_0  32 elems, 34 B:  d, 32 x int8 q                          w = d * q
    Q4_0  32 elems, 18 B:  d, 16 B nibbles                          w = d * (q - 8)
    Q4_1  32 elems, 20 B:  d, m, 16 B nibbles                       w = d * q + m
    Q4_K  256 elems, 144 B: d, dmin, 12 B of 6-bit (scale, min) x 8, 128 B nibbles
                                                                    w = d * sc[j] * q - dmin * mn[j], j = e // 32
    Q5_K  256 elems, 176 B: d, dmin, 12 B of scales and mins as Q4_K's, 32 B high bits, 128 B nibbles
                                          q = nibble | bit j of qh[e % 32] << 4,   w as Q4_K's (q in 0..31)
    Q6_K  256 elems, 210 B: 128 B low nibbles, 64 B high 2-bit pairs, 16 x int8 scales, d
                                                                    w = d * sc[e // 16] * (q - 32)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class BlockFormat:
    name: str
    code: int  # GGML type id (gguf.GGMLQuantizationType)
    block_elems: int
    block_bytes: int


Q8_0 = BlockFormat("Q8_0", 8, 32, 34)
Q4_0 = BlockFormat("Q4_0", 2, 32, 18)
Q4_1 = BlockFormat("Q4_1", 3, 32, 20)
Q4_K = BlockFormat("Q4_K", 12, 256, 144)
Q5_K = BlockFormat("Q5_K", 13, 256, 176)
Q6_K = BlockFormat("Q6_K", 14, 256, 210)
BLOCK_FORMATS: dict[int, BlockFormat] = {f.code: f for f in (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)}


def _f16(b: Tensor) -> Tensor:
    """[n, 2] uint8 -> [n, 1] fp32."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: Tensor, chunk: int) -> Tensor:
    """[n, c * chunk] uint8 -> [n, c * 2 * chunk]: per chunk of bytes, its low nibbles then its high nibbles."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, chunk) >> torch.tensor([0, 4], dtype=torch.uint8, device=qs.device).view(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, -1)


def q4_k_scale_min(scales: Tensor) -> tuple[Tensor, Tensor]:
    """[n, 12] uint8 -> (sc, mn), each [n, 8] uint8: the 6-bit sub-block scales and mins."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc, mn


def _q8_0(b: Tensor) -> Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, :2])


def _q4_0(b: Tensor) -> Tensor:
    return _f16(b[:, :2]) * (_nibbles(b[:, 2:], 16).to(torch.int8) - 8).float()


def _q4_1(b: Tensor) -> Tensor:
    return _f16(b[:, :2]) * _nibbles(b[:, 4:], 16).float() + _f16(b[:, 2:4])


def k_scales_mins(b: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K or Q5_K blocks [n, block bytes] -> (d * sc, dmin * mn), fp32 [n, 8] each: sub-block j's scale and
    minimum (exact: an 11-bit significand times a 6-bit integer)."""
    sc, mn = q4_k_scale_min(b[:, 4:16])
    return _f16(b[:, 0:2]) * sc.float(), _f16(b[:, 2:4]) * mn.float()


def _k_dequant(b: Tensor, q: Tensor) -> Tensor:
    """Q4_K / Q5_K: w = (d * sc[j]) * q - dmin * mn[j] for the block's values q [n, 256]."""
    n = b.shape[0]
    scales, mins = k_scales_mins(b)
    return (scales.reshape(n, 8, 1) * q.float().reshape(n, 8, 32) - mins.reshape(n, 8, 1)).reshape(n, 256)


def _q4_k(b: Tensor) -> Tensor:
    return _k_dequant(b, _nibbles(b[:, 16:], 32))


def q5_k_values(b: Tensor) -> Tensor:
    """[n, 176] uint8 Q5_K blocks -> q uint8 [n, 256] in 0..31: sub-block j's nibbles (as Q4_K's) with bit j of
    the high-bit bytes qh[e % 32] as their fifth bit."""
    n = b.shape[0]
    low = _nibbles(b[:, 48:176], 32).reshape(n, 8, 32)
    shifts = torch.arange(8, dtype=torch.uint8, device=b.device).view(1, 8, 1)
    high = (b[:, 16:48].reshape(n, 1, 32) >> shifts) & 1
    return (low | (high << 4)).reshape(n, 256)


def _q5_k(b: Tensor) -> Tensor:
    return _k_dequant(b, q5_k_values(b))


def q6_k_values(b: Tensor) -> tuple[Tensor, Tensor]:
    """[n, 210] uint8 Q6_K blocks -> (q int8 [n, 256] in -32..31, scales fp32 [n, 16] = d * sc, exact): the
    block's element e is q[e] * scales[e // 16]."""
    n = b.shape[0]
    ql = _nibbles(b[:, :128], 64).reshape(n, 8, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).view(1, 1, 4, 1)
    qh = ((b[:, 128:192].reshape(n, 2, 1, 32) >> shifts) & 0x03).reshape(n, 8, 32)
    q = ((ql | (qh << 4)).to(torch.int8) - 32).reshape(n, 256)
    return q, _f16(b[:, 208:210]) * b[:, 192:208].contiguous().view(torch.int8).float()


def _q6_k(b: Tensor) -> Tensor:
    q, scales = q6_k_values(b)
    return (scales.unsqueeze(-1) * q.reshape(-1, 16, 16).float()).reshape(-1, 256)


_DECODERS: dict[int, Callable[[Tensor], Tensor]] = {
    Q8_0.code: _q8_0, Q4_0.code: _q4_0, Q4_1.code: _q4_1, Q4_K.code: _q4_k, Q5_K.code: _q5_k, Q6_K.code: _q6_k,
}


def dequantize_blocks(blocks: Tensor, qtype: int) -> Tensor:
    """Rows of GGUF blocks (uint8 [N, row_bytes]) of type `qtype` -> fp32 [N, K]."""
    fmt = BLOCK_FORMATS[qtype]
    rows = blocks.shape[0]
    flat = blocks.reshape(-1, fmt.block_bytes)
    return _DECODERS[qtype](flat).reshape(rows, -1)
