"""Batched torch attention over the slot pool: the CPU path of the engine (the GPU runs the Triton kernels).

Same maths and signatures as `attention_ref` (whose per-request loops stay the readable definition the tests
compare against), but one padded gather per layer and one pair of batched matmuls per KV head instead of a
Python loop over requests: requests are padded to the longest KV length and masked.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _padded_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, q_pos: Tensor, kv_len: Tensor,
                      sm_scale: float, sliding_window: int | None) -> Tensor:
    """q [B, E, Hq, D] at positions q_pos [B, E]; slots [B, L]; kv_len [B] valid KV per row -> [B, E, Hq, D].

    One batched matmul pair per KV head, reading that head's K and V straight out of the gathered [B, L, Hkv, D]
    rows (a matrix with row stride Hkv * D, which BLAS takes as is), with the G query heads of its group and the
    E queries stacked as rows. Batching over the heads as well would need K and V copied head-major first, and
    at batch 20 with 700-token contexts those copies cost more than the gather itself."""
    b, e, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    length = slots.shape[1]
    k = k_cache[slots].float()  # [B, L, Hkv, D]
    v = v_cache[slots].float()
    qf = q.float().view(b, e, hkv, g, d)
    kv_pos = torch.arange(length, device=q.device)
    mask = (kv_pos[None, None, :] <= q_pos[:, :, None]) & (kv_pos[None, None, :] < kv_len[:, None, None])
    if sliding_window is not None:
        mask &= kv_pos[None, None, :] > (q_pos[:, :, None] - sliding_window)
    hidden = ~mask[:, None]  # [B, 1, E, L] over the [B, G, E, L] scores of one head
    out = torch.empty(b, e, hkv, g, d, dtype=torch.float32, device=q.device)
    for h in range(hkv):
        qh = qf[:, :, h].transpose(1, 2).reshape(b, g * e, d)  # [B, G*E, D]
        scores = torch.bmm(qh, k[:, :, h].transpose(1, 2)).view(b, g, e, length).mul_(sm_scale)
        scores.masked_fill_(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # fully masked (padding) rows give 0
        out[:, :, h] = torch.bmm(probs.view(b, g * e, length), v[:, :, h]).view(b, g, e, d).transpose(1, 2)
    return out.view(b, e, hq, d).to(q.dtype)


def decode_attention_torch(q: Tensor, k_cache: Tensor, v_cache: Tensor, req_to_token: Tensor,
                           req_pool_indices: Tensor, seq_lens: Tensor, sm_scale: float,
                           sliding_window: int | None = None, max_seq_len: int | None = None) -> Tensor:
    """q [B, Hq, D], the new token of request b at position seq_lens[b] - 1 -> o [B, Hq, D]."""
    length = int(max_seq_len) if max_seq_len is not None else int(seq_lens.max())
    slots = req_to_token[req_pool_indices, :length].long()
    seq = seq_lens.long()
    out = _padded_attention(q[:, None], k_cache, v_cache, slots, (seq - 1)[:, None], seq, sm_scale, sliding_window)
    return out[:, 0]


def extend_attention_torch(q: Tensor, k_cache: Tensor, v_cache: Tensor, req_to_token: Tensor,
                           req_pool_indices: Tensor, prefix_lens: Tensor, extend_lens: Tensor,
                           extend_start_loc: Tensor, sm_scale: float, sliding_window: int | None = None,
                           max_extend_len: int | None = None) -> Tensor:
    """q [T, Hq, D] (request b's new tokens at rows extend_start_loc[b] + i) -> o [T, Hq, D].

    Requests are padded to the longest extend; a batch mixing one long prefill with many decodes would pad
    every decode to the prefill's length, so single-token rows go through the decode path instead.
    """
    out = torch.empty_like(q)
    ext = extend_lens.long()
    single = ext == 1
    if bool(single.any()):
        idx = torch.nonzero(single).squeeze(1)
        rows = extend_start_loc.long()[idx]
        out[rows] = decode_attention_torch(q[rows], k_cache, v_cache, req_to_token, req_pool_indices[idx],
                                           (prefix_lens.long() + 1)[idx], sm_scale, sliding_window)
    multi = torch.nonzero(ext > 1).squeeze(1)
    if len(multi) == 0:
        return out
    e_max = int(ext[multi].max())
    pre, ext_m, start = prefix_lens.long()[multi], ext[multi], extend_start_loc.long()[multi]
    offs = torch.arange(e_max, device=q.device)
    valid = offs[None, :] < ext_m[:, None]  # [M, E]
    rows = (start[:, None] + offs[None, :]).clamp(max=q.shape[0] - 1)
    qp = q[rows]  # [M, E, Hq, D]
    seq = pre + ext_m
    slots = req_to_token[req_pool_indices[multi], : int(seq.max())].long()
    o = _padded_attention(qp, k_cache, v_cache, slots, pre[:, None] + offs[None, :], seq, sm_scale, sliding_window)
    out[rows[valid]] = o[valid]
    return out
