"""Dequantization of GGUF tensors to fp32 torch tensors, on the target device when we can.

Q8_0, Q4_0 and Q4_1 (the formats of most small GGUF models, the default one included) are decoded here with a
few vectorized torch ops, on whatever device the bytes are sent to; every other supported type goes through
gguf.quants (numpy, CPU). Results are bit-identical to gguf.quants (tests compare them):

    Q8_0  block of 32: f16 d, 32 x int8 q             -> d * q
    Q4_0  block of 32: f16 d, 16 bytes of nibbles     -> d * (q - 8)
    Q4_1  block of 32: f16 d, f16 m, 16 bytes          -> d * q + m
    (nibbles: byte j holds element j in its low half and element j + 16 in its high half)
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

Q = GGMLQuantizationType
_TYPE_BYTES = {Q.Q8_0: 34, Q.Q4_0: 18, Q.Q4_1: 20}


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] uint8 -> [n, 1] float32 (little-endian half)."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, 16] uint8 -> [n, 32] uint8: the low halves, then the high halves."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1)


def dequantize_to_torch(data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...],
                        device: torch.device) -> torch.Tensor:
    """`data` (uint8 [..., bytes per row], as stored) -> fp32 tensor of `shape` on `device`."""
    if qtype not in _TYPE_BYTES:
        arr = np.asarray(gguf_dequantize(data, qtype), dtype=np.float32)
        if not arr.flags.writeable:  # F32 comes back as a read-only view of the memory map
            arr = arr.copy()
        return torch.from_numpy(arr).reshape(shape).to(device)
    # A private copy of the (small) quantized bytes: the memory map is read-only.
    raw = torch.from_numpy(np.array(data, copy=True).reshape(-1, _TYPE_BYTES[qtype])).to(device)
    if qtype == Q.Q8_0:
        out = raw[:, 2:].contiguous().view(torch.int8).float() * _f16(raw[:, :2])
    elif qtype == Q.Q4_0:
        out = _f16(raw[:, :2]) * (_nibbles(raw[:, 2:]).to(torch.int8) - 8).float()
    else:
        out = _f16(raw[:, :2]) * _nibbles(raw[:, 4:]).float() + _f16(raw[:, 2:4])
    return out.reshape(shape)
