"""Batched torch attention over the slot pool: the CPU path of the engine (the GPU runs the Triton kernels).

Same maths and signatures as `attention_ref` (whose per-request loops stay the readable definition the tests
compare against), but one padded gather per layer and one fused attention call instead of a Python loop over
requests: requests are padded to the longest KV length and masked.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from radixgen.kernels import linear_onednn

QUERY_BLOCK = 512  # a long extend attends in blocks of queries, each over the keys its last query can see
# Rows whose first keys are the same slots (a prefix shared through the radix cache) read those keys once, as
# one attention of all the rows' queries, merged with each row's own keys by log-sum-exp (cascade).
SHARED_PREFIX_MIN = 64


def _gather_kv(k_cache: Tensor, v_cache: Tensor, slots: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """K and V rows of slots [B, L] as [B, Hkv, L, D] head-major views of one gathered [B, L, Hkv, D] copy each
    (`index_select`, not `k_cache[slots]`: 2-5x faster for this row gather on the CPU)."""
    b, length = slots.shape
    flat = slots.reshape(-1)
    k = k_cache.index_select(0, flat).view(b, length, *k_cache.shape[1:]).transpose(1, 2).to(dtype)
    v = v_cache.index_select(0, flat).view(b, length, *v_cache.shape[1:]).transpose(1, 2).to(dtype)
    return k, v


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
    streams each head's keys once. Whole decode steps on the 2-core AMD VM ran 1.03-1.14x faster than through
    the fused kernel, whose per-block setup a G-row block cannot hide (docs/kernels.md); the cascade's short
    own-keys call does not gain, so it stays on the fused kernel. A request that sees no key (kv_len 0: a padding row, a
    buffer row no request holds) gets zeros, as from the fused kernel, not a softmax's NaN: a padding row writes
    its K/V to the reserved slot, which other rows read under their mask."""
    if mask.dtype == torch.bool:
        mask = _additive(mask, rows.dtype)
    scores = torch.matmul(k, (rows * sm_scale).transpose(-1, -2)).transpose(-1, -2) + mask  # [B, Hkv, G, L]
    out = torch.matmul(torch.softmax(scores, -1), v)
    return out.masked_fill_((kv_len == 0).view(-1, 1, 1, 1), 0.0)


def _few_rows(q: Tensor) -> bool:
    """Whether `_few_rows_attention` serves these queries [B, E, Hq, D]: one per request (a decode step), fp32,
    on a CPU where the matmuls measured faster than the fused kernel."""
    return q.shape[1] == 1 and q.dtype == torch.float32 and q.device.type == "cpu" and _decode_as_matmuls()


@functools.lru_cache(maxsize=1)
def _decode_as_matmuls() -> bool:
    """AMD processors (where MKL also takes its slow path, kernels/linear_onednn.py): there the attention as
    matmuls measured 1.2-1.9x the fused kernel's speed at 20 x 700, 4 x 1,000 and 1 x 2,000 (0.9-1.15x at
    20 x 300); on the H200 host's Intel Xeon 0.5-1.4x, so the fused kernel stays there."""
    return linear_onednn.cpu_vendor() in linear_onednn.AMD_VENDORS


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
                       shared: int, sm_scale: float, own_mask: Tensor | None = None) -> Tensor:
    """`_cascade_attention` with the shared keys (once) and each row's own keys gathered from the pool."""
    ks, vs = _gather_kv(k_cache, v_cache, slots[:1, :shared], q.dtype)  # [1, Hkv, P, D]
    kt, vt = _gather_kv(k_cache, v_cache, slots[:, shared:], q.dtype)  # [B, Hkv, L - P, D]
    return _cascade_attention(q, ks, vs, kt, vt, q_pos, kv_len, shared, sm_scale, own_mask)


def _use_cascade(slots: Tensor, limit: int, sliding_window: int | None) -> int:
    """The shared prefix to read once (0: take the padded path). CPU only: the op returning the log-sum-exp is
    the CPU flash kernel (CUDA tensors reach this file only for head dims the Triton kernels do not take)."""
    if slots.device.type != "cpu" or sliding_window is not None or not _flash_lse_available():
        return 0
    shared = _shared_prefix_len(slots, limit)
    return shared if shared >= SHARED_PREFIX_MIN else 0


