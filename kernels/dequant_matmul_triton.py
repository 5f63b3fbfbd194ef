"""Triton twins of `quant_linear_reference` for weights decoded in registers: int4 (W4A16), int8 (W8A16, GGUF's
Q8_0, Q5_K and Q6_K repacked) and GGUF blocks.

One skeleton, one tile decoder per format. A program owns BLOCK_N output columns of BLOCK_M rows and a slice of
K (split-K, so a batch-1 GEMV still fills the GPU: the slices' fp32 partial sums land in [splits, M, N], and the
last slice of a tile to finish adds them in a fixed order, so results do not depend on scheduling and one launch
does the whole matmul, bias included); each step decodes a [BLOCK_K, BLOCK_N] weight tile and multiplies it with
tensor cores (BLOCK_M >= 16, up to 64 rows per program so the weight is decoded once per 64 rows) or by a
broadcast product (1-2 rows). int4 and int8 share one layout (int32 words along K: 8 nibbles or 4 signed bytes,
`BITS`) and one set of kernels; at one row they have their own GEMV, which never unpacks a tile: it applies each
group's scale and zero to partial sums. Packed values become fp32 by bit tricks, not int-to-float conversions,
which GPUs issue at a fraction of the FMA rate. Many rows (prefill) decode the whole weight once into the
activation dtype and run the dense matmul instead, which is compute-bound anyway.

Launch parameters depend on shapes only, so the matmul captures in CUDA graphs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from radixgen.kernels.gguf_ref import Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0
from radixgen.kernels.quant_weight import GGUFWeight, Int4Weight, Int8Weight

# format ids of packed integer weights in the kernels, by how a group's offsets apply (GGUF formats: GGML type
# ids): (q - zeros) * scales, q * scales - mins, q * scales
ZEROS_FORMAT, MINS_FORMAT, SCALES_FORMAT = 1000, 1001, 1002
DENSE_FROM_ROWS = 128  # from this many rows on, decode the weight once and run the dense matmul
# the integer GEMV's tiles (one row): BLOCK_N columns, int32 words per column per step (BLOCK_K = words x values
# per word: 512 inputs of int4, 256 of int8, the same bytes), programs per SM that split-K aims for, warps
GEMV1_BLOCK_N, GEMV1_WORDS, GEMV1_PROGRAMS_PER_SM, GEMV1_WARPS = 32, 64, 4, 4
INT8_TILE_K = 32  # the tensor-core kernel's inputs per step for int8 (group 16: two groups)
# the tensor-core kernel's columns, the programs per SM split-K aims for (up to 16 rows, more rows), warps
TC_BLOCK_N, TC_PROGRAMS_PER_SM, TC_PROGRAMS_PER_SM_64, TC_WARPS = 64, 8, 4, 4

# rows of the block column one decode step of a GGUF format covers: a (sub-)block
_GGUF_BLOCK_K = {Q8_0.code: 32, Q4_0.code: 32, Q4_1.code: 32, Q4_K.code: 32, Q5_K.code: 32, Q6_K.code: 16}


@triton.jit
def _u8(ptr, off, mask):
    return tl.load(ptr + off, mask=mask, other=0).to(tl.int32)


@triton.jit
def _f16(ptr, off, mask):
    """The little-endian half at byte offset `off` (2-aligned) as fp32."""
    lo = tl.load(ptr + off, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(ptr + off + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _word_ints(packed, i, BITS: tl.constexpr):
    """Value i (a scalar or a tensor broadcasting with `packed`) of int32 words as int32: nibble i, 0..15
    (BITS = 4), or byte i, two's complement (BITS = 8)."""
    if BITS == 8:
        q = (packed << (24 - 8 * i)) >> 24
    else:
        q = (packed >> (4 * i)) & 0xF
    return q


