"""Torch references for the fused element-wise ops (norms, activation, rotary, grammar bitmask)."""

from __future__ import annotations

import torch


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight, computed in fp32, returned in x.dtype."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * weight.float()).to(x.dtype)


def fused_add_rmsnorm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """residual' = x + residual; returns (rmsnorm(residual'), residual')."""
    new_residual = (x.float() + residual.float()).to(x.dtype)
    return rmsnorm_reference(new_residual, weight, eps), new_residual


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2n] -> silu(x[..., :n]) * x[..., n:]."""
    n = x.shape[-1] // 2
    return (torch.nn.functional.silu(x[..., :n].float()) * x[..., n:].float()).to(x.dtype)


def apply_rotary_reference(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                           cos_sin_cache: torch.Tensor, is_neox: bool = True) -> None:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place; cos_sin_cache [max_pos, rot_dim] = cat(cos, sin).

    neox layout rotates the pairs (i, i + rot/2); the interleaved (GPT-J) layout rotates (2i, 2i + 1).
    Only the first rot_dim features rotate (partial rotary).
    """
    rot = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)  # [T, rot/2]
    cos, sin = cos[:, None, :], sin[:, None, :]
    for t in (q, k):
        x = t[..., :rot].float()
        if is_neox:
            x1, x2 = x[..., : rot // 2], x[..., rot // 2 :]
            out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        else:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
        t[..., :rot] = out.to(t.dtype)


def apply_token_bitmask_reference(logits: torch.Tensor, bitmask: torch.Tensor,
                                  indices: torch.Tensor | None = None) -> None:
    """In place: logits[r, v] = -inf where bit v of bitmask[r] is 0 (bit v lives in word v // 32, bit v % 32).

    `indices`, when given, names the logits rows the bitmask rows apply to (other rows untouched).
    """
    vocab = logits.shape[-1]
    # Unpack through a byte -> 8 bits table: bytes are little-endian within each word, so bit v is bit v % 8 of
    # byte v // 8 (one gather, instead of 32 shifts of every word).
    table = ((torch.arange(256, device=bitmask.device)[:, None] >> torch.arange(8, device=bitmask.device)) & 1).bool()
    allowed = table[bitmask.contiguous().view(torch.uint8).long()].flatten(-2)[..., :vocab]
    if allowed.shape[-1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[-1]))
    allowed = allowed.to(logits.device)
    if indices is None:
        logits.masked_fill_(~allowed, float("-inf"))
        return
    rows = indices.long()
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