@dataclass
class DecodeKVCopy:
    """One layer's keys and values of the decode requests as padded rows the caller keeps from one step to the
    next (on the CPU the gather from the slot pool costs about as much as the attention that reads it): a step
    fills only the rows of requests new to the copies and writes every request's newest key and value. Buffer
    row r, column j holds position `shared + j` of the request the caller assigned to row r."""

    k: Tensor  # [R, Hkv, capacity, D], in the query dtype: each head's keys of a request are one run of memory
    v: Tensor
    rows: Tensor  # [B] int64: buffer row of decode request b
    fill: Tensor  # [F] int64: the requests b whose rows are (re)filled from the pool before this step's append
    fill_from: Tensor  # [F] int64: the first position each of them fills (what their rows hold already ends there)
    num_rows: int  # attention runs over buffer rows [0, num_rows); rows no request holds are fully masked
    shared: int = 0  # leading slots every request has in common: read from the pool once per step (cascade)
    in_order: bool = False  # rows == arange(B) and num_rows == B: no scatter of queries or gather of outputs
    # Scratch the layers of one forward share (the same dict in every layer's copy): index tensors the first
    # layer works out. A caller that builds one copy per call passes nothing.
    step: dict = field(default_factory=dict)


def _decode_from_copy(q: Tensor, k_cache: Tensor, v_cache: Tensor, req_to_token: Tensor, req_pool_indices: Tensor,
                      seq: Tensor, copy: DecodeKVCopy, sm_scale: float, sliding_window: int | None) -> Tensor:
    """`decode_attention_torch` reading each request's own keys from `copy`, brought up to date first."""
    p, rows = copy.shared, copy.rows
    idx = copy.step
    if "newest" not in idx:  # the first layer of the forward works out what every layer indexes with
        _index_step(idx, req_to_token, req_pool_indices, seq, copy)
    if "fill_slots" in idx:
        shape = (*idx["fill_rows"].shape, *k_cache.shape[1:])
        copy.k.permute(0, 2, 1, 3)[idx["fill_rows"], idx["fill_cols"]] = (
            k_cache.index_select(0, idx["fill_slots"]).view(shape).to(copy.k.dtype))
        copy.v.permute(0, 2, 1, 3)[idx["fill_rows"], idx["fill_cols"]] = (
            v_cache.index_select(0, idx["fill_slots"]).view(shape).to(copy.v.dtype))
    newest = idx["newest"]
    copy.k.permute(0, 2, 1, 3)[rows, idx["newest_cols"]] = k_cache.index_select(0, newest).to(copy.k.dtype)
    copy.v.permute(0, 2, 1, 3)[rows, idx["newest_cols"]] = v_cache.index_select(0, newest).to(copy.v.dtype)
    length = idx["length"]
    kt = copy.k[: copy.num_rows, :, : length - p]  # [R', Hkv, L - P, D] views: no copy
    vt = copy.v[: copy.num_rows, :, : length - p]
    qr, seq_r = q, idx["seq_rows"]
    if not copy.in_order:  # queries into their rows; rows no request holds get length 0 (every key masked)
        qr = q.new_zeros(copy.num_rows, *q.shape[1:])
        qr[rows] = q
    q_pos = (seq_r - 1)[:, None]
    if p:
        if "shared_slots" not in idx:
            idx["shared_slots"] = req_to_token[req_pool_indices[:1], :p].long()
            idx["cascade_mask"] = _cascade_own_mask(q_pos, seq_r, p, length - p, q.shape[1] // k_cache.shape[1],
                                                    q.dtype)
        ks, vs = _gather_kv(k_cache, v_cache, idx["shared_slots"], q.dtype)
        out = _cascade_attention(qr[:, None], ks, vs, kt, vt, q_pos, seq_r, p, sm_scale, idx["cascade_mask"])[:, 0]
    else:
        key = ("mask", sliding_window)  # the same for every layer with this window
        if key not in idx:
            idx[key] = _additive(_padded_mask(q_pos, seq_r, length - p, q.shape[1] // k_cache.shape[1],
                                              sliding_window), q.dtype)
        out = _padded_attention(qr[:, None], kt, vt, q_pos, seq_r, sm_scale, sliding_window, idx[key])[:, 0]
    return out if copy.in_order else out[rows]


