"""Counter-based random numbers: uniform noise as a pure function of (seed, step, token id), computed on device.

A seeded request must draw the same tokens whatever else shares its batch and wherever its row sits. A
stateful generator cannot promise that (its stream is consumed by the other rows), so the sampler derives the
noise for row b, token v from a hash of (seed_b, step_b, v): every value is independent of the other rows, and
the whole [B, V] block is computed by a handful of element-wise tensor ops (data-parallel, no per-row loop).

The hash is Chris Wellons' `lowbias32` mixer on int32 tensors: multiplication wraps modulo 2^32 (two's
complement, as on every torch backend), and right shifts are made logical by masking off the sign bits, so the
bits equal the unsigned 32-bit reference on every device. (int32 rather than int64: torch's int64 shifts are
not vectorised on the CPU and cost ~40x more.)
"""

from __future__ import annotations

import torch

_GOLDEN = 0x9E3779B9  # 2^32 / phi: decorrelates the inputs folded into one key


def _i32(c: int) -> int:
    """An unsigned 32-bit constant as the int32 with the same bits."""
    c &= 0xFFFFFFFF
    return c - (1 << 32) if c >= 1 << 31 else c


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int32 bit patterns."""
    return (x >> s) & ((1 << (32 - s)) - 1)


_M1, _M2, _G = _i32(0x7FEB352D), _i32(0x846CA68B), _i32(_GOLDEN)


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective avalanche hash of 32-bit patterns (int32 tensor in, int32 tensor out)."""
    x = x ^ _shr(x, 16)
    x = x * _M1
    x = x ^ _shr(x, 15)
    x = x * _M2
    return x ^ _shr(x, 16)


def split_seed(seed: int) -> tuple[int, int]:
    """Any Python int -> its low 64 bits as two int32 bit patterns (lo, hi)."""
    s = seed & 0xFFFFFFFFFFFFFFFF
    return _i32(s), _i32(s >> 32)


def row_keys(seed_lo: torch.Tensor, seed_hi: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per row from (seed, step); [B] int32 tensors in (step may be int64), [B] int32 out."""
    k = mix32(seed_hi + _G)
    k = mix32(seed_lo ^ k)
    return mix32(k ^ step.to(torch.int32))


def token_keys(vocab_size: int, device: torch.device | str) -> torch.Tensor:
    """The per-token half of the hash, [V] int32; the sampler caches it per vocabulary."""
    return mix32(torch.arange(vocab_size, device=device, dtype=torch.int32) + _G)


def bits_to_unit(h: torch.Tensor) -> torch.Tensor:
    """32-bit patterns -> float32 in the open interval (0, 1), from the top 23 bits: (k + 0.5) / 2^23.

    23 bits, not 24: k + 0.5 must be exact in float32, or the largest k rounds up to exactly 1.0 and
    -log(u) becomes 0 (a division by zero in the exponential race).
    """
    return (_shr(h, 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def uniform(keys: torch.Tensor, tok_keys: torch.Tensor) -> torch.Tensor:
    """Uniform float32 noise in (0, 1), [B, V]: u[b, v] = hash(keys[b], v).

    For a fixed row key the map v -> hash is injective (xor with a constant and mix32 are bijections), so no
    two tokens of one row share their noise bits.
    """
    return bits_to_unit(mix32(keys[:, None] ^ tok_keys[None, :]))


def exponential(keys: torch.Tensor, tok_keys: torch.Tensor) -> torch.Tensor:
    """Exp(1) noise [B, V] from the counter hash: argmax(p / E) draws a token with probability p."""
    return -torch.log(uniform(keys, tok_keys))
