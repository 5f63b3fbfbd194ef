"""Triton twin of `store_kv_reference`: scatter the new K/V rows of a forward into their pool slots."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k_cache, v_cache, loc, k, v, stride_cache, stride_k, stride_v,
                     ROW: tl.constexpr, BLOCK: tl.constexpr):
    """Program (t, c): copy features [c*BLOCK, (c+1)*BLOCK) of token t's K and V rows into slot loc[t]."""
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < ROW
    slot = tl.load(loc + t).to(tl.int64)
    kr = tl.load(k + t.to(tl.int64) * stride_k + offs, mask=mask)
    vr = tl.load(v + t.to(tl.int64) * stride_v + offs, mask=mask)
    tl.store(k_cache + slot * stride_cache + offs, kr.to(k_cache.dtype.element_ty), mask=mask)
    tl.store(v_cache + slot * stride_cache + offs, vr.to(v_cache.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """View x [T, H, D] as [T, H*D] rows; copies only when heads and features are not packed in a row."""
    t = x.shape[0]
    if x.stride(-1) != 1 or (x.dim() == 3 and x.stride(1) != x.shape[2]):
        x = x.contiguous()
    return x.as_strided((t, x[0].numel() if t else 0), (x.stride(0), 1))


def store_kv_triton(k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor) -> None:
    """k_cache[loc[i]] = k[i]; v_cache[loc[i]] = v[i] for caches [S, Hkv, D] with packed rows (in place)."""
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    row = k_cache.shape[1] * k_cache.shape[2]
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k[0].numel() == row
    block = min(triton.next_power_of_2(row), 4096)
    k_rows, v_rows = _rows(k), _rows(v)
    grid = (num_tokens, triton.cdiv(row, block))
    _store_kv_kernel[grid](k_cache, v_cache, loc, k_rows, v_rows, k_cache.stride(0), k_rows.stride(0),
                           v_rows.stride(0), ROW=row, BLOCK=block)
