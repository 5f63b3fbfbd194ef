"""DecodeKVCopies: which decode requests may only append to their carried K/V rows, and which are filled."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixgen.runtime.attention import split_rows
from radixgen.runtime.attention.decode_kv_copies import HEADROOM, ROW_ROUNDING, DecodeKVCopies, HeldCopies
from radixgen.runtime.forward_batch import ForwardBatch, forward_batch_from_lists

LAYERS, KV_HEADS, HEAD_DIM, TABLE_ROWS = 2, 2, 8, 16
ROW_BYTES = 2 * LAYERS * KV_HEADS * HEAD_DIM * 4  # K and V of one position of one request, every layer, fp32


def _table(shares: dict[int, tuple[int, int]] | None = None) -> torch.Tensor:
    """The request table: every position its own slot, except row r's first n positions, which are row q's
    for every r: (q, n) in `shares` (a prefix shared through the radix cache, or slots handed out again)."""
    table = torch.arange(TABLE_ROWS * 512, dtype=torch.int32).view(TABLE_ROWS, 512)
    for r, (q, n) in (shares or {}).items():
        table[r, :n] = table[q, :n]
    return table


def _batch(rows: list[int], lens: list[int], extend: list[int] | None = None, table: torch.Tensor | None = None):
    """A ForwardBatch whose request in table row rows[i] reaches lens[i] tokens by computing extend[i] tokens (1
    each by default: a decode batch; decode rows first in a mixed one, as the scheduler orders them)."""
    extend = extend or [1] * len(rows)
    table = _table() if table is None else table
    loc = np.concatenate([table[r, n - e : n].numpy() for r, n, e in zip(rows, lens, extend)])
    return forward_batch_from_lists([[7] * e for e in extend], [n - e for n, e in zip(lens, extend)], rows, table,
                                    torch.from_numpy(loc.astype(np.int64)))


def _plan(copies: DecodeKVCopies, batch: ForwardBatch) -> HeldCopies | None:
    """The copies' plan of a forward, for its decode rows as the attention backend splits them."""
    return copies.plan(batch, split_rows(batch).decode)


def _copies(max_bytes: int = 1 << 30) -> DecodeKVCopies:
    return DecodeKVCopies(LAYERS, KV_HEADS, HEAD_DIM, torch.float32, max_bytes,
                          np.ones(TABLE_ROWS, dtype=np.int64), cascade=False)


# Each case: forwards as (table rows, lengths after the step, extend lengths or None for decode, table rows
# handed to a new request just before), and per forward what each decode request's row gets: "F" filled from
# the pool, "P" filled from where a left request's row it took ends, "A" only its newest position appended (""
# for a forward without decode requests); "R" marks a forward that rebuilt every row.
SEQUENCES = {
    "same batch, one longer each step": (
        [([1, 2], [10, 20], None, []), ([1, 2], [11, 21], None, []), ([1, 2], [12, 22], None, [])],
        ["FF R", "AA", "AA"]),
    "a prefill without decodes in between": (
        [([1, 2], [10, 20], None, []), ([3], [30], [30], [3]), ([1, 2], [11, 21], None, [])],
        ["FF R", "", "AA"]),  # their rows were released, and taken back by slots
    "a mixed step: the decodes beside a chunk keep appending": (
        [([1, 2], [10, 20], None, []), ([1, 2, 3], [11, 21, 8], [1, 1, 8], [3]), ([1, 2], [12, 22], None, [])],
        ["FF R", "AA", "AA"]),
    "a request leaves": (
        [([1, 2, 3, 4, 5], [10, 20, 5, 6, 7], None, []), ([1, 3, 4, 5], [11, 6, 7, 8], None, []),
         ([1, 3, 4, 5], [12, 7, 8, 9], None, [])],
        ["FFFFF R", "AAAA", "AAAA"]),
    "a request joins": (
        [([1, 2], [10, 20], None, []), ([1, 2, 4], [11, 21, 6], None, [4]), ([1, 2, 4], [12, 22, 7], None, [])],
        ["FF R", "AAF", "AAA"]),
    "one leaves and one joins in its row": (
        [([1, 2, 3], [10, 20, 5], None, []), ([1, 4, 3], [11, 9, 6], None, [4])],
        ["FFF R", "AFA"]),
    "the same requests in another order": (
        [([1, 2], [10, 20], None, []), ([2, 1], [21, 11], None, [])],
        ["FF R", "AA"]),
    "a request extended another way (jump-forward) in between": (
        [([1, 2], [10, 20], None, []), ([1, 2], [11, 24], [1, 4], []), ([1, 2], [12, 25], None, [])],
        ["FF R", "A", "AP"]),
    "a table row handed to a new request of the same length": (
        [([1, 2], [10, 20], None, []), ([1, 2], [11, 21], None, [2], _table({2: (5, 21)}))],
        ["FF R", "AF"]),
    "growing past the capacity (longer buffers, contents kept)": (
        [([1], [HEADROOM], None, [])] + [([1], [HEADROOM + k], None, []) for k in range(1, HEADROOM + 2)],
        ["F R"] + ["A"] * (HEADROOM + 1)),
    "holes over a quarter of the rows": (
        [([1, 2, 3, 4], [5, 5, 5, 5], None, []), ([4], [6], None, [])],
        ["FFFF R", "F R"]),
}


