"""Batched torch attention over the slot pool: the CPU path of the engine (the GPU runs the Triton kernels).

Same maths and signatures as `attention_ref` (whose per-request loops stay the readable definition the tests
compare against), but one padded gather per layer and one fused attention call instead of a Python loop over
requests: requests are padded to the longest KV length and masked. An extend's index tensors and masks are the
same for every layer of a forward: `plan_extend` works them out once and `extend_attention_torch` takes the plan.
An FP8 cache (`kv_quant`) is dequantized by its k_scale / v_scale as its rows are gathered.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from radixgen.kernels import cpu_features
from radixgen.kernels.kv_quant import dequantize_kv, kv_scales_for

KVScales = tuple[Tensor, Tensor]  # (k_scale, v_scale) [Hkv] fp32 of an FP8 cache

QUERY_BLOCK = 512  # a long extend attends in blocks of queries, each over the keys its last query can see
# Rows whose first keys are the same slots (a prefix shared through the radix cache) read those keys once, as
# one attention of all the rows' queries, merged with each row's own keys by log-sum-exp (cascade).
SHARED_PREFIX_MIN = 64


def _gather_kv(k_cache: Tensor, v_cache: Tensor, slots: Tensor, dtype: torch.dtype,
               scales: KVScales | None = None) -> tuple[Tensor, Tensor]:
    """K and V rows of slots [B, L] as [B, Hkv, L, D] head-major views of one gathered [B, L, Hkv, D] copy each
    (`index_select`, not `k_cache[slots]`, which is slower for this row gather on the CPU), in `dtype`:
    dequantized by `scales` from an FP8 cache."""
    b, length = slots.shape
    flat = slots.reshape(-1)
    k_scale, v_scale = scales if scales is not None else (None, None)
    k = dequantize_kv(k_cache.index_select(0, flat), k_scale, dtype).view(b, length, *k_cache.shape[1:])
    v = dequantize_kv(v_cache.index_select(0, flat), v_scale, dtype).view(b, length, *v_cache.shape[1:])
    return k.transpose(1, 2), v.transpose(1, 2)


def _padded_attention(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, kv_len: Tensor, sm_scale: float,
                      sliding_window: int | None, mask: Tensor | None = None) -> Tensor:
    """q [B, E, Hq, D] at positions q_pos [B, E] over k, v [B, Hkv, L, D] (kv_len [B] valid) -> [B, E, Hq, D].

    One `scaled_dot_product_attention` call (torch's fused CPU flash kernel: fp32 accumulation and softmax for
    bf16 inputs, like the Triton kernels), or for a decode step's rows on an AMD CPU `_few_rows_attention`'s two
    matmuls, with GQA folded into the query rows: the G query heads sharing a KV
    head become G x E query rows of that head, so K and V are never copied or repeated per query head. Rows of
    padding (past a request's extend) may come out as NaN; callers drop them. `mask`: `_padded_mask`'s result
    for these arguments when the caller already has it, boolean or (better: the fused kernel turns a boolean
    mask into this at every call) `_additive`."""
    b, e, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    rows = q.view(b, e, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * e, d)  # row g * E + i
    if mask is None:
        mask = _padded_mask(q_pos, kv_len, k.shape[2], g, sliding_window)
    if _few_rows(q):
        out = _few_rows_attention(rows, k, v, mask, sm_scale, kv_len)
    else:
        out = F.scaled_dot_product_attention(rows, k, v, attn_mask=mask, scale=sm_scale)  # [B, Hkv, G*E, D]
    return out.view(b, hkv, g, e, d).permute(0, 3, 1, 2, 4).reshape(b, e, hq, d)


def _few_rows_attention(rows: Tensor, k: Tensor, v: Tensor, mask: Tensor, sm_scale: float,
                        kv_len: Tensor) -> Tensor:
    """Attention [B, Hkv, G, D] of a few fp32 query rows per head (rows [B, Hkv, G, D], a decode step's) over
    k, v [B, Hkv, L, D] (kv_len [B] valid) as two batched matmuls, keys as the tall operand: K [L, D] @ Q^T [D, G]
    streams each head's keys once: faster on AMD CPUs than the fused kernel, whose per-block setup a G-row block
    cannot hide (docs/performance-notes.md); the cascade's short own-keys call does not gain, so it stays on the
    fused kernel. A request that sees no key (kv_len 0: a padding row, a
    buffer row no request holds) gets zeros, as from the fused kernel, not a softmax's NaN: a padding row writes
    its K/V to the reserved slot, which other rows read under their mask."""
    if mask.dtype == torch.bool:
        mask = _additive(mask, rows.dtype)
    scores = torch.matmul(k, (rows * sm_scale).transpose(-1, -2)).transpose(-1, -2) + mask  # [B, Hkv, G, L]
    out = torch.matmul(torch.softmax(scores, -1), v)
    return out.masked_fill_((kv_len == 0).view(-1, 1, 1, 1), 0.0)


def _few_rows(q: Tensor) -> bool:
    """Whether `_few_rows_attention` serves these queries [B, E, Hq, D]: one per request (a decode step), fp32,
    on a CPU where the matmuls are faster than the fused kernel (`cpu_features`)."""
    return (q.shape[1] == 1 and q.dtype == torch.float32 and q.device.type == "cpu"
            and cpu_features.decode_attention_as_matmuls())


def _padded_mask(q_pos: Tensor, kv_len: Tensor, length: int, g: int, sliding_window: int | None) -> Tensor:
    """[B, 1, G*E, L] bool, True where query row g * E + i of request b may see key j: causal, within the
    request's length and its sliding window, the same for every KV head."""
    kv_pos = torch.arange(length, device=q_pos.device)
    mask = (kv_pos[None, None, :] <= q_pos[:, :, None]) & (kv_pos[None, None, :] < kv_len[:, None, None])
    if sliding_window is not None:
        mask &= kv_pos[None, None, :] > (q_pos[:, :, None] - sliding_window)
    return mask[:, None] if g == 1 else mask.repeat(1, g, 1)[:, None]


def _additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean "may see" mask as the additive one the fused kernel works with: 0 where True, -inf elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


@functools.lru_cache(maxsize=1)
def _flash_lse_available() -> bool:
    """Whether torch's CPU flash attention op, which also returns the log-sum-exp, runs here (it is internal)."""
    try:
        q = torch.ones(1, 1, 2, 4)
        _, lse = _flash_with_lse(q, q, q, torch.zeros(1, 1, 1, 2), 1.0)
        return tuple(lse.shape) == (1, 1, 2)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def _flash_with_lse(rows: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, sm_scale: float) -> tuple[Tensor, Tensor]:
    """Attention output [..., M, D] and the natural-log log-sum-exp of its scaled scores [..., M]; `mask` is
    additive, in the query dtype."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(rows, k, v, 0.0, False, attn_mask=mask,
                                                                      scale=sm_scale)


def _shared_prefix_len(slots: Tensor, limit: int) -> int:
    """Leading columns of slots [B, L], at most `limit`, that every row has in common."""
    if slots.shape[0] < 2 or limit <= 0:
        return 0
    differs = torch.nonzero((slots[:, :limit] != slots[:1, :limit]).any(0))
    return int(differs[0]) if len(differs) else limit


def _cascade_own_mask(q_pos: Tensor, kv_len: Tensor, shared: int, length: int, g: int,
                      dtype: torch.dtype) -> Tensor:
    """The additive mask [B, 1, G*E, length] of `_cascade_attention`'s second call: the row's own keys, from
    position `shared` on, that query row g * E + i may see."""
    own = shared + torch.arange(length, device=q_pos.device)
    hidden = (own[None, None, :] > q_pos[:, :, None]) | (own[None, None, :] >= kv_len[:, None, None])  # [B, E, L-P]
    mask = torch.zeros(q_pos.shape[0], 1, g * q_pos.shape[1], length, dtype=dtype, device=q_pos.device)
    return mask.masked_fill_(hidden.repeat(1, g, 1)[:, None], float("-inf"))


def _cascade_attention(q: Tensor, ks: Tensor, vs: Tensor, kt: Tensor, vt: Tensor, q_pos: Tensor, kv_len: Tensor,
                       shared: int, sm_scale: float, own_mask: Tensor | None = None) -> Tensor:
    """Like `_padded_attention` (q [B, E, Hq, D] at q_pos [B, E] -> [B, E, Hq, D]) for rows whose first `shared`
    keys are the same and visible to every query: those keys (ks, vs [1, Hkv, P, D]) are attended by all
    B x G x E query rows of each KV head in one call, each row's own keys (kt, vt [B, Hkv, L - P, D], from
    position `shared` on) in a second, padded call, and the two partial outputs merge by their log-sum-exps.
    `own_mask`: `_cascade_own_mask`'s result for these arguments, when the caller already has it."""
    b, e, hq, d = q.shape
    hkv = ks.shape[1]
    g = hq // hkv
    rows = q.view(b, e, hkv, g, d).permute(0, 2, 3, 1, 4)  # [B, Hkv, G, E, D]: row g * E + i of a head
    out_s, lse_s = _flash_with_lse(rows.transpose(0, 1).reshape(1, hkv, b * g * e, d), ks, vs, None, sm_scale)
    if own_mask is None:
        own_mask = _cascade_own_mask(q_pos, kv_len, shared, kt.shape[2], g, q.dtype)
    out_t, lse_t = _flash_with_lse(rows.reshape(b, hkv, g * e, d), kt, vt, own_mask, sm_scale)
    out_s = out_s.view(hkv, b, g * e, d).transpose(0, 1).float()
    lse_s = lse_s.view(hkv, b, g * e).transpose(0, 1).float()
    top = torch.maximum(lse_s, lse_t.float())
    w_s = torch.exp(lse_s - top)[..., None]
    w_t = torch.exp(lse_t.float() - top)[..., None]
    out = (out_s * w_s + out_t.float() * w_t) / (w_s + w_t)  # [B, Hkv, G*E, D]
    return out.view(b, hkv, g, e, d).permute(0, 3, 1, 2, 4).reshape(b, e, hq, d).to(q.dtype)


def _cascade_from_pool(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, q_pos: Tensor, kv_len: Tensor,
                       shared: int, sm_scale: float, own_mask: Tensor | None = None,
                       scales: KVScales | None = None) -> Tensor:
    """`_cascade_attention` with the shared keys (once) and each row's own keys gathered from the pool."""
    ks, vs = _gather_kv(k_cache, v_cache, slots[:1, :shared], q.dtype, scales)  # [1, Hkv, P, D]
    kt, vt = _gather_kv(k_cache, v_cache, slots[:, shared:], q.dtype, scales)  # [B, Hkv, L - P, D]
    return _cascade_attention(q, ks, vs, kt, vt, q_pos, kv_len, shared, sm_scale, own_mask)


def _use_cascade(slots: Tensor, limit: int, sliding_window: int | None) -> int:
    """The shared prefix to read once (0: take the padded path). CPU only: the op returning the log-sum-exp is
    the CPU flash kernel (CUDA tensors reach this file only for head dims the Triton kernels do not take)."""
    if slots.device.type != "cpu" or sliding_window is not None or not _flash_lse_available():
        return 0
    shared = _shared_prefix_len(slots, limit)
    return shared if shared >= SHARED_PREFIX_MIN else 0


def cascade_prefix_len(req_to_token: Tensor, req_pool_indices: Tensor, seq_lens: Tensor) -> int:
    """Leading slots a decode batch's requests share that the cascade path reads once (0: none worth it)."""
    seq = seq_lens.long()
    slots = req_to_token[req_pool_indices, : int(seq.max())].long()
    return _use_cascade(slots, int(seq.min()) - 1, None)


def decode_attention_torch(q: Tensor, k_cache: Tensor, v_cache: Tensor, req_to_token: Tensor,
                           req_pool_indices: Tensor, seq_lens: Tensor, sm_scale: float,
                           sliding_window: int | None = None, max_seq_len: int | None = None,
                           k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> Tensor:
    """q [B, Hq, D], the new token of request b at position seq_lens[b] - 1 -> o [B, Hq, D], each request's keys
    gathered from the pool (`decode_copy_torch` reads them from copies carried across steps instead)."""
    scales = kv_scales_for(k_cache, k_scale, v_scale)
    seq = seq_lens.long()
    length = int(max_seq_len) if max_seq_len is not None else int(seq_lens.max())
    slots = req_to_token[req_pool_indices, :length].long()
    shared = _use_cascade(slots, int(seq.min()) - 1, sliding_window)  # each row keeps its own last key
    if shared:
        return _cascade_from_pool(q[:, None], k_cache, v_cache, slots, (seq - 1)[:, None], seq, shared,
                                  sm_scale, scales=scales)[:, 0]
    k, v = _gather_kv(k_cache, v_cache, slots, q.dtype, scales)
    return _padded_attention(q[:, None], k, v, (seq - 1)[:, None], seq, sm_scale, sliding_window)[:, 0]


MASK_CACHE_BYTES = 64 << 20  # an extend's masks are kept for every layer of the forward up to this size


class QueryBlock(NamedTuple):
    """Queries [start, end) of every padded request, over the first `visible` keys (the most any of them sees)."""

    start: int
    end: int
    visible: int
    mask: Tensor | None  # the block's additive mask, or None: made at each call (over MASK_CACHE_BYTES)


@dataclass(frozen=True)
class PaddedExtend:
    """The requests extending by several tokens, padded to the longest extend."""

    rows: Tensor  # [M, E] rows of q of each request's new tokens (padding repeats a valid row)
    valid: Tensor  # [M, E] which of them are real
    seq: Tensor  # [M] lengths after the extend
    slots: Tensor  # [M, max seq] pool slots
    q_pos: Tensor  # [M, E] positions of the new tokens
    shared: int = 0  # leading slots all of them share (cascade), 0: padded path
    cascade_mask: Tensor | None = None  # with `shared`: the mask of each request's own keys
    blocks: tuple[QueryBlock, ...] = ()  # without `shared`: the query blocks


@dataclass(frozen=True)
class ExtendPlan:
    """What an extend's attention indexes with, the same for every layer of one forward (with one sliding
    window): `plan_extend` works it out once, every layer's `extend_attention_torch` reads it."""

    single: Tensor | None  # requests extending by one token (through the decode path), or None
    single_rows: Tensor | None  # their rows in q
    padded: PaddedExtend | None  # the other requests, or None


def plan_extend(req_to_token: Tensor, req_pool_indices: Tensor, prefix_lens: Tensor, extend_lens: Tensor,
                extend_start_loc: Tensor, num_tokens: int, group: int, dtype: torch.dtype,
                sliding_window: int | None) -> ExtendPlan:
    """The ExtendPlan of `extend_attention_torch`'s arguments for q [num_tokens, Hq, D] of `dtype` with `group`
    query heads per KV head."""
    ext = extend_lens.long()
    is_single = ext == 1
    single = single_rows = None
    if bool(is_single.any()):
        single = torch.nonzero(is_single).squeeze(1)
        single_rows = extend_start_loc.long()[single]
    multi = torch.nonzero(ext > 1).squeeze(1)
    if len(multi) == 0:
        return ExtendPlan(single, single_rows, None)
    e_max = int(ext[multi].max())
    pre, ext_m, start = prefix_lens.long()[multi], ext[multi], extend_start_loc.long()[multi]
    offs = torch.arange(e_max, device=ext.device)
    seq = pre + ext_m
    slots = req_to_token[req_pool_indices[multi], : int(seq.max())].long()
    q_pos = pre[:, None] + offs[None, :]
    rows = (start[:, None] + offs[None, :]).clamp(max=num_tokens - 1)
    valid = offs[None, :] < ext_m[:, None]
    shared = _use_cascade(slots, int(pre.min()), sliding_window) if e_max <= QUERY_BLOCK else 0
    if shared:
        mask = _cascade_own_mask(q_pos, seq, shared, slots.shape[1] - shared, group, dtype)
        return ExtendPlan(single, single_rows, PaddedExtend(rows, valid, seq, slots, q_pos, shared, mask))
    bounds = []
    for s in range(0, e_max, QUERY_BLOCK):  # the fused kernel computes masked scores too: skip the keys no
        e = min(s + QUERY_BLOCK, e_max)     # query of the block can see (half of a long prompt's attention)
        bounds.append((s, e, int(torch.minimum(seq, pre + e).max())))
    size = sum(len(multi) * group * (e - s) * visible for s, e, visible in bounds) * dtype.itemsize
    blocks = tuple(QueryBlock(s, e, visible, _additive(_padded_mask(q_pos[:, s:e], seq, visible, group,
                                                                    sliding_window), dtype)
                              if size <= MASK_CACHE_BYTES else None)
                   for s, e, visible in bounds)
    return ExtendPlan(single, single_rows, PaddedExtend(rows, valid, seq, slots, q_pos, blocks=blocks))


def extend_attention_torch(q: Tensor, k_cache: Tensor, v_cache: Tensor, req_to_token: Tensor,
                           req_pool_indices: Tensor, prefix_lens: Tensor, extend_lens: Tensor,
                           extend_start_loc: Tensor, sm_scale: float, sliding_window: int | None = None,
                           max_extend_len: int | None = None, plan: ExtendPlan | None = None,
                           k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> Tensor:
    """q [T, Hq, D] (request b's new tokens at rows extend_start_loc[b] + i) -> o [T, Hq, D].

    Requests are padded to the longest extend; a batch mixing one long prefill with many decodes would pad
    every decode to the prefill's length, so single-token rows go through the decode path instead. `plan`:
    `plan_extend`'s result for these arguments, which the layers of one forward share (None: worked out here).
    """
    scales = kv_scales_for(k_cache, k_scale, v_scale)
    if plan is None:
        plan = plan_extend(req_to_token, req_pool_indices, prefix_lens, extend_lens, extend_start_loc, q.shape[0],
                           q.shape[1] // k_cache.shape[1], q.dtype, sliding_window)
    out = torch.empty_like(q)
    if plan.single is not None and plan.single_rows is not None:
        out[plan.single_rows] = decode_attention_torch(q[plan.single_rows], k_cache, v_cache, req_to_token,
                                                       req_pool_indices[plan.single],
                                                       (prefix_lens.long() + 1)[plan.single], sm_scale,
                                                       sliding_window, k_scale=k_scale, v_scale=v_scale)
    pad = plan.padded
    if pad is None:
        return out
    qp = q[pad.rows]  # [M, E, Hq, D]
    if pad.shared:  # a prefix cached for all these requests: every new token sees all of it
        o = _cascade_from_pool(qp, k_cache, v_cache, pad.slots, pad.q_pos, pad.seq, pad.shared, sm_scale,
                               pad.cascade_mask, scales)
    else:
        k, v = _gather_kv(k_cache, v_cache, pad.slots, q.dtype, scales)
        o = torch.empty_like(qp)
        for s, e, visible, mask in pad.blocks:
            o[:, s:e] = _padded_attention(qp[:, s:e], k[:, :, :visible], v[:, :, :visible], pad.q_pos[:, s:e],
                                          pad.seq, sm_scale, sliding_window, mask)
    out[pad.rows[pad.valid]] = o[pad.valid]
    return out
