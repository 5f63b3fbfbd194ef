"""Triton twin of `decode_attention_reference`: split-K flash-decoding over the slot-indexed KV pool.

Stage 1 runs one program per (request, KV head, split). The program loads the query rows of every head in the
KV head's group as the M dimension of its dots ([BLOCK_H, D], padded to 16 rows for the tensor cores), so each
K/V block is read from memory once per group, not once per query head. It walks its share of the request's
positions in blocks of BLOCK_N, gathering K/V rows by slot from req_to_token, and writes a partial output
normalised by its own softmax sum plus that sum's log2-sum-exp. Stage 2 merges the splits of each (request,
head). With a single split stage 1 writes the output directly and stage 2 is skipped.

The split count adapts to the launch: short batches of long contexts get many splits so every SM has work,
large batches get one. Each request divides its own length into the splits, so ragged batches stay balanced.

An FP8 cache (`kv_quant`; the FP8 constexpr branch, the default path compiles as without it) is read as codes
converted exactly to the query dtype for the dots; the program's one KV head scale folds into the score scale
(k_scale) and the output (v_scale), the same maths as dequantizing every element, in fp32.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixgen.kernels.kv_quant import kv_scales_for
from radixgen.kernels.softmax_triton import NEG_LARGE, attend_kv_blocks, normalised_tile

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class DecodeConfig:
    """Launch shape of the decode kernel; `programs_per_sm` and `min_split_tokens` drive the split count."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    programs_per_sm: int = 4
    min_split_tokens: int = 256
    max_splits: int = 64


