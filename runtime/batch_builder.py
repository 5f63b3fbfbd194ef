"""Turn a ScheduleBatch (policy: which positions of which requests) into a ForwardBatch (flat device tensors)."""

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


def build_forward_batch(batch: ScheduleBatch, scheduler: Scheduler, req_to_token: torch.Tensor,
                        device: torch.device) -> tuple[ForwardBatch, LogitRows]:
    items = batch.items
    b = len(items)
    starts = np.fromiter((it.start for it in items), dtype=np.int64, count=b)
    extends = np.fromiter((it.extend for it in items), dtype=np.int64, count=b)
    loc = np.zeros(b, dtype=np.int64)
    if b > 1:
        loc[1:] = np.cumsum(extends)[:-1]
    total = int(extends.sum())

    ids = np.empty(total, dtype=np.int64)
    out_loc = np.empty(total, dtype=np.int64)
    rows_w, cols_w, vals_w = [], [], []
    logit_first = np.full(b, -1, dtype=np.int64)
    logit_count = np.zeros(b, dtype=np.int64)
    sample_row = np.full(b, -1, dtype=np.int64)
    logit_idx: list[np.ndarray] = []
    n_logits = 0
    for i, it in enumerate(items):
        req, s, e, o = it.req, it.start, it.extend, loc[i]
        prompt_len = req.prompt_len
        if s + e <= prompt_len:
            ids[o : o + e] = req.origin_ids[s : s + e]
        else:
            ids[o : o + e] = req.fill_ids()[s : s + e]
        slots = scheduler.slot_view(req, 0, s + e)
        out_loc[o : o + e] = slots[s:]
        # Device row entries not yet current: [synced_len, s + e).
        lo = min(req.synced_len, s)
        rows_w.append(np.full(s + e - lo, req.req_pool_idx, dtype=np.int64))
        cols_w.append(np.arange(lo, s + e, dtype=np.int64))
        vals_w.append(slots[lo:])
        req.synced_len = s + e
        if it.logits_from is not None:
            first = o + it.logits_from
            rows = np.arange(first, o + e, dtype=np.int64)
        elif it.sample:
            rows = np.array([o + e - 1], dtype=np.int64)
        else:
            rows = None
        if rows is not None:
            logit_idx.append(rows)
            logit_first[i], logit_count[i] = n_logits, len(rows)
            n_logits += len(rows)
            if it.sample:
                sample_row[i] = n_logits - 1

    rows_t = torch.from_numpy(np.concatenate(rows_w)).to(device)
    cols_t = torch.from_numpy(np.concatenate(cols_w)).to(device)
    vals_t = torch.from_numpy(np.concatenate(vals_w)).to(device=device, dtype=req_to_token.dtype)
    req_to_token[rows_t, cols_t] = vals_t

    positions = np.repeat(starts, extends) + (np.arange(total) - np.repeat(loc, extends))
    seq = starts + extends
    is_decode = bool((extends == 1).all())
    fb = ForwardBatch(
        mode=ForwardMode.DECODE if is_decode else ForwardMode.EXTEND,
        input_ids=torch.from_numpy(ids).to(device),
        positions=torch.from_numpy(positions).to(device),
        out_cache_loc=torch.from_numpy(out_loc).to(device),
        req_pool_indices=torch.tensor([it.req.req_pool_idx for it in items], dtype=torch.int64, device=device),
        req_to_token=req_to_token,
        prefix_lens=torch.from_numpy(starts.astype(np.int32)).to(device),
        extend_lens=torch.from_numpy(extends.astype(np.int32)).to(device),
        seq_lens=torch.from_numpy(seq.astype(np.int32)).to(device),
        extend_start_loc=torch.from_numpy(loc.astype(np.int32)).to(device),
        logits_indices=torch.from_numpy(np.concatenate(logit_idx) if logit_idx else np.zeros(0, np.int64)).to(device),
        max_extend_len=int(extends.max()),
        max_seq_len=int(seq.max()),
    )
    return fb, LogitRows(logit_first, logit_count, sample_row)
