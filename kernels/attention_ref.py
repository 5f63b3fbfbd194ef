"""Torch reference attention over the slot-indexed KV pool (the twin of the Triton kernels).

extend: for request b and new token i (position p = prefix_lens[b] + i), the output is
    softmax(q[t] . K[slots(b, 0..p)] * sm_scale) @ V[slots(b, 0..p)]
restricted to the last `sliding_window` positions when a window is given. decode is extend with one token;
multi-query decode (rows of a few new tokens after a cached prefix) is extend, computed as the decode kernel does.
GQA: query head h reads KV head h // (Hq // Hkv). An FP8 cache (`kv_quant`) holds codes: K and V are their
codes * k_scale / v_scale [Hkv] (the store writes x / scale, saturated).
"""

from __future__ import annotations

import torch

from radixgen.kernels.kv_quant import dequantize_kv, kv_scales_for, quantize_kv


def _attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, sm_scale: float,
                sliding_window: int | None) -> torch.Tensor:
    """q [n, Hq, D] at positions q_pos [n]; k, v [L, Hkv, D] at positions 0..L-1 -> [n, Hq, D] (fp32 math)."""
    hq = q.shape[1]
    hkv = k.shape[1]
    group = hq // hkv
    kf = k.float().repeat_interleave(group, dim=1)  # [L, Hq, D]
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.float(), kf) * sm_scale
    kv_pos = torch.arange(k.shape[0], device=q.device)
    mask = kv_pos[None, :] <= q_pos[:, None]
    if sliding_window is not None:
        mask &= kv_pos[None, :] > (q_pos[:, None] - sliding_window)
    scores = scores.masked_fill(~mask[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hnl,lhd->nhd", probs, vf).to(q.dtype)


def extend_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    sm_scale: float,
    sliding_window: int | None = None,
    max_extend_len: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, Hq, D]; k_cache/v_cache [S, Hkv, D] already holding the new rows -> o [T, Hq, D]."""
    scales = kv_scales_for(k_cache, k_scale, v_scale)
    out = torch.empty_like(q)
    for b in range(int(prefix_lens.shape[0])):
        pre, ext, start = int(prefix_lens[b]), int(extend_lens[b]), int(extend_start_loc[b])
        if ext == 0:
            continue
        slots = req_to_token[int(req_pool_indices[b]), : pre + ext].long()
        q_pos = torch.arange(pre, pre + ext, device=q.device)
        k, v = _read_kv(k_cache, v_cache, slots, scales)
        out[start : start + ext] = _attend_one(q[start : start + ext], k, v, q_pos, sm_scale, sliding_window)
    return out


def decode_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    sliding_window: int | None = None,
    max_seq_len: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, Hq, D], one new token per request at position seq_lens[b] - 1 -> o [B, Hq, D]."""
    scales = kv_scales_for(k_cache, k_scale, v_scale)
    out = torch.empty_like(q)
    for b in range(int(seq_lens.shape[0])):
        length = int(seq_lens[b])
        slots = req_to_token[int(req_pool_indices[b]), :length].long()
        q_pos = torch.tensor([length - 1], device=q.device)
        k, v = _read_kv(k_cache, v_cache, slots, scales)
        out[b : b + 1] = _attend_one(q[b : b + 1], k, v, q_pos, sm_scale, sliding_window)
    return out


def multi_query_decode_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    sm_scale: float,
    sliding_window: int | None = None,
    max_extend_len: int | None = None,
    max_seq_len: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, Hq, D], a few new tokens per request (a verify or multi-token row) -> o [T, Hq, D]: extend's maths,

        for b, j < extend_lens[b]:  t = extend_start_loc[b] + j;  p = prefix_lens[b] + j
            o[t] = softmax(q[t] . K[slots(b, 0..p)] * sm_scale) @ V[slots(b, 0..p)]   (the window's last keys)

    Flat rows no request owns are not written. `max_seq_len` only sizes the kernel's split count.
    """
    return extend_attention_reference(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens,
                                      extend_start_loc, sm_scale, sliding_window, max_extend_len, k_scale, v_scale)


def _read_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
             scales: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V rows [L, Hkv, D] of `slots`, dequantized to fp32 from an FP8 cache (scales given)."""
    if scales is None:
        return k_cache[slots], v_cache[slots]
    return (dequantize_kv(k_cache[slots], scales[0], torch.float32),
            dequantize_kv(v_cache[slots], scales[1], torch.float32))


def store_kv_reference(k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor, k_scale: torch.Tensor | None = None,
                       v_scale: torch.Tensor | None = None) -> None:
    """k_cache[loc[i]] = k[i]; v_cache[loc[i]] = v[i] (in place); into an FP8 cache k[i] / k_scale and
    v[i] / v_scale, saturated to the e4m3 range."""
    scales = kv_scales_for(k_cache, k_scale, v_scale)
    if scales is None:
        k_cache[loc] = k.to(k_cache.dtype)
        v_cache[loc] = v.to(v_cache.dtype)
        return
    k_cache[loc] = quantize_kv(k, scales[0], k_cache.dtype)
    v_cache[loc] = quantize_kv(v, scales[1], v_cache.dtype)