def _index_step(idx: dict, req_to_token: Tensor, req_pool_indices: Tensor, seq: Tensor, copy: DecodeKVCopy) -> None:
    """The index tensors of one forward's copy updates, the same for every layer: the pool slots and buffer
    cells of the fills (positions fill_from .. seq - 1 of each filled request; shorter ranges repeat their last
    position, the same slot written twice with the same values), each request's newest slot and cell, and each
    buffer row's length (0 for rows no request holds)."""
    p, rows = copy.shared, copy.rows
    if len(copy.fill):
        f, start = copy.fill, copy.fill_from
        end = seq[f]
        n = int((end - start).max())
        pos = torch.minimum(start[:, None] + torch.arange(n, device=seq.device), end[:, None] - 1)  # [F, n]
        idx["fill_slots"] = req_to_token[req_pool_indices[f][:, None], pos].long().reshape(-1)
        idx["fill_rows"], idx["fill_cols"] = rows[f][:, None].expand(-1, n), pos - p
    idx["newest"] = req_to_token[req_pool_indices, seq - 1].long()
    idx["newest_cols"] = seq - 1 - p
    idx["length"] = int(seq.max())
    if copy.in_order:
        idx["seq_rows"] = seq
    else:
        idx["seq_rows"] = seq.new_zeros(copy.num_rows)
        idx["seq_rows"][rows] = seq


def cascade_prefix_len(req_to_token: Tensor, req_pool_indices: Tensor, seq_lens: Tensor) -> int:
    """Leading slots a decode batch's requests share that the cascade path reads once (0: none worth it)."""
    seq = seq_lens.long()
    slots = req_to_token[req_pool_indices, : int(seq.max())].long()
    return _use_cascade(slots, int(seq.min()) - 1, None)


def decode_attention_torch(q: Tensor, k_cache: Tensor, v_cache: Tensor, req_to_token: Tensor,
                           req_pool_indices: Tensor, seq_lens: Tensor, sm_scale: float,
                           sliding_window: int | None = None, max_seq_len: int | None = None,
                           kv_copy: DecodeKVCopy | None = None) -> Tensor:
    """q [B, Hq, D], the new token of request b at position seq_lens[b] - 1 -> o [B, Hq, D]. With `kv_copy`, each
    request's own keys come from (and are first written to) that copy instead of a gather from the pool."""
    seq = seq_lens.long()
    if kv_copy is not None:
        return _decode_from_copy(q, k_cache, v_cache, req_to_token, req_pool_indices, seq, kv_copy, sm_scale,
                                 sliding_window)
    length = int(max_seq_len) if max_seq_len is not None else int(seq_lens.max())
    slots = req_to_token[req_pool_indices, :length].long()
    shared = _use_cascade(slots, int(seq.min()) - 1, sliding_window)  # each row keeps its own last key
    if shared:
        return _cascade_from_pool(q[:, None], k_cache, v_cache, slots, (seq - 1)[:, None], seq, shared,
                                  sm_scale)[:, 0]
    k, v = _gather_kv(k_cache, v_cache, slots, q.dtype)
    return _padded_attention(q[:, None], k, v, (seq - 1)[:, None], seq, sm_scale, sliding_window)[:, 0]


MASK_CACHE_BYTES = 64 << 20  # an extend's masks are kept for every layer of the forward up to this size


@dataclass
class _ExtendPlan:
    """What an extend's attention indexes with, the same for every layer of one forward: worked out by the first
    layer when the caller passes a scratch dict (`extend_attention_torch`), reused by the others."""

    single: Tensor | None  # requests extending by one token (through the decode path), or None
    single_rows: Tensor | None  # their rows in q
    multi: Tensor | None  # the other requests, or None
    rows: Tensor | None = None  # [M, E] rows of q of each request's new tokens (padding repeats a valid row)
    valid: Tensor | None = None  # [M, E] which of them are real
    seq: Tensor | None = None  # [M] lengths after the extend
    slots: Tensor | None = None  # [M, max seq] pool slots
    q_pos: Tensor | None = None  # [M, E] positions of the new tokens
    shared: int = 0  # leading slots all of them share (cascade), 0: padded path
    cascade_mask: Tensor | None = None  # with `shared`: the mask of each request's own keys
    blocks: list = field(default_factory=list)  # (start, end, visible keys, additive mask or None) per block