@triton.jit
def _decode_split_kernel(
    q, k_cache, v_cache, k_scale, v_scale, out, mid_o, mid_lse, req_to_token, req_pool_indices, seq_lens,
    stride_qb, stride_qh, stride_ob, stride_oh, stride_ks, stride_kh, stride_vs, stride_vh, stride_rt,
    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
    sm_scale_log2, window, num_splits,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
    DIRECT_OUT: tl.constexpr, HAS_WINDOW: tl.constexpr, FP8: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens + b).to(tl.int32)
    req = tl.load(req_pool_indices + b).to(tl.int64)
    lo = 0
    if HAS_WINDOW:  # the query at position seq_len - 1 sees positions > seq_len - 1 - window
        lo = tl.maximum(seq_len - window, 0)
    split_len = tl.cdiv(tl.cdiv(seq_len - lo, num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < GROUP
    heads = kv_head * GROUP + offs_h
    offs_d = tl.arange(0, D)
    q_tile = tl.load(q + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                     mask=mask_h[:, None], other=0.0)

    m_i = tl.full([BLOCK_H], NEG_LARGE, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D], tl.float32)
    k_base = k_cache + kv_head.to(tl.int64) * stride_kh
    v_base = v_cache + kv_head.to(tl.int64) * stride_vh
    slots_row = req_to_token + req * stride_rt
    if FP8:  # scores q.k = (q . codes) * k_scale: fold it into the softmax scale
        sm_scale_log2 = sm_scale_log2 * tl.load(k_scale + kv_head)
    m_i, l_i, acc = attend_kv_blocks(q_tile, seq_len, m_i, l_i, acc, slots_row, k_base, v_base, stride_ks, stride_vs,
                                     start, end, sm_scale_log2, window, BLOCK_N, D, MASKED=True, CAUSAL=False,
                                     WINDOWED=False, FP8=FP8)  # one query, at seq_len - 1: it sees [lo, seq_len)
    part, l_safe = normalised_tile(acc, l_i, v_scale, kv_head, FP8)
    if DIRECT_OUT:  # a single split: its normalised partial is the output
        tl.store(out + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 part.to(out.dtype.element_ty), mask=mask_h[:, None])
    else:
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        mid_row = b.to(tl.int64) * stride_mb + heads * stride_mh + split * stride_ms
        tl.store(mid_o + mid_row[:, None] + offs_d[None, :], part, mask=mask_h[:, None])
        tl.store(mid_lse + b.to(tl.int64) * stride_lb + heads * stride_lh + split, lse, mask=mask_h)


@triton.jit
def _decode_reduce_kernel(mid_o, mid_lse, out, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                          stride_ob, stride_oh, num_splits, BLOCK_S: tl.constexpr, D: tl.constexpr):
    """out[b, h] = sum_s w_s * part_s with w_s = softmax over splits of their log2-sum-exp."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    merge_splits_row(mid_o + b * stride_mb + h * stride_mh, mid_lse + b * stride_lb + h * stride_lh,
                     out + b * stride_ob + h * stride_oh, stride_ms, num_splits, BLOCK_S, D)


@triton.jit
def merge_splits_row(mid_o, mid_lse, out, stride_ms, num_splits, BLOCK_S: tl.constexpr, D: tl.constexpr):
    """One (row, head): out[:D] = sum_s w_s * mid_o[s, :D], w = softmax over splits of mid_lse[s] (log2 domain);
    the pointers are at that row and head."""
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < num_splits
    offs_d = tl.arange(0, D)
    lse = tl.load(mid_lse + offs_s, mask=mask_s, other=float("-inf"))
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # a padding row of length 0: every split empty, output 0
    w = tl.exp2(lse - top)
    w = w / tl.maximum(tl.sum(w, 0), 1e-30)
    part = tl.load(mid_o + offs_s[:, None] * stride_ms + offs_d[None, :], mask=mask_s[:, None], other=0.0)
    res = tl.sum(part * w[:, None], 0)
    tl.store(out + offs_d, res.to(out.dtype.element_ty))


@functools.lru_cache(maxsize=8)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_kv_splits(batch: int, num_kv_heads: int, max_seq_len: int, sm_count: int, config: DecodeConfig) -> int:
    """Splits per (request, KV head): enough programs to give every SM `programs_per_sm` of them, but no split
    shorter than `min_split_tokens` (a split's fixed cost is its partial write and the merge)."""
    programs = max(batch * num_kv_heads, 1)
    wanted = triton.cdiv(config.programs_per_sm * sm_count, programs)
    by_length = max(max_seq_len // config.min_split_tokens, 1)
    return max(1, min(wanted, by_length, config.max_splits))


def decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    sliding_window: int | None = None,
    max_seq_len: int | None = None,
    config: DecodeConfig | None = None,
    num_splits: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, Hq, D] (one new token per request, at position seq_lens[b] - 1) -> o [B, Hq, D].

    `max_seq_len` (an upper bound of seq_lens) only sizes the split count; pass it to avoid a device sync, and
    pass a fixed `num_splits` when the launch is captured in a CUDA graph replayed for many lengths. An FP8 cache
    takes its k_scale and v_scale ([Hkv] fp32).
    """
    scales = kv_scales_for(k_cache, k_scale, v_scale)
    config = config or DecodeConfig()
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    assert num_q_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(q)
    if batch == 0:
        return out
    if num_splits is None:
        if max_seq_len is None:
            max_seq_len = int(seq_lens.max())
        if sliding_window is not None:
            max_seq_len = min(max_seq_len, sliding_window)
        sms = sm_count(q.device.index or 0) if q.is_cuda else 132
        num_splits = num_kv_splits(batch, num_kv_heads, max_seq_len, sms, config)
    if num_splits > 1:
        mid_o = torch.empty(batch, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        mid_lse = torch.empty(batch, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
    else:  # unused by the kernel; any float32 tensors keep the signature uniform
        mid_o = torch.empty(1, 1, 1, 1, dtype=torch.float32, device=q.device)
        mid_lse = torch.empty(1, 1, 1, dtype=torch.float32, device=q.device)
    ks, vs = scales if scales is not None else (k_cache, v_cache)  # unread without FP8
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, ks, vs, out, mid_o, mid_lse, req_to_token, req_pool_indices, seq_lens,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), req_to_token.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        sm_scale * LOG2E, sliding_window or 0, num_splits,
        GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), D=head_dim, BLOCK_N=config.block_n,
        DIRECT_OUT=num_splits == 1, HAS_WINDOW=sliding_window is not None, FP8=scales is not None,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if num_splits > 1:
        _decode_reduce_kernel[(batch, num_q_heads)](
            mid_o, mid_lse, out, mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0),
            mid_lse.stride(1), out.stride(0), out.stride(1), num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits), D=head_dim, num_warps=4,
        )
    return out
