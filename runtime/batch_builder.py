"""Turn a ScheduleBatch (policy: which positions of which requests) into a ForwardBatch (flat device tensors).

This runs once per engine step, before the forward can launch, so its cost adds to every step: the per-item
loop only slices arrays, the index arithmetic is vectorized, and `forward_batch.assemble_forward_batch` sends
every host array (the req_to_token updates included) to the device in two aligned copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radixgen.runtime.forward_batch import ForwardBatch, assemble_forward_batch, exclusive_cumsum
from radixgen.runtime.request import Req
from radixgen.runtime.scheduler import ScheduleBatch, Scheduler


@dataclass
class LogitRows:
    """Where each scheduled request's logits rows sit in the forward's output (-1 = no rows)."""

    first: np.ndarray  # [B] first logits row of the item
    count: np.ndarray  # [B] rows of the item
    sample_row: np.ndarray  # [B] first row sampled from (the item's last row, or a verify item's first) or -1
    sample_count: np.ndarray  # [B] rows sampled from, from sample_row on: 1, or 1 + drafts of a verify item


def build_forward_batch(batch: ScheduleBatch, scheduler: Scheduler, req_to_token: torch.Tensor,
                        device: torch.device, device_ids: torch.Tensor | None = None) -> tuple[ForwardBatch, LogitRows]:
    """The ForwardBatch of `batch` and where its logits rows land. `device_ids`: the batch's flat input ids
    already on the device (an overlapped decode step, whose inputs the host has not read yet)."""
    items = batch.items
    b = len(items)
    starts = np.fromiter((it.start for it in items), dtype=np.int64, count=b)
    extends = np.fromiter((it.extend for it in items), dtype=np.int64, count=b)
    req_idx = np.fromiter((it.req.req_pool_idx for it in items), dtype=np.int64, count=b)
    loc = exclusive_cumsum(extends)
    total = int(extends.sum())

    ids = np.empty(total, dtype=np.int64)
    out_loc = np.empty(total, dtype=np.int64)
    sync_lo = np.empty(b, dtype=np.int64)  # first req_to_token column each item (re)writes on the device
    new_slots: list[np.ndarray] = []
    logit_rows: list[int] = []
    logit_first = np.full(b, -1, dtype=np.int64)
    logit_count = np.zeros(b, dtype=np.int64)
    sample_row = np.full(b, -1, dtype=np.int64)
    sample_count = np.zeros(b, dtype=np.int64)
    for i, it in enumerate(items):
        req, s, e, o = it.req, it.start, it.extend, int(loc[i])
        if it.drafts:  # a verify item: its last token, then its drafts, every row scored
            ids[o] = _token_ids(req, s, 1)[0]
            ids[o + 1 : o + e] = req.draft_ids
            logit_first[i] = sample_row[i] = len(logit_rows)
            logit_rows.extend(range(o, o + e))
            logit_count[i] = sample_count[i] = e
            new_slots.append(scheduler.slot_view(req, it.sync_from, s + e))
            out_loc[o : o + e] = scheduler.slot_view(req, s, s + e)
            sync_lo[i] = it.sync_from
            continue
        if device_ids is None:
            ids[o : o + e] = _token_ids(req, s, e)
        slots = scheduler.slot_view(req, 0, s + e)
        out_loc[o : o + e] = slots[s:]
        lo = it.sync_from  # the scheduler's choice of device row entries to (re)write: [lo, s + e)
        sync_lo[i] = lo
        new_slots.append(slots[lo:])
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
                sample_count[i] = 1

    # req_to_token[row, col] = slot for every entry not yet on the device, as flat index arrays.
    counts = starts + extends - sync_lo
    n_write = int(counts.sum())
    write_rows = np.repeat(req_idx, counts)
    write_cols = np.repeat(sync_lo - exclusive_cumsum(counts), counts) + np.arange(n_write)
    fb = assemble_forward_batch(ids, starts, extends, req_idx, out_loc, req_to_token,
                                logit_rows=np.asarray(logit_rows, dtype=np.int64),
                                table_writes=(write_rows, write_cols, np.concatenate(new_slots)),
                                device_ids=device_ids)
    return fb, LogitRows(logit_first, logit_count, sample_row, sample_count)


def _token_ids(req: Req, start: int, n: int) -> np.ndarray | list[int]:
    """Tokens [start, start + n) of the request's fill_ids, without concatenating the whole sequence."""
    prompt_len = len(req.origin_ids)
    if start + n <= prompt_len:
        return req.origin_ids[start : start + n]
    if start >= prompt_len:  # decode: only generated tokens
        return req.output_ids[start - prompt_len : start - prompt_len + n]
    return req.fill_ids()[start : start + n]
