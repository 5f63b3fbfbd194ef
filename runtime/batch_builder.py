"""Turn a ScheduleBatch (policy: which positions of which requests) into a ForwardBatch (flat device tensors).

This runs once per engine step, before the forward can launch, so its cost adds to every step: the per-item
loop only slices arrays, the index arithmetic is vectorized, and every host array travels to the device in two
copies (one int64 pack, one int32 pack) whose slices become the ForwardBatch's tensors. Each slice starts on a
16-byte boundary: Triton specializes kernels on pointer alignment, so unaligned slices would compile (and run)
other variants, and which slices were aligned would change from step to step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode
from radixgen.runtime.scheduler import ScheduleBatch, Scheduler


@dataclass
class LogitRows:
    """Where each scheduled request's logits rows sit in the forward's output (-1 = no rows)."""

    first: np.ndarray  # [B] first logits row of the item
    count: np.ndarray  # [B] rows of the item
    sample_row: np.ndarray  # [B] row sampled from (the item's last row) or -1


def _exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    out = np.zeros_like(x)
    if len(x) > 1:
        np.cumsum(x[:-1], out=out[1:])
    return out


_ALIGN = 4  # elements: 16 bytes of int32, 32 of int64


def _pack(parts: list[np.ndarray], dtype: np.dtype, device: torch.device) -> list[torch.Tensor]:
    """One host-to-device copy of `parts` (as `dtype`); returns each part's slice, each starting aligned."""
    sizes = [len(p) for p in parts]
    starts = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([-(-n // _ALIGN) * _ALIGN for n in sizes], out=starts[1:])
    host = np.zeros(int(starts[-1]), dtype=dtype)
    for p, a in zip(parts, starts):
        host[a : a + len(p)] = p
    dev = torch.from_numpy(host).to(device)
    return [dev[a : a + n] for a, n in zip(starts, sizes)]


def build_forward_batch(batch: ScheduleBatch, scheduler: Scheduler, req_to_token: torch.Tensor,
                        device: torch.device) -> tuple[ForwardBatch, LogitRows]:
    items = batch.items
    b = len(items)
    starts = np.fromiter((it.start for it in items), dtype=np.int64, count=b)
    extends = np.fromiter((it.extend for it in items), dtype=np.int64, count=b)
    req_idx = np.fromiter((it.req.req_pool_idx for it in items), dtype=np.int64, count=b)
    loc = _exclusive_cumsum(extends)
    total = int(extends.sum())

    ids = np.empty(total, dtype=np.int64)
    out_loc = np.empty(total, dtype=np.int64)
    sync_lo = np.empty(b, dtype=np.int64)  # first req_to_token column each item (re)writes on the device
    new_slots: list[np.ndarray] = []
    logit_rows: list[int] = []
    logit_first = np.full(b, -1, dtype=np.int64)
    logit_count = np.zeros(b, dtype=np.int64)
    sample_row = np.full(b, -1, dtype=np.int64)
    for i, it in enumerate(items):
        req, s, e, o = it.req, it.start, it.extend, int(loc[i])
        prompt_len = len(req.origin_ids)
        if s + e <= prompt_len:
            ids[o : o + e] = req.origin_ids[s : s + e]
        elif s >= prompt_len:  # decode: only generated tokens (no concatenation of the whole sequence)
            ids[o : o + e] = req.output_ids[s - prompt_len : s - prompt_len + e]
        else:
            ids[o : o + e] = req.fill_ids()[s : s + e]
        slots = scheduler.slot_view(req, 0, s + e)
        out_loc[o : o + e] = slots[s:]
        # Device row entries not yet current: [synced_len, s + e).
        lo = min(req.synced_len, s)
        sync_lo[i] = lo
        new_slots.append(slots[lo:])
        req.synced_len = s + e
        if it.logits_from is not None:
            logit_first[i] = len(logit_rows)
            logit_rows.extend(range(o + it.logits_from, o + e))
        elif it.sample:
            logit_first[i] = len(logit_rows)
            logit_rows.append(o + e - 1)
        if logit_first[i] >= 0:
            logit_count[i] = len(logit_rows) - logit_first[i]
            if it.sample:
                sample_row[i] = len(logit_rows) - 1

    seq = starts + extends
    positions = np.repeat(starts - loc, extends) + np.arange(total)
    # req_to_token[row, col] = slot for every entry not yet on the device, as flat index arrays.
    counts = seq - sync_lo
    n_write = int(counts.sum())
    write_rows = np.repeat(req_idx, counts)
    write_cols = np.repeat(sync_lo - _exclusive_cumsum(counts), counts) + np.arange(n_write)

    p64 = _pack([ids, positions, out_loc, req_idx, np.asarray(logit_rows, dtype=np.int64), write_rows, write_cols],
                np.int64, device)
    p32 = _pack([starts, extends, seq, loc, np.concatenate(new_slots)], np.int32, device)
    req_to_token[p64[5], p64[6]] = p32[4].to(req_to_token.dtype)

    fb = ForwardBatch(
        mode=ForwardMode.DECODE if bool((extends == 1).all()) else ForwardMode.EXTEND,
        input_ids=p64[0],
        positions=p64[1],
        out_cache_loc=p64[2],
        req_pool_indices=p64[3],
        req_to_token=req_to_token,
        prefix_lens=p32[0],
        extend_lens=p32[1],
        seq_lens=p32[2],
        extend_start_loc=p32[3],
        logits_indices=p64[4],
        max_extend_len=int(extends.max()),
        max_seq_len=int(seq.max()),
    )
    return fb, LogitRows(logit_first, logit_count, sample_row)