# Row 2's first 11 positions are row 1's slots: the next turn of row 1's conversation, after a prefill of its
# new tokens. Row 3's too, but computed from scratch: those slots were freed and handed out again.
NEXT_TURN = _table({2: (1, 11), 3: (1, 11)})
SEQUENCES.update({
    "the next turn takes the left request's row and fills the rest": (
        [([1], [10], None, []), ([1], [11], None, []), ([2], [16], [5], [2]), ([2], [17], None, [])],
        ["F R", "A", "", "P"]),
    "a left request's slots written again are forgotten": (
        [([1], [10], None, []), ([1], [11], None, []), ([3], [16], [16], [3]), ([2], [16], [5], [2]),
         ([2], [17], None, [])],
        ["F R", "A", "", "", "F"]),
})


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_rows_are_appended_only_for_the_same_request_one_position_on(name):
    steps, want = SEQUENCES[name]
    copies = _copies()
    table = NEXT_TURN if name in ("the next turn takes the left request's row and fills the rest",
                                  "a left request's slots written again are forgotten") else _table()
    got = []
    for rows, lens, extend, handed_out, *step_table in steps:  # a step may bring its own table
        copies.allocations[handed_out] += 1
        rebuilds = copies.rebuilds
        plan = _plan(copies, _batch(rows, lens, extend, step_table[0] if step_table else table))
        if plan is None:
            got.append("")
            continue
        nd = len(plan.placement.rows)
        assert len(plan.k) == LAYERS and len(set(plan.placement.rows.tolist())) == nd  # one row per request
        assert plan.k[0].shape[2] >= max(lens[:nd])  # room for every position of the longest request
        assert torch.isfinite(plan.k[0]).all()  # masked columns meet P @ V: never NaN
        placed = plan.placement
        start = dict(zip(placed.fill.tolist(), placed.fill_from.tolist()))
        marks = "".join("A" if b not in start else "F" if start[b] == placed.shared else "P" for b in range(nd))
        got.append(marks + (" R" if copies.rebuilds > rebuilds else ""))
    assert got == want


