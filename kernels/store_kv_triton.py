"""Triton twin of `store_kv_reference`: scatter the new K/V rows of a forward into their pool slots (into an FP8
cache as x / scale of the row's KV head, saturated: the FP8 variant is a constexpr branch, the other untouched)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixgen.kernels.kv_quant import FP8_KV_MAX, kv_scales_for

FP8_MAX = tl.constexpr(FP8_KV_MAX)


@triton.jit
def _store_kv_kernel(k_cache, v_cache, loc, k, v, k_scale, v_scale, stride_cache, stride_k, stride_v,
                     ROW: tl.constexpr, BLOCK: tl.constexpr, D: tl.constexpr, FP8: tl.constexpr):
    """Program (t, c): copy features [c*BLOCK, (c+1)*BLOCK) of token t's K and V rows into slot loc[t]; with FP8,
    each feature divided by its head's scale (feature f is in head f // D) and saturated first."""
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < ROW
    slot = tl.load(loc + t).to(tl.int64)
    kr = tl.load(k + t.to(tl.int64) * stride_k + offs, mask=mask)
    vr = tl.load(v + t.to(tl.int64) * stride_v + offs, mask=mask)
    if FP8:
        ks = tl.load(k_scale + offs // D, mask=mask, other=1.0)
        vs = tl.load(v_scale + offs // D, mask=mask, other=1.0)
        kr = tl.clamp(tl.math.div_rn(kr.to(tl.float32), ks), -FP8_MAX, FP8_MAX)
        vr = tl.clamp(tl.math.div_rn(vr.to(tl.float32), vs), -FP8_MAX, FP8_MAX)
    tl.store(k_cache + slot * stride_cache + offs, kr.to(k_cache.dtype.element_ty), mask=mask)
    tl.store(v_cache + slot * stride_cache + offs, vr.to(v_cache.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """View x [T, H, D] as [T, H*D] rows; copies only when heads and features are not packed in a row."""
    t = x.shape[0]
    if x.stride(-1) != 1 or (x.dim() == 3 and x.stride(1) != x.shape[2]):
        x = x.contiguous()
    return x.as_strided((t, x[0].numel() if t else 0), (x.stride(0), 1))


def store_kv_triton(k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> None:
    """k_cache[loc[i]] = k[i]; v_cache[loc[i]] = v[i] for caches [S, Hkv, D] with packed rows (in place); an
    FP8 cache takes k[i] / k_scale, v[i] / v_scale (scales [Hkv] fp32, contiguous)."""
    scales = kv_scales_for(k_cache, k_scale, v_scale)
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    row = k_cache.shape[1] * k_cache.shape[2]
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k[0].numel() == row
    block = min(triton.next_power_of_2(row), 4096)
    k_rows, v_rows = _rows(k), _rows(v)
    grid = (num_tokens, triton.cdiv(row, block))
    ks, vs = scales if scales is not None else (k_cache, v_cache)  # unread without FP8
    _store_kv_kernel[grid](k_cache, v_cache, loc, k_rows, v_rows, ks, vs, k_cache.stride(0), k_rows.stride(0),
                           v_rows.stride(0), ROW=row, BLOCK=block, D=k_cache.shape[2], FP8=scales is not None)