@triton.jit
def _ints_f32(q, BITS: tl.constexpr):
    """`_word_ints`' values as fp32 without an int-to-float conversion (a slow instruction on GPUs): OR-ed into
    2**23's mantissa (0..15) or added to 1.5 * 2**23's bits (signed), less that number (exact)."""
    if BITS == 8:
        f = (q + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0
    else:
        f = (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    return f


@triton.jit
def _placed_f32(low, high, i: tl.constexpr, BITS: tl.constexpr):
    """Value i of int32 words, read in place, as fp32 (value << pos), and 2**-pos, the factor that undoes the
    shift: one AND and one subtraction per value. `low` / `high` are the words (int4: and the words shifted
    right by 12; int8: bytes + 128, XOR 0x80 each, and shifted right by 16) OR-ed once with 2**23's exponent
    bits, which the AND keeps: the value lands in 2**23's mantissa (bits up to 22), taken off exactly."""
    if BITS == 8:
        pos = 8 * (i % 2)
        src = low if i < 2 else high
        f = (src & ((0xFF << pos) | 0x4B000000)).to(tl.float32, bitcast=True) - (8388608.0 + 128.0 * (1 << pos))
    else:
        pos = 4 * i if i < 5 else 4 * (i - 3)
        src = low if i < 5 else high
        f = (src & ((0xF << pos) | 0x4B000000)).to(tl.float32, bitcast=True) - 8388608.0
    return f, 1.0 / (1 << pos)


@triton.jit
def _apply_group(q, s, o, FORMAT: tl.constexpr):
    """Values q with their group's scale s and zero point or minimum o (broadcasting), as FORMAT says."""
    if FORMAT == 1000:  # ZEROS_FORMAT
        w = (q - o) * s
    elif FORMAT == 1001:  # MINS_FORMAT
        w = q * s - o
    else:
        w = q * s
    return w


@triton.jit
def _store_tile(acc, idx, cols, mask, out, partial, locks, bias, tile, split, SPLITS, MN,
                HAS_BIAS: tl.constexpr):
    """Write a program's sums `acc` (at flat offsets `idx` of the [M, N] output, columns `cols`): directly when
    K is not split, else into its slice of `partial`; the last slice of the tile to arrive adds the slices in a
    fixed order (results do not depend on scheduling), writes the output and resets the tile's counter, so one
    launch does the whole matmul."""
    if SPLITS == 1:
        total = acc
    else:
        tl.store(partial + split.to(tl.int64) * MN + idx, acc, mask=mask)
        tl.debug_barrier()
        arrived = tl.atomic_add(locks + tile, 1, sem="acq_rel")
        total = acc
        if arrived == SPLITS - 1:
            total = tl.load(partial + idx, mask=mask, other=0.0, cache_modifier=".cg")
            for s in range(1, SPLITS):
                total += tl.load(partial + s * MN + idx, mask=mask, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(locks + tile, 0)
        else:
            mask = mask & False
    if HAS_BIAS:
        total += tl.load(bias + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + idx, total.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _int_tile_load(qweight, scales, offsets, k0, offs_n, mask_n, N, FORMAT: tl.constexpr, GROUP: tl.constexpr,
                   BITS: tl.constexpr, BLOCK_K: tl.constexpr):
    """The packed words [BLOCK_K * BITS // 32, BLOCK_N] of weight rows k0 .. k0 + BLOCK_K, and their scales and
    zero points or minimums (SCALES_FORMAT: the scales again, unused): [BLOCK_N] when the step is one group,
    else [words, BLOCK_N], a row per word; rows past K read as zeros through `mask_n`."""
    word = k0 // (32 // BITS) + tl.arange(0, BLOCK_K * BITS // 32)
    packed = tl.load(qweight + word[:, None] * N + offs_n[None, :], mask=mask_n[None, :], other=0)
    if BLOCK_K > GROUP:
        idx = ((word * (32 // BITS)) // GROUP)[:, None] * N + offs_n[None, :]
        mask = mask_n[None, :]
    else:
        idx = (k0 // GROUP) * N + offs_n
        mask = mask_n
    s = tl.load(scales + idx, mask=mask, other=0.0).to(tl.float32)
    if FORMAT == 1002:  # SCALES_FORMAT
        o = s
    else:
        o = tl.load(offsets + idx, mask=mask, other=0.0).to(tl.float32)
    return packed, s, o


@triton.jit
def _int_tile_decode(packed, s, o, FORMAT: tl.constexpr, GROUP: tl.constexpr, BITS: tl.constexpr,
                     BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """`_int_tile_load`'s words as the fp32 weights [BLOCK_K, BLOCK_N]."""
    q = _word_ints(packed[:, None, :], tl.arange(0, 32 // BITS)[None, :, None], BITS)  # [words, values, BLOCK_N]
    if BLOCK_K > GROUP:  # (the compiler reads on past a return in a constexpr branch: no early returns)
        w = tl.reshape(_apply_group(_ints_f32(q, BITS), s[:, None, :], o[:, None, :], FORMAT), (BLOCK_K, BLOCK_N))
    else:
        w = _apply_group(_ints_f32(tl.reshape(q, (BLOCK_K, BLOCK_N)), BITS), s[None, :], o[None, :], FORMAT)
    return w


@triton.jit
def _decode_tile(w0, w1, w2, k0, offs_n, mask_n, N, ROW_BYTES, FORMAT: tl.constexpr, GROUP: tl.constexpr,
                 BITS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """Weight rows k0 .. k0 + BLOCK_K (scale groups or a block column) x columns offs_n, fp32 [BLOCK_K, BLOCK_N].

    int4 / int8: w0 = qweight, w1 = scales, w2 = zeros or minimums. GGUF: w0 = the uint8 rows of blocks."""
    e = tl.arange(0, BLOCK_K)
    mask = mask_n[None, :]
    if FORMAT >= 1000:  # ZEROS_FORMAT, MINS_FORMAT, SCALES_FORMAT
        packed, s, o = _int_tile_load(w0, w1, w2, k0, offs_n, mask_n, N, FORMAT, GROUP, BITS, BLOCK_K)
        w = _int_tile_decode(packed, s, o, FORMAT, GROUP, BITS, BLOCK_K, BLOCK_N)
    elif FORMAT == 8:  # Q8_0
        base = offs_n.to(tl.int64) * ROW_BYTES + (k0 // 32) * 34
        d = _f16(w0, base, mask_n)
        q = tl.load(w0 + base[None, :] + 2 + e[:, None], mask=mask, other=0).to(tl.int8, bitcast=True)
        w = q.to(tl.float32) * d[None, :]
    elif FORMAT == 2:  # Q4_0
        base = offs_n.to(tl.int64) * ROW_BYTES + (k0 // 32) * 18
        d = _f16(w0, base, mask_n)
        q = (_u8(w0, base[None, :] + 2 + (e % 16)[:, None], mask) >> (4 * (e // 16))[:, None]) & 0xF
        w = d[None, :] * (q - 8).to(tl.float32)
    elif FORMAT == 3:  # Q4_1
        base = offs_n.to(tl.int64) * ROW_BYTES + (k0 // 32) * 20
        d = _f16(w0, base, mask_n)
        m = _f16(w0, base + 2, mask_n)
        q = (_u8(w0, base[None, :] + 4 + (e % 16)[:, None], mask) >> (4 * (e // 16))[:, None]) & 0xF
        w = d[None, :] * q.to(tl.float32) + m[None, :]
    elif FORMAT == 12 or FORMAT == 13:  # Q4_K, Q5_K: block column k0 is sub-block j of its super-block
        base = offs_n.to(tl.int64) * ROW_BYTES + (k0 // 256) * (144 if FORMAT == 12 else 176)
        j = (k0 % 256) // 32
        d = _f16(w0, base, mask_n)
        dmin = _f16(w0, base + 2, mask_n)
        a = _u8(w0, base + 4 + j % 4, mask_n)
        b = _u8(w0, base + 8 + j % 4, mask_n)
        c = _u8(w0, base + 12 + j % 4, mask_n)
        sc = tl.where(j < 4, a & 63, (c & 0xF) | ((a >> 6) << 4)).to(tl.float32)
        mn = tl.where(j < 4, b & 63, (c >> 4) | ((b >> 6) << 4)).to(tl.float32)
        if FORMAT == 12:
            q = (_u8(w0, base[None, :] + 16 + (j // 2) * 32 + e[:, None], mask) >> (4 * (j % 2))) & 0xF
        else:  # the nibbles after 32 bytes of high bits: bit j of byte e is element e's fifth bit
            q = (_u8(w0, base[None, :] + 48 + (j // 2) * 32 + e[:, None], mask) >> (4 * (j % 2))) & 0xF
            q = q | (((_u8(w0, base[None, :] + 16 + e[:, None], mask) >> j) & 1) << 4)
        w = (d * sc)[None, :] * q.to(tl.float32) - (dmin * mn)[None, :]
    else:  # Q6_K: block column k0 is the 16 elements of scale j
        base = offs_n.to(tl.int64) * ROW_BYTES + (k0 // 256) * 210
        t = k0 % 256 + e  # element within the super-block
        half = t // 128
        r = t % 128
        lo = (_u8(w0, base[None, :] + (half * 64 + r % 64)[:, None], mask) >> (4 * (r // 64))[:, None]) & 0xF
        hi = (_u8(w0, base[None, :] + (128 + half * 32 + t % 32)[:, None], mask) >> (2 * (r // 32))[:, None]) & 3
        sc = tl.load(w0 + base + 192 + (k0 % 256) // 16, mask=mask_n, other=0).to(tl.int8, bitcast=True)
        d = _f16(w0, base + 208, mask_n)
        w = (d * sc.to(tl.float32))[None, :] * ((lo | (hi << 4)) - 32).to(tl.float32)
    return w


@triton.jit
def _dequant_matmul_kernel(x, w0, w1, w2, out, partial, locks, bias, M, N, K, stride_xm, ROW_BYTES, K_PER_SPLIT,
                           SPLITS, FORMAT: tl.constexpr, GROUP: tl.constexpr, BITS: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           HAS_BIAS: tl.constexpr):
    """out[m, n] = sum over k of x[m, k] * w[n, k] (+ bias[n]), this program's split of K."""
    pid_m, pid_n, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m, mask_n = offs_m < M, offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_begin = split * K_PER_SPLIT
    k_end = tl.minimum(k_begin + K_PER_SPLIT, K)
    x_rows = x + offs_m[:, None].to(tl.int64) * stride_xm
    if FORMAT >= 1000:  # int4 / int8: the next step's words load while this one's multiply
        packed, s, o = _int_tile_load(w0, w1, w2, k_begin, offs_n, mask_n, N, FORMAT, GROUP, BITS, BLOCK_K)
        for k0 in range(k_begin, k_end, BLOCK_K):
            more = mask_n & (tl.zeros_like(offs_n) + k0 + BLOCK_K < k_end)  # the last step prefetches nothing
            packed_next, s_next, o_next = _int_tile_load(w0, w1, w2, k0 + BLOCK_K, offs_n, more, N, FORMAT, GROUP,
                                                         BITS, BLOCK_K)
            xt = tl.load(x_rows + (k0 + offs_k)[None, :], mask=mask_m[:, None], other=0.0)
            wt = _int_tile_decode(packed, s, o, FORMAT, GROUP, BITS, BLOCK_K, BLOCK_N)
            if BLOCK_M >= 16:
                acc += tl.dot(xt, wt.to(xt.dtype))
            else:
                acc += tl.sum(xt.to(tl.float32)[:, :, None] * wt[None, :, :], axis=1)
            packed, s, o = packed_next, s_next, o_next
    else:
        for k0 in range(k_begin, k_end, BLOCK_K):
            xt = tl.load(x_rows + (k0 + offs_k)[None, :], mask=mask_m[:, None], other=0.0)
            wt = _decode_tile(w0, w1, w2, k0, offs_n, mask_n, N, ROW_BYTES, FORMAT, GROUP, BITS, BLOCK_K,
                              BLOCK_N)
            if BLOCK_M >= 16:
                acc += tl.dot(xt, wt.to(xt.dtype))
            else:
                acc += tl.sum(xt.to(tl.float32)[:, :, None] * wt[None, :, :], axis=1)
    idx = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    cols = tl.broadcast_to(offs_n[None, :], (BLOCK_M, BLOCK_N))
    _store_tile(acc, idx, cols, mask_m[:, None] & mask_n[None, :], out, partial, locks, bias,
                pid_m * tl.num_programs(1) + pid_n, split, SPLITS, M * N, HAS_BIAS)


@triton.jit
def _int_words(qweight, scales, offsets, word, mask_k, offs_n, mask_n, N, FORMAT: tl.constexpr,
               GROUP: tl.constexpr, BITS: tl.constexpr):
    """The GEMV step's packed words [words, BLOCK_N] (32 // BITS values each) and the fp32 scale and zero point
    or minimum (SCALES_FORMAT: the scale again, unused) of each word's group, for the words `word` (masked by
    `mask_k`) of columns offs_n."""
    mask = mask_k[:, None] & mask_n[None, :]
    packed = tl.load(qweight + word[:, None] * N + offs_n[None, :], mask=mask, other=0)
    idx = ((word * (32 // BITS)) // GROUP)[:, None] * N + offs_n[None, :]
    s = tl.load(scales + idx, mask=mask, other=0.0).to(tl.float32)
    if FORMAT == 1002:  # SCALES_FORMAT
        o = s
    else:
        o = tl.load(offsets + idx, mask=mask, other=0.0).to(tl.float32)
    return packed, s, o


@triton.jit
def _int_gemv1_kernel(x, qweight, scales, offsets, out, partial, locks, bias, N, K, K_PER_SPLIT, SPLITS,
                      FORMAT: tl.constexpr, GROUP: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr):
    """`_dequant_matmul_kernel` for one row of an int4 or int8 weight, in 2-D tiles of words: acc[r, n] over the
    steps, summed over r at the end; a group's scale and offset apply to the partial sums of its words."""
    pid_n, split = tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    rows = tl.arange(0, BLOCK_K // (32 // BITS))
    acc = tl.zeros((BLOCK_K // (32 // BITS), BLOCK_N), dtype=tl.float32)
    k_begin = split * K_PER_SPLIT
    k_end = tl.minimum(k_begin + K_PER_SPLIT, K)
    word = k_begin // (32 // BITS) + rows
    mask_k = word < k_end // (32 // BITS)
    packed, s, o = _int_words(qweight, scales, offsets, word, mask_k, offs_n, mask_n, N, FORMAT, GROUP, BITS)
    for _k0 in range(k_begin, k_end, BLOCK_K):  # the next step's words load while this one's multiply
        word_next = word + BLOCK_K // (32 // BITS)
        mask_next = word_next < k_end // (32 // BITS)
        packed_next, s_next, o_next = _int_words(qweight, scales, offsets, word_next, mask_next, offs_n, mask_n,
                                                 N, FORMAT, GROUP, BITS)
        dot = tl.zeros((BLOCK_K // (32 // BITS), BLOCK_N), dtype=tl.float32)
        xsum = tl.zeros((BLOCK_K // (32 // BITS),), dtype=tl.float32)
        # values read where they sit in the word, (value << pos), and x scaled by 2**-pos: both exact
        if BITS == 8:
            biased = packed ^ -0x7F7F7F80  # 0x80808080: signed bytes as unsigned, + 128
            low, high = biased | 0x4B000000, (biased >> 16) | 0x4B000000
        else:
            low, high = packed | 0x4B000000, (packed >> 12) | 0x4B000000
        for i in tl.static_range(32 // BITS):
            xi = tl.load(x + word * (32 // BITS) + i, mask=mask_k, other=0.0).to(tl.float32)
            f, unit = _placed_f32(low, high, i, BITS)
            dot += (xi * unit)[:, None] * f
            if FORMAT != 1002:  # SCALES_FORMAT needs no sum of x
                xsum += xi
        if FORMAT == 1000:  # ZEROS_FORMAT
            acc += s * (dot - o * xsum[:, None])
        elif FORMAT == 1001:  # MINS_FORMAT
            acc += s * dot - o * xsum[:, None]
        else:
            acc += s * dot
        packed, s, o, word, mask_k = packed_next, s_next, o_next, word_next, mask_next
    _store_tile(tl.sum(acc, axis=0), offs_n.to(tl.int64), offs_n, mask_n, out, partial, locks, bias, pid_n, split,
                SPLITS, N, HAS_BIAS)


@triton.jit
def _dequant_kernel(w0, w1, w2, out, N, K, ROW_BYTES, FORMAT: tl.constexpr, GROUP: tl.constexpr,
                    BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[n, k] = w[n, k] for one [BLOCK_K, BLOCK_N] tile, in out's dtype."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    k0 = pid_k * BLOCK_K
    wt = _decode_tile(w0, w1, w2, k0, offs_n, mask_n, N, ROW_BYTES, FORMAT, GROUP, BITS, BLOCK_K, BLOCK_N)
    dest = out + offs_n[None, :].to(tl.int64) * K + (k0 + tl.arange(0, BLOCK_K))[:, None]
    tl.store(dest, wt.to(out.dtype.element_ty), mask=mask_n[None, :])


@functools.lru_cache(maxsize=8)
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


@dataclass(frozen=True)
class _Operands:
    """A weight as the kernels take it: w0, w1, w2 (qweight, scales, zeros or minimums; GGUF: the blocks thrice),
    its format id, bits per packed value (0: GGUF blocks), group, the tile kernels' inputs per step (a divisor
    of K) and bytes per row of blocks (0: packed integers)."""

    w0: Tensor
    w1: Tensor
    w2: Tensor
    fmt: int
    bits: int
    group: int
    block_k: int
    row_bytes: int


def _operands(w: Int4Weight | Int8Weight | GGUFWeight) -> _Operands:
    if isinstance(w, Int4Weight):
        fmt = ZEROS_FORMAT if w.mins is None else MINS_FORMAT
        return _Operands(w.qweight, w.scales, w.offsets, fmt, 4, w.group_size, min(w.group_size, 128), 0)
    if isinstance(w, Int8Weight):
        g, k = w.group_size, w.shape[1]
        step = max(g, INT8_TILE_K)  # a group (16: two) per step
        fmt, offsets = (SCALES_FORMAT, w.scales) if w.mins is None else (MINS_FORMAT, w.mins)
        return _Operands(w.qweight, w.scales, offsets, fmt, 8, g, step if k % step == 0 else g, 0)
    return _Operands(w.blocks, w.blocks, w.blocks, w.qtype, 0, 1, _GGUF_BLOCK_K[w.qtype], w.blocks.shape[1])


def dequantize_triton(w: Int4Weight | Int8Weight | GGUFWeight, dtype: torch.dtype) -> Tensor:
    """The [N, K] matrix of `w` in `dtype` (an Int4Weight's K in its stored order)."""
    n, k = w.shape
    op = _operands(w)
    out = torch.empty(n, k, dtype=dtype, device=op.w0.device)
    block_n = 64
    _dequant_kernel[(triton.cdiv(n, block_n), k // op.block_k)](op.w0, op.w1, op.w2, out, n, k, op.row_bytes,
                                                                FORMAT=op.fmt, GROUP=op.group, BITS=op.bits,
                                                                BLOCK_N=block_n, BLOCK_K=op.block_k)
    return out


def _row_block(m: int, gemv1: bool) -> int:
    """Rows per program: 1 for the integer GEMV, 1 or 2 for the broadcast product, else enough (16 to 64) for
    the tensor cores, the weight decoded once per 64 rows rather than once per 16."""
    if gemv1 or m <= 2:
        return max(m, 1)
    return min(max(triton.next_power_of_2(m), 16), 64)


def dequant_matmul_triton(x: Tensor, w: Int4Weight | Int8Weight | GGUFWeight, bias: Tensor | None = None) -> Tensor:
    """x @ w.T (+ bias) in x's dtype, `w` decoded on the fly (see `quant_linear_reference`)."""
    n, k = w.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if isinstance(w, Int4Weight) and w.perm is not None:
        x2 = x2.index_select(1, w.perm)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if m >= DENSE_FROM_ROWS:
        return F.linear(x2, dequantize_triton(w, x.dtype), bias).reshape(*lead, n)
    op = _operands(w)
    gemv1 = op.bits > 0 and m == 1
    if gemv1 and not x2.is_contiguous():
        x2 = x2.contiguous()
    block_m = _row_block(m, gemv1)
    per_sm = GEMV1_PROGRAMS_PER_SM if gemv1 else TC_PROGRAMS_PER_SM if block_m <= 16 else TC_PROGRAMS_PER_SM_64
    block_n = GEMV1_BLOCK_N if gemv1 else (TC_BLOCK_N if block_m >= 16 else 32)
    # the GEMV's last step of a slice may be partial (masked)
    block_k = max(GEMV1_WORDS * 32 // op.bits, op.group) if gemv1 else op.block_k
    m_tiles, n_tiles = triton.cdiv(max(m, 1), block_m), triton.cdiv(n, block_n)
    steps = triton.cdiv(k, block_k)
    splits = max(1, min(steps, (per_sm * _num_sms(x.device)) // (m_tiles * n_tiles)))
    k_per_split = triton.cdiv(steps, splits) * block_k
    splits = triton.cdiv(k, k_per_split)
    locks = w.locks
    if splits > 1 and m_tiles * n_tiles > locks.numel():  # more tiles than counters (not with these blocks)
        splits, k_per_split = 1, k
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    partial = torch.empty(splits, m, n, dtype=torch.float32, device=x.device) if splits > 1 else out
    if m > 0:
        grid = (m_tiles, n_tiles, splits)
        has_bias = bias is not None
        b = bias if bias is not None else out
        if gemv1:
            _int_gemv1_kernel[grid](x2, op.w0, op.w1, op.w2, out, partial, locks, b, n, k, k_per_split, splits,
                                    FORMAT=op.fmt, GROUP=op.group, BITS=op.bits, BLOCK_N=block_n, BLOCK_K=block_k,
                                    HAS_BIAS=has_bias, num_warps=GEMV1_WARPS)
        else:
            _dequant_matmul_kernel[grid](x2, op.w0, op.w1, op.w2, out, partial, locks, b, m, n, k, x2.stride(0),
                                         op.row_bytes, k_per_split, splits, FORMAT=op.fmt, GROUP=op.group,
                                         BITS=op.bits, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                                         HAS_BIAS=has_bias, num_warps=TC_WARPS if block_m >= 16 else 4)
    return out.reshape(*lead, n)


__all__ = ["DENSE_FROM_ROWS", "dequant_matmul_triton", "dequantize_triton"]
