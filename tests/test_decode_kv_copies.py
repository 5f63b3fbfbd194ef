"""DecodeKVCopies: when a CPU decode step may append to the batch's carried K/V copies, and when it must refill."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixgen.runtime.decode_kv_copies import HEADROOM, DecodeKVCopies
from radixgen.runtime.forward_batch import build_forward_batch

LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 8
ROW_BYTES = 2 * LAYERS * KV_HEADS * HEAD_DIM * 4  # K and V of one position of one request, every layer, fp32


def _batch(rows: list[int], lens: list[int], extend: list[int] | None = None):
    """A ForwardBatch whose request in table row rows[i] reaches lens[i] tokens by computing extend[i] (1 each
    by default: a decode batch)."""
    extend = extend or [1] * len(rows)
    table = torch.arange(16 * 512, dtype=torch.int32).view(16, 512)  # every position its own slot
    loc = np.concatenate([table[r, n - e : n].numpy() for r, n, e in zip(rows, lens, extend)])
    return build_forward_batch([[7] * e for e in extend], [n - e for n, e in zip(lens, extend)], rows, table,
                               torch.from_numpy(loc.astype(np.int64)))


# Each case: a sequence of forwards (rows, lengths after the step, extend lengths or None for decode) and what
# each one's plan must be: "refill", "append" or None (no copies).
SEQUENCES = {
    "same batch, one longer each step": (
        [([1, 2], [10, 20], None), ([1, 2], [11, 21], None), ([1, 2], [12, 22], None)],
        ["refill", "append", "append"]),
    "a prefill in between": (
        [([1, 2], [10, 20], None), ([3], [30], [30]), ([1, 2], [11, 21], None)],
        ["refill", None, "refill"]),
    "a mixed step (decodes and a chunk) in between": (
        [([1, 2], [10, 20], None), ([1, 2, 3], [11, 21, 8], [1, 1, 8]), ([1, 2], [12, 22], None)],
        ["refill", None, "refill"]),
    "a request left the batch": (
        [([1, 2, 3], [10, 20, 5], None), ([1, 3], [11, 6], None), ([1, 3], [12, 7], None)],
        ["refill", "refill", "append"]),
    "same rows in another order": (
        [([1, 2], [10, 20], None), ([2, 1], [21, 11], None)],
        ["refill", "refill"]),
    "a length that did not grow by one": (
        [([1, 2], [10, 20], None), ([1, 2], [11, 22], None)],
        ["refill", "refill"]),
    "growing past the capacity": (
        [([1], [HEADROOM], None)] + [([1], [HEADROOM + k], None) for k in range(1, HEADROOM + 2)],
        ["refill"] + ["append"] * HEADROOM + ["refill"]),
}


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_copies_are_appended_only_across_consecutive_steps_of_one_batch(name):
    steps, want = SEQUENCES[name]
    copies = DecodeKVCopies(LAYERS, KV_HEADS, HEAD_DIM, torch.float32, max_bytes=1 << 30, cascade=False)
    got = []
    for rows, lens, extend in steps:
        plan = copies.plan(_batch(rows, lens, extend))
        if plan is not None:
            assert len(plan) == LAYERS and plan[0].k.shape[:2] == (len(rows), KV_HEADS)
            assert plan[0].k.shape[2] >= max(lens)  # room for every position of the longest request
            assert torch.isfinite(plan[0].k).all()  # masked columns meet P @ V: never NaN
        got.append(None if plan is None else ("refill" if plan[0].refill else "append"))
    assert got == want
    assert (copies.refills, copies.appends) == (want.count("refill"), want.count("append"))


def test_a_batch_over_the_memory_budget_runs_without_copies():
    positions = -(-(10 + HEADROOM) // HEADROOM) * HEADROOM  # a length of 10 plus the headroom, rounded up
    need = 2 * positions * ROW_BYTES  # two requests
    assert DecodeKVCopies(LAYERS, KV_HEADS, HEAD_DIM, torch.float32, max_bytes=need).plan(
        _batch([1, 2], [10, 10])) is not None
    tight = DecodeKVCopies(LAYERS, KV_HEADS, HEAD_DIM, torch.float32, max_bytes=need - 1)
    assert tight.plan(_batch([1, 2], [10, 10])) is None
    assert tight.nbytes() == 0 and tight.plan(_batch([1], [10])) is not None  # one request fits


def test_buffers_are_reused_while_the_batch_fits():
    copies = DecodeKVCopies(LAYERS, KV_HEADS, HEAD_DIM, torch.float32, max_bytes=1 << 30)
    first = copies.plan(_batch([1, 2, 3], [10, 20, 30]))
    second = copies.plan(_batch([4, 5], [5, 6]))  # a new, smaller batch: refilled into the same memory
    assert second[0].refill and second[0].k.data_ptr() == first[0].k.data_ptr()