def test_a_batch_over_the_memory_budget_runs_without_copies():
    positions = -(-(10 + HEADROOM) // HEADROOM) * HEADROOM  # a length of 10 plus the headroom, rounded up
    need = ROW_ROUNDING * positions * ROW_BYTES  # two requests take a multiple of ROW_ROUNDING rows
    assert _plan(_copies(need), _batch([1, 2], [10, 10])) is not None
    tight = _copies(need - 1)
    assert _plan(tight, _batch([1, 2], [10, 10])) is None
    assert tight.nbytes() == 0 and _plan(tight, _batch([1], [10])) is None  # as many rows for one request


def test_buffers_are_reused_while_the_batch_fits():
    copies = _copies()
    first = _plan(copies, _batch([1, 2, 3], [10, 20, 30]))
    second = _plan(copies, _batch([4, 5], [5, 6], [5, 6]))  # a prefill: no decode requests, every row freed
    assert second is None
    third = _plan(copies, _batch([4, 5], [6, 7]))  # new requests: rows filled in the same memory
    assert len(third.placement.fill) == 2 and third.k[0].data_ptr() == first.k[0].data_ptr()


def test_longer_buffers_keep_what_the_rows_hold(monkeypatch):
    copies = _copies()
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))  # uninitialised memory
    first = _plan(copies, _batch([1, 2], [5, 9]))
    for buf in first.k[0], first.v[0]:
        buf[:2, :, :9] = torch.randn(2, KV_HEADS, 9, HEAD_DIM)  # stands for the filled keys and values
    held = first.k[0][:2, :, :9].clone()
    capacity = first.k[0].shape[2]
    grown = _plan(copies, _batch([1, 2], [6, capacity + 1]))  # ... after many appends of request 2
    assert grown.k[0].shape[2] > capacity and len(grown.placement.fill) == 1  # request 2 jumped: only it refills
    torch.testing.assert_close(grown.k[0][:2, :, :9], held)
    for buf in grown.k[0], grown.v[0]:  # every column finite: masked ones still enter P @ V with weight 0
        assert torch.isfinite(buf).all()


def test_a_shared_prefix_stays_out_of_the_rows():
    """Requests sharing >= SHARED_PREFIX_MIN leading slots (a cached system prompt) keep only their own keys in
    their rows (the cascade reads the prefix once); a newcomer without that prefix makes the rows start over."""
    from radixgen.kernels import attention_torch

    if not attention_torch._flash_lse_available():
        pytest.skip("torch's CPU flash attention with log-sum-exp is not available")
    table = _table({2: (1, 80), 3: (1, 80)})
    copies = DecodeKVCopies(LAYERS, KV_HEADS, HEAD_DIM, torch.float32, 1 << 30, np.ones(TABLE_ROWS, np.int64))
    first = _plan(copies, _batch([1, 2], [100, 90], table=table))
    assert first.placement.shared == 80 and first.placement.fill_from.tolist() == [80, 80]
    joined = _plan(copies, _batch([1, 2, 3], [101, 91, 85], table=table))  # 3 shares the prefix: no rebuild
    assert joined.placement.shared == 80 and copies.rebuilds == 1 and joined.placement.fill.tolist() == [2]
    other = _plan(copies, _batch([1, 2, 3, 4], [102, 92, 86, 20], table=table))  # 4 does not
    assert other.placement.shared == 0 and copies.rebuilds == 2 and other.placement.fill.tolist() == [0, 1, 2, 3]


def test_a_new_wave_on_a_shared_prefix_splits_it_off():
    """Rows set up without a shared prefix, then a batch of newcomers that share one: the rows start over with
    the prefix left to the cascade."""
    from radixgen.kernels import attention_torch

    if not attention_torch._flash_lse_available():
        pytest.skip("torch's CPU flash attention with log-sum-exp is not available")
    table = _table({5: (4, 80), 6: (4, 80)})
    copies = DecodeKVCopies(LAYERS, KV_HEADS, HEAD_DIM, torch.float32, 1 << 30, np.ones(TABLE_ROWS, np.int64))
    assert _plan(copies, _batch([1, 2], [30, 40], table=table)).placement.shared == 0
    wave = _plan(copies, _batch([4, 5, 6], [100, 90, 95], table=table))
    assert wave.placement.shared == 80 and copies.rebuilds == 2