def _plan_extend(q: Tensor, k_cache: Tensor, req_to_token: Tensor, req_pool_indices: Tensor, prefix_lens: Tensor,
                 extend_lens: Tensor, extend_start_loc: Tensor, sliding_window: int | None) -> _ExtendPlan:
    ext = extend_lens.long()
    is_single = ext == 1
    single = single_rows = None
    if bool(is_single.any()):
        single = torch.nonzero(is_single).squeeze(1)
        single_rows = extend_start_loc.long()[single]
    multi = torch.nonzero(ext > 1).squeeze(1)
    if len(multi) == 0:
        return _ExtendPlan(single, single_rows, None)
    e_max = int(ext[multi].max())
    pre, ext_m, start = prefix_lens.long()[multi], ext[multi], extend_start_loc.long()[multi]
    offs = torch.arange(e_max, device=q.device)
    seq = pre + ext_m
    plan = _ExtendPlan(single, single_rows, multi,
                       rows=(start[:, None] + offs[None, :]).clamp(max=q.shape[0] - 1),
                       valid=offs[None, :] < ext_m[:, None], seq=seq,
                       slots=req_to_token[req_pool_indices[multi], : int(seq.max())].long(),
                       q_pos=pre[:, None] + offs[None, :])
    plan.shared = _use_cascade(plan.slots, int(pre.min()), sliding_window) if e_max <= QUERY_BLOCK else 0
    g = q.shape[1] // k_cache.shape[1]
    if plan.shared:
        plan.cascade_mask = _cascade_own_mask(plan.q_pos, seq, plan.shared, plan.slots.shape[1] - plan.shared, g,
                                              q.dtype)
        return plan
    bounds = []
    for s in range(0, e_max, QUERY_BLOCK):  # the fused kernel computes masked scores too: skip the keys no
        e = min(s + QUERY_BLOCK, e_max)     # query of the block can see (half of a long prompt's attention)
        bounds.append((s, e, int(torch.minimum(seq, pre + e).max())))
    size = sum(len(multi) * g * (e - s) * visible for s, e, visible in bounds) * q.element_size()
    for s, e, visible in bounds:
        mask = None
        if size <= MASK_CACHE_BYTES:
            mask = _additive(_padded_mask(plan.q_pos[:, s:e], seq, visible, g, sliding_window), q.dtype)
        plan.blocks.append((s, e, visible, mask))
    return plan


def extend_attention_torch(q: Tensor, k_cache: Tensor, v_cache: Tensor, req_to_token: Tensor,
                           req_pool_indices: Tensor, prefix_lens: Tensor, extend_lens: Tensor,
                           extend_start_loc: Tensor, sm_scale: float, sliding_window: int | None = None,
                           max_extend_len: int | None = None, scratch: dict | None = None) -> Tensor:
    """q [T, Hq, D] (request b's new tokens at rows extend_start_loc[b] + i) -> o [T, Hq, D].

    Requests are padded to the longest extend; a batch mixing one long prefill with many decodes would pad
    every decode to the prefill's length, so single-token rows go through the decode path instead. `scratch`:
    a dict the layers of one forward share (every argument but q and the caches the same): the first layer
    leaves there the index tensors and masks (`_ExtendPlan`) the others reuse.
    """
    key = ("extend", sliding_window)
    plan = scratch.get(key) if scratch is not None else None
    if plan is None:
        plan = _plan_extend(q, k_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens, extend_start_loc,
                            sliding_window)
        if scratch is not None:
            scratch[key] = plan
    out = torch.empty_like(q)
    if plan.single is not None:
        out[plan.single_rows] = decode_attention_torch(q[plan.single_rows], k_cache, v_cache, req_to_token,
                                                       req_pool_indices[plan.single],
                                                       (prefix_lens.long() + 1)[plan.single], sm_scale,
                                                       sliding_window)
    if plan.multi is None:
        return out
    qp = q[plan.rows]  # [M, E, Hq, D]
    if plan.shared:  # a prefix cached for all these requests: every new token sees all of it
        o = _cascade_from_pool(qp, k_cache, v_cache, plan.slots, plan.q_pos, plan.seq, plan.shared, sm_scale,
                               plan.cascade_mask)
    else:
        k, v = _gather_kv(k_cache, v_cache, plan.slots, q.dtype)
        o = torch.empty_like(qp)
        for s, e, visible, mask in plan.blocks:
            o[:, s:e] = _padded_attention(qp[:, s:e], k[:, :, :visible], v[:, :, :visible], plan.q_pos[:, s:e],
                                          plan.seq, sm_scale, sliding_window, mask)
    out[plan.rows[plan.valid]] = o[plan.valid]
    return out
