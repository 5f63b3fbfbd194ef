"""The verify graphs' row layout kept across replays (runtime/cuda_graph_runner.py), run eagerly on the CPU: a
verify batch whose row layout (tokens per request, logits rows) the static buffers already hold skips rewriting
them, and every replay still equals the eager forward, whatever other graphs ran in between."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_cuda_graph_runner import TINY, eager_runner
from torch.utils._python_dispatch import TorchDispatchMode

from radixgen.runtime.forward_batch import ForwardBatch, forward_batch_from_lists
from radixgen.runtime.kv_pool import KVPool, ReqToTokenPool

VOCAB = TINY["vocab_size"]


class _Copies(TorchDispatchMode):
    """Counts tensor copies dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func is torch.ops.aten.copy_.default
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def setup():
    _, pool, rows, lens, runner = eager_runner(8, row_tokens=(2, 4), verify_max_bs=4)
    return pool, rows, lens, runner


def _batch(rows: ReqToTokenPool, lens: np.ndarray, reqs: list[int], extends: list[int], seed: int,
           every_token: bool) -> ForwardBatch:
    """Request r computes its last `e` positions of [0, lens[r] + 1); `every_token`: a logits row for each."""
    rng = np.random.default_rng(seed)
    ids = [[int(t) for t in rng.integers(0, VOCAB, size=e)] for e in extends]
    prefix = [int(lens[r]) + 1 - e for r, e in zip(reqs, extends)]
    loc = torch.cat([rows.req_to_token[r, p : p + e].long() for r, p, e in zip(reqs, prefix, extends)])
    logits = torch.arange(sum(extends)) if every_token else None
    return forward_batch_from_lists(ids, prefix, reqs, rows.req_to_token, loc, logits_indices=logits)


def _fill_kv(pool: KVPool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for buf in pool.k_buffers + pool.v_buffers:
        buf.copy_(torch.randn(buf.shape, generator=g))


def test_verify_replays_keep_their_layout_and_equal_the_eager_forward(setup):
    pool, rows, lens, runner = setup
    # (requests, new tokens each, a verify batch?) in turn: repeats of one layout, with multi-token and decode
    # batches (which rewrite or pad the rows the verify layout lives in) and other layouts between them
    steps = [([3], [4], True), ([3], [4], True), ([3], [2], False), ([3], [4], True), ([3, 7], [4, 2], True),
             ([3], [4], True), ([5, 2, 9], [1, 1, 1], False), ([3], [4], True), ([3], [3], True), ([3], [4], True),
             ([3], [4], True), ([3, 7], [2, 1], False), ([3], [4], True)]
    copies = []
    for step, (reqs, extends, verify) in enumerate(steps):
        _fill_kv(pool, seed=step)
        fb = _batch(rows, lens, reqs, extends, seed=400 + step, every_token=verify)
        with torch.inference_mode():
            want = runner.forward(fb)
        counter = _Copies()
        with counter:
            if verify:
                k = runner.verify_rows(fb)
                assert k is not None
                got = runner.replay_verify(fb, k)
            elif max(extends) > 1:
                t = runner.short_rows(fb)
                assert t is not None
                got = runner.replay_short(fb, t)
            else:
                got = runner.replay(fb)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        copies.append(counter.n)
        if verify:
            n, t = len(reqs), fb.num_tokens
            assert runner.row_lens[:n].tolist() == extends and runner.row_lens[n:].eq(0).all()
            assert runner.verify_logits_rows[:t].tolist() == list(range(t))
            assert runner.verify_logits_rows[t:].eq(0).all()
    # a repeated layout skips the three row-layout copies; after another graph wrote the rows it copies again
    assert copies[1] == copies[0] - 3 and copies[10] == copies[9] - 3
    assert copies[3] == copies[5] == copies[7] == copies[12] == copies[0]


def test_a_verify_batch_without_host_arrays_is_always_copied(setup):
    """A batch whose logits rows were set on the device after assembly has no host layout: never skipped."""
    pool, rows, lens, runner = setup
    for step in range(2):
        _fill_kv(pool, seed=50 + step)
        fb = _batch(rows, lens, [4], [3], seed=500 + step, every_token=False)
        fb.logits_indices = torch.arange(fb.num_tokens)
        assert fb.host_logits_indices is None
        with torch.inference_mode():
            want = runner.forward(fb)
        k = runner.verify_rows(fb)
        assert k is not None
        torch.testing.assert_close(runner.replay_verify(fb, k), want, rtol=1e-5, atol=1e-5)
