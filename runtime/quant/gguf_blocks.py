"""Dense rows to GGUF blocks (Q8_0, Q4_K, Q5_K, Q6_K) with torch ops: random GGUF-shaped models for benchmarks
and tests.

Plain round-to-nearest (llama.cpp's own quantizers search the scales; these do not): what they produce decodes
with `kernels.gguf_ref.dequantize_blocks` and gguf.quants like any file's blocks. Layouts in kernels/gguf_ref.py.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from radixgen.kernels.gguf_ref import BLOCK_FORMATS, Q4_K, Q5_K, Q6_K, Q8_0


def _f16_bytes(v: Tensor) -> Tensor:
    """[n] -> uint8 [n, 2] (little-endian half)."""
    return v.half().contiguous().view(torch.uint8).reshape(-1, 2)


def _q8_0(x: Tensor) -> Tensor:
    x = x.reshape(-1, 32)
    d = (x.abs().amax(dim=1) / 127.0).half().float()
    q = torch.where(d[:, None] > 0, x / d.clamp(min=1e-30)[:, None], 0.0).round().clamp(-127, 127).to(torch.int8)
    return torch.cat([_f16_bytes(d), q.view(torch.uint8)], dim=1)


def _k_quant(x: Tensor, levels: int) -> tuple[Tensor, Tensor]:
    """Q4_K's and Q5_K's shared part: super-blocks of 8 sub-blocks of 32 -> (d, dmin, 12 bytes of 6-bit scales
    and mins) as bytes [n, 16], and q [n, 8, 32] in 0..levels."""
    x = x.reshape(-1, 8, 32)
    lo = x.amin(dim=-1).clamp(max=0.0)
    sub_scale = (x.amax(dim=-1) - lo) / levels
    sub_min = -lo
    d = (sub_scale.amax(dim=1) / 63.0).half().float()
    dmin = (sub_min.amax(dim=1) / 63.0).half().float()
    sc = (sub_scale / d.clamp(min=1e-30)[:, None]).round().clamp(0, 63).to(torch.int32)
    mn = (sub_min / dmin.clamp(min=1e-30)[:, None]).round().clamp(0, 63).to(torch.int32)
    eff_scale = (d[:, None] * sc.float()).unsqueeze(-1)
    eff_min = (dmin[:, None] * mn.float()).unsqueeze(-1)
    q = torch.where(eff_scale > 0, (x + eff_min) / eff_scale.clamp(min=1e-30), 0.0).round().clamp(0, levels)
    scales = torch.cat([(sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6), (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6),
                        (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)], dim=1)
    head = torch.cat([_f16_bytes(d), _f16_bytes(dmin), scales.to(torch.uint8)], dim=1)
    return head, q.to(torch.int32)


def _nibble_bytes(q: Tensor) -> Tensor:
    """q [n, 8, 32] (low 4 bits used) -> [n, 128] bytes: per pair of sub-blocks, the first's in the low nibbles."""
    q = (q & 0xF).reshape(-1, 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128).to(torch.uint8)


def _q4_k(x: Tensor) -> Tensor:
    head, q = _k_quant(x, 15)
    return torch.cat([head, _nibble_bytes(q)], dim=1)


def _q5_k(x: Tensor) -> Tensor:
    head, q = _k_quant(x, 31)
    bits = (q >> 4) << torch.arange(8, dtype=torch.int32, device=q.device).view(1, 8, 1)  # sub-block j: bit j
    return torch.cat([head, bits.sum(dim=1).to(torch.uint8), _nibble_bytes(q)], dim=1)


def _q6_k(x: Tensor) -> Tensor:
    x = x.reshape(-1, 16, 16)
    sub = x.abs().amax(dim=-1) / 32.0
    d = (sub.amax(dim=1) / 127.0).half().float()
    sc = (sub / d.clamp(min=1e-30)[:, None]).round().clamp(0, 127).to(torch.int8)
    eff = (d[:, None] * sc.float()).unsqueeze(-1)
    q = torch.where(eff > 0, x / eff.clamp(min=1e-30), 0.0).round().clamp(-32, 31).to(torch.int32) + 32
    q = q.reshape(-1, 256)
    low = (q & 0xF).reshape(-1, 2, 2, 64)
    ql = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(-1, 128)
    high = (q >> 4).reshape(-1, 2, 4, 32)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(-1, 64)
    return torch.cat([ql.to(torch.uint8), qh.to(torch.uint8), sc.view(torch.uint8), _f16_bytes(d)], dim=1)


_QUANTIZERS: dict[int, Callable[[Tensor], Tensor]] = {Q8_0.code: _q8_0, Q4_K.code: _q4_k, Q5_K.code: _q5_k,
                                                       Q6_K.code: _q6_k}
QUANTIZABLE_TYPES = frozenset(_QUANTIZERS)


@torch.no_grad()
def quantize_blocks(weight: Tensor, qtype: int) -> Tensor:
    """Dense [N, K] -> uint8 [N, row bytes] blocks of GGML type `qtype` (one of QUANTIZABLE_TYPES)."""
    fmt = BLOCK_FORMATS[qtype]
    n, k = weight.shape
    if k % fmt.block_elems:
        raise ValueError(f"{fmt.name} needs rows of a multiple of {fmt.block_elems} elements, got {k}")
    return _QUANTIZERS[qtype](weight.float()).reshape(n, k // fmt.block_elems * fmt.block_bytes).contiguous()
