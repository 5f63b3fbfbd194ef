"""Triton FP8 GEMV for a few rows: an Fp8Weight times activations quantized per token (xq, xs), or, for one row,
times the activations as they are (weight-only: the CUDA cores need no FP8 operand, and the quantize launch before
every matmul goes).

Its twin is `quant_ref.quant_linear_reference` for an Fp8Weight on x quantized the same way, and dequantize-then-
matmul for the weight-only row. With few rows a
matmul is a stream over the weight, and `torch._scaled_mm` does not reach the bandwidth that half of bf16's
bytes allows. Here a program owns BLOCK_N
output channels and a slice of K (split-K, so a GEMV fills every SM; the last slice of a tile adds the fp32
partial sums in a fixed order through `_store_tile`, so one launch does the matmul, bias included). Two kinds:

- "fma" (one row, on the CUDA cores): each step loads a [BLOCK_N, BLOCK_K] e4m3 tile as 16-byte vectors along
  K, converts it to fp32 (a hardware conversion on Ada and Hopper) and multiplies it with x (e4m3 with its scale,
  or fp32/bf16/fp16 unscaled); each thread sums its 16 products in the step, threads' sums are added once at the
  end. Products of e4m3 by e4m3 or by a 16-bit float are exact in fp32 (by an fp32 value, rounded once), so only
  the order of the fp32 additions differs from the reference.
- "mma" (up to 16 rows, on the FP8 tensor cores, operands swapped): out.T tile [BLOCK_N, 16] = w tile @ xq.T,
  so the weight fills the instruction's 64-row side and the rows pad only its narrow side; the loads are
  pipelined over num_stages steps. Hopper's tensor cores add FP8 products with a narrowed mantissa, so each
  step's product (at most `MMA_EXACT_K` inputs) starts from zero and is added to the fp32 sums in registers.

The scales xs[m] * ws[n] multiply each slice's sums before they are added (the product is linear), then the
bias is added once. Launch parameters depend on shapes only, so the matmul captures in CUDA graphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import triton
import triton.language as tl
from torch import Tensor

from radixgen.kernels.dequant_matmul_triton import _num_sms, _store_tile
from radixgen.kernels.quant_weight import Fp8Weight

VEC = 16  # e4m3 values per 16-byte load: the run along K each thread of the "fma" kernel reads and sums
MMA_ROWS = 16  # the narrow side of the swapped tensor-core product (rows padded up to it)
MMA_EXACT_K = 256  # the most inputs the tensor cores sum in their own precision before fp32 takes over


@dataclass(frozen=True)
class GemvTiles:
    """One launch shape: BLOCK_N output channels x BLOCK_K inputs per step, warps per program, pipeline stages
    ("mma"), and the programs per SM that split-K aims for."""

    kind: Literal["fma", "mma"]
    block_n: int
    block_k: int
    num_warps: int
    programs_per_sm: int
    num_stages: int = 1


# Launch shapes picked on the H200 by timing variants of each kernel over the Llama-3-8B linears (CUDA graphs,
# weights not in L2; docs/benchmarks.md): one row streams 2 KiB of each of 4 channels per step with 4 warps, or,
# for many channels over a short K (qkv, gate_up), 1 KiB with 2 warps in more programs; 2-15 rows take
# 128 x 256 weight bytes a stage, 3 stages, 8 warps.
GEMV1_TILES = GemvTiles("fma", block_n=4, block_k=2048, num_warps=4, programs_per_sm=8)
GEMV1_WIDE_TILES = GemvTiles("fma", block_n=4, block_k=1024, num_warps=2, programs_per_sm=4)
WIDE_N, SHORT_K = 6144, 4096  # one row takes GEMV1_WIDE_TILES from N >= WIDE_N channels over K <= SHORT_K
GEMV_MMA_TILES = GemvTiles("mma", block_n=128, block_k=256, num_warps=8, programs_per_sm=2, num_stages=3)


@triton.jit
def _fp8_gemv1_kernel(xq, xs, w, ws, out, partial, locks, bias, N, K, K_PER_SPLIT, SPLITS, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, VEC: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                      X_SCALED: tl.constexpr):
    """out[n] = sum_k xq[k] * w[n, k] * xs * ws[n] (+ bias[n]) over this program's channels and slice of K (xs = 1
    unless X_SCALED): the step's tile as [BLOCK_N, BLOCK_K // VEC, VEC], its products summed over the VEC axis
    (within a thread), acc[n, t] over the steps and summed over t at the end. BLOCK_K = 512 * num_warps keeps xq's
    [T, VEC] tile in the weight tile's layout (16 values a thread), so no step exchanges values between threads."""
    pid_n, split = tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    # channels past N read channel N - 1 (no mask on the loads); their sums are never stored
    rows = w + tl.minimum(offs_n, N - 1).to(tl.int64)[:, None, None] * K
    kk = tl.arange(0, BLOCK_K // VEC)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
    k_begin = split * K_PER_SPLIT
    k_end = tl.minimum(k_begin + K_PER_SPLIT, K)
    for k0 in range(k_begin, k_end, BLOCK_K):
        k = k0 + kk
        if EVEN_K:
            wt = tl.load(rows + k[None, :, :], eviction_policy="evict_first")
            xt = tl.load(xq + k)
        else:
            wt = tl.load(rows + k[None, :, :], mask=(k < k_end)[None, :, :], other=0.0,
                         eviction_policy="evict_first")
            xt = tl.load(xq + k, mask=k < k_end, other=0.0)
        acc += tl.sum(wt.to(tl.float32) * xt.to(tl.float32)[None, :, :], axis=2)
    scale = tl.load(ws + offs_n, mask=mask_n, other=0.0)
    if X_SCALED:
        scale = scale * tl.load(xs)
    _store_tile(tl.sum(acc, axis=1) * scale, offs_n.to(tl.int64), offs_n, mask_n, out, partial, locks, bias, pid_n,
                split, SPLITS, N, HAS_BIAS)


@triton.jit
def _fp8_gemv_mma_kernel(xq, xs, w, ws, out, partial, locks, bias, M, N, K, K_PER_SPLIT, SPLITS,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         EXACT_K: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr):
    """out.T[n, m] = sum_k w[n, k] * xq[m, k] * xs[m] * ws[n] (+ bias[n]) over this program's channels and slice
    of K, a tensor-core product per step into acc [BLOCK_N, BLOCK_M]."""
    pid_n, split = tl.program_id(1), tl.program_id(2)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m, mask_n = offs_m < M, offs_n < N
    # rows past M and channels past N read the last ones (no masks on the loads); their sums are never stored
    x_rows = xq + tl.minimum(offs_m, M - 1).to(tl.int64)[:, None] * K
    w_rows = w + tl.minimum(offs_n, N - 1).to(tl.int64)[:, None] * K
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    k_begin = split * K_PER_SPLIT
    k_end = tl.minimum(k_begin + K_PER_SPLIT, K)
    for k0 in range(k_begin, k_end, BLOCK_K):
        k = k0 + offs_k
        if EVEN_K:
            wt = tl.load(w_rows + k[None, :], eviction_policy="evict_first")
            xt = tl.load(x_rows + k[None, :])
        else:
            wt = tl.load(w_rows + k[None, :], mask=(k < k_end)[None, :], other=0.0, eviction_policy="evict_first")
            xt = tl.load(x_rows + k[None, :], mask=(k < k_end)[None, :], other=0.0)
        acc = tl.dot(wt, tl.trans(xt), acc, max_num_imprecise_acc=EXACT_K)
    scale = (tl.load(ws + offs_n, mask=mask_n, other=0.0)[:, None]
             * tl.load(xs + tl.minimum(offs_m, M - 1))[None, :])
    idx = offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
    cols = tl.broadcast_to(offs_n[:, None], (BLOCK_N, BLOCK_M))
    _store_tile(acc * scale, idx, cols, mask_n[:, None] & mask_m[None, :], out, partial, locks, bias, pid_n, split,
                SPLITS, M * N, HAS_BIAS)


def gemv_tiles(rows: int, n: int, k: int) -> GemvTiles:
    """The launch shape for a GEMV over `rows` (1 .. MMA_ROWS) rows of an [n, k] weight."""
    if rows > 1:
        return GEMV_MMA_TILES
    return GEMV1_WIDE_TILES if n >= WIDE_N and k <= SHORT_K else GEMV1_TILES


def split_k(n_tiles: int, k: int, tiles: GemvTiles, num_sms: int) -> tuple[int, int]:
    """(splits, K per split): K cut into whole steps among enough programs to give each SM its share."""
    steps = triton.cdiv(k, tiles.block_k)
    splits = max(1, min(steps, tiles.programs_per_sm * num_sms // n_tiles))
    k_per_split = triton.cdiv(steps, splits) * tiles.block_k
    return triton.cdiv(k, k_per_split), k_per_split


def fp8_gemv_triton(xq: Tensor, xs: Tensor | None, w: Fp8Weight, bias: Tensor | None, dtype: torch.dtype,
                    tiles: GemvTiles | None = None) -> Tensor:
    """xq [M, K] e4m3 (M <= MMA_ROWS; "fma" tiles: M = 1), xs float32 [M, 1] -> [M, N] in `dtype`, as
    `quant_ref.quant_linear_reference` on the x they quantize; with xs None ("fma" tiles only) xq is one row of
    unquantized activations (fp32, bf16 or fp16) and the product is x @ dequantize(w).T. `tiles` overrides the
    launch shape (for tuning)."""
    m, k = xq.shape
    n = w.shape[0]
    tiles = tiles or gemv_tiles(m, n, k)
    if m > (1 if tiles.kind == "fma" else MMA_ROWS) or w.weight.stride() != (k, 1):
        raise ValueError(f"fp8_gemv_triton: {m} rows for {tiles.kind} tiles, weight strides {w.weight.stride()}")
    if xs is None and tiles.kind != "fma":
        raise ValueError("fp8_gemv_triton: unquantized activations (xs None) need the one-row fma tiles")
    scaled = xs is not None
    xq = xq.contiguous()
    xs = xs.contiguous() if xs is not None else xq  # unread when X_SCALED is off
    n_tiles = triton.cdiv(n, tiles.block_n)
    splits, k_per_split = split_k(n_tiles, k, tiles, _num_sms(xq.device))
    locks = w.locks
    if splits > 1 and n_tiles > locks.numel():  # more tiles than counters (not with these blocks)
        splits, k_per_split = 1, k
    out = torch.empty(m, n, dtype=dtype, device=xq.device)
    if m == 0:
        return out
    partial = torch.empty(splits, m, n, dtype=torch.float32, device=xq.device) if splits > 1 else out
    grid = (1, n_tiles, splits)
    even_k = k % tiles.block_k == 0
    b = bias if bias is not None else out
    if tiles.kind == "fma":
        _fp8_gemv1_kernel[grid](xq, xs, w.weight, w.scale, out, partial, locks, b, n, k, k_per_split, splits,
                                BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, VEC=VEC, EVEN_K=even_k,
                                HAS_BIAS=bias is not None, X_SCALED=scaled, num_warps=tiles.num_warps)
    else:
        _fp8_gemv_mma_kernel[grid](xq, xs, w.weight, w.scale, out, partial, locks, b, m, n, k, k_per_split, splits,
                                   BLOCK_M=MMA_ROWS, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
                                   EXACT_K=min(MMA_EXACT_K, tiles.block_k), EVEN_K=even_k,
                                   HAS_BIAS=bias is not None, num_warps=tiles.num_warps,
                                   num_stages=tiles.num_stages)
    return out


__all__ = ["GEMV1_TILES", "GEMV1_WIDE_TILES", "GEMV_MMA_TILES", "MMA_ROWS", "GemvTiles", "fp8_gemv_triton",
           "gemv_tiles", "split_k"]
