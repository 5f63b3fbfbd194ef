"""The CUDA-graph runner's bucketing and padding, run eagerly on the CPU (`use_graphs=False`).

The capture itself needs CUDA (tests/test_gpu_engine.py); everything around it — static buffers, the copy of a
batch into them, padding rows that write only the reserved slot and read nothing, the reset of rows a larger
earlier batch used — is the same code, checked here against the plain eager forward of the same batch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixgen.runtime.attention import attention_backend_for
from radixgen.runtime.cuda_graph_runner import CudaGraphRunner, ReplayTimes, graph_batch_sizes, token_buckets
from radixgen.runtime.forward_batch import ForwardMode, forward_batch_from_lists
from radixgen.runtime.kv_pool import PADDING_SLOT, KVPool, ReqToTokenPool
from radixgen.runtime.loader import load_model

TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 97, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
}
NUM_SLOTS, MAX_REQS = 512, 12


def test_graph_batch_sizes():
    assert graph_batch_sizes(256) == [1, 2, 4, 8, 16, 24, 32] + list(range(48, 257, 16))
    assert graph_batch_sizes(5) == [1, 2, 4, 5]
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(50) == [1, 2, 4, 8, 16, 24, 32, 48, 50]
    with pytest.raises(ValueError):
        graph_batch_sizes(0)


def eager_runner(min_len: int, **graph_options):
    """The tiny model, its KV pool, request rows each holding a random prefix of distinct random slots (at least
    `min_len`; slot 0 never handed out), the prefix lengths, and a runner over them without graphs."""
    torch.manual_seed(0)
    model, config = load_model(None, "dummy", "cpu", torch.float32, dummy_config=TINY, seed=1)
    pool = KVPool.for_model(config, NUM_SLOTS, torch.float32, "cpu")
    rows = ReqToTokenPool(MAX_REQS, config.max_position_embeddings, "cpu")
    rng = np.random.default_rng(0)
    slots = rng.permutation(np.arange(1, NUM_SLOTS))
    lens = rng.integers(min_len, 30, size=MAX_REQS)
    offset = 0
    for r in range(MAX_REQS):
        rows.write(r, 0, slots[offset : offset + lens[r] + 1])  # +1: the slot the decode token writes
        offset += lens[r] + 1
    attention = attention_backend_for(config, torch.device("cpu"), torch.float32)
    runner = CudaGraphRunner(lambda fb: model(fb, pool, attention, attention.plan(fb)), rows.req_to_token,
                             max_bs=8, max_context=config.max_position_embeddings, use_graphs=False,
                             **graph_options)
    return model, pool, rows, lens, runner


@pytest.fixture(scope="module")
def setup():
    return eager_runner(3)


def _fill_kv(pool: KVPool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for buf in pool.k_buffers + pool.v_buffers:
        buf.copy_(torch.randn(buf.shape, generator=g))


def _decode_batch(rows: ReqToTokenPool, lens: np.ndarray, reqs: list[int], seed: int):
    rng = np.random.default_rng(seed)
    ids = [[int(rng.integers(0, TINY["vocab_size"]))] for _ in reqs]
    prefix = [int(lens[r]) for r in reqs]
    loc = torch.tensor([int(rows.req_to_token[r, lens[r]]) for r in reqs], dtype=torch.int64)
    fb = forward_batch_from_lists(ids, prefix, reqs, rows.req_to_token, loc)
    assert fb.mode is ForwardMode.DECODE
    return fb, loc


def _snapshot(pool: KVPool) -> list[torch.Tensor]:
    return [b.clone() for b in pool.k_buffers + pool.v_buffers]


def _restore(pool: KVPool, snap: list[torch.Tensor]) -> None:
    for buf, saved in zip(pool.k_buffers + pool.v_buffers, snap):
        buf.copy_(saved)


@pytest.mark.parametrize("order", [(3, 7, 5, 1, 8), (8, 2, 6)])
def test_padded_replay_equals_eager_forward(setup, order):
    """Batches of shrinking and growing sizes: logits and every KV write equal the unpadded eager forward."""
    _model, pool, rows, lens, runner = setup
    for step, n in enumerate(order):
        _fill_kv(pool, seed=step)
        reqs = list(np.random.default_rng(step).choice(MAX_REQS, size=n, replace=False))
        fb, loc = _decode_batch(rows, lens, reqs, seed=100 + step)
        assert runner.can_run(fb)
        before = _snapshot(pool)
        with torch.inference_mode():
            want = runner.forward(fb)  # the eager forward of the unpadded batch
        want_kv = _snapshot(pool)
        _restore(pool, before)
        got = runner.replay(fb)
        assert got.shape == (n, TINY["vocab_size"])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        # Same KV everywhere except the padding slot, which only padding rows (if any) wrote; the batch's own
        # slots within rounding (a padded matmul may round differently), every other slot untouched.
        untouched = torch.ones(NUM_SLOTS, dtype=torch.bool)
        untouched[loc] = False
        untouched[PADDING_SLOT] = False
        for buf, ref, old in zip(pool.k_buffers + pool.v_buffers, want_kv, before):
            torch.testing.assert_close(buf[loc], ref[loc], rtol=1e-5, atol=1e-6)
            assert buf[untouched].equal(old[untouched])
            if runner.bucket(n) == n:
                torch.testing.assert_close(buf[PADDING_SLOT], old[PADDING_SLOT], rtol=0, atol=0)
        # Rows past the batch hold padding values after every replay.
        assert runner.seq_lens[n:].eq(0).all() and runner.out_cache_loc[n:].eq(PADDING_SLOT).all()
        assert runner.input_ids[:n].equal(fb.input_ids)


def test_replay_with_hidden_returns_the_eager_hidden_states(setup):
    """A runner given `forward_with_hidden` keeps the decode rows' final hidden states beside their logits
    (contrastive search reads them), equal to the unpadded eager forward's."""
    model, pool, rows, lens, _runner = setup
    attention = attention_backend_for(model.config, torch.device("cpu"), torch.float32)
    runner = CudaGraphRunner(lambda fb: model(fb, pool, attention, attention.plan(fb)), rows.req_to_token,
                             max_bs=8, max_context=model.config.max_position_embeddings, use_graphs=False,
                             forward_with_hidden=lambda fb: model.forward_with_hidden(fb, pool, attention,
                                                                                      attention.plan(fb)))
    _fill_kv(pool, seed=7)
    fb, _ = _decode_batch(rows, lens, [5, 2, 9], seed=3)  # 3 rows in bucket 4: one padding row
    before = _snapshot(pool)
    with torch.inference_mode():
        want_logits, want_hidden = model.forward_with_hidden(fb, pool, attention, attention.plan(fb))
    _restore(pool, before)
    logits, hidden = runner.replay_with_hidden(fb)
    assert runner.bucket(3) == 4 and hidden.shape == (3, TINY["hidden_size"])
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden, want_hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(runner.replay(fb), want_logits, rtol=1e-5, atol=1e-5)


def test_can_run_refuses_what_the_graphs_do_not_compute(setup):
    _model, _pool, rows, lens, runner = setup
    fb, _ = _decode_batch(rows, lens, [0, 1], seed=0)
    assert runner.can_run(fb)
    too_many, _ = _decode_batch(rows, lens, list(range(9)), seed=0)
    assert not runner.can_run(too_many)  # over max_bs
    fb.logits_indices = torch.tensor([1])
    assert not runner.can_run(fb)  # only some rows want logits
    ext = forward_batch_from_lists([[1, 2, 3]], [0], [0], rows.req_to_token, torch.tensor([5, 6, 7]))
    assert not runner.can_run(ext)  # prefill runs eagerly
    other = forward_batch_from_lists([[1]], [3], [0], rows.req_to_token.clone(), torch.tensor([5]))
    assert not runner.can_run(other)  # a different req_to_token table


@pytest.fixture(scope="module")
def short_runner(setup):
    model, pool, rows, _lens, _runner = setup
    attention = attention_backend_for(model.config, torch.device("cpu"), torch.float32)
    return CudaGraphRunner(lambda fb: model(fb, pool, attention, attention.plan(fb)), rows.req_to_token, max_bs=8,
                           max_context=TINY["max_position_embeddings"], use_graphs=False, row_tokens=(4, 2))


def _short_batch(rows: ReqToTokenPool, lens: np.ndarray, reqs: list[int], extends: list[int], seed: int):
    """Request r computes its last `e` positions of [0, lens[r] + 1) (their slots are in the row already)."""
    rng = np.random.default_rng(seed)
    ids = [[int(t) for t in rng.integers(0, TINY["vocab_size"], size=e)] for e in extends]
    prefix = [int(lens[r]) + 1 - e for r, e in zip(reqs, extends)]
    loc = torch.cat([rows.req_to_token[r, p : p + e].long() for r, p, e in zip(reqs, prefix, extends)])
    return forward_batch_from_lists(ids, prefix, reqs, rows.req_to_token, loc), loc


def test_multi_token_rows_replay_equals_eager_forward(setup, short_runner):
    """Rows of 1 to k new tokens in the multi-token graphs' buffers (tokens packed, padding after them and
    padding requests) give the eager forward's logits and KV; the token padding is reset between batches."""
    _model, pool, rows, lens, _ = setup
    runner = short_runner
    assert runner.row_tokens == (2, 4)
    cases = [([3, 7, 5], [1, 4, 2]), ([8, 2], [2, 1]), ([1, 4, 6, 9, 10], [1, 1, 3, 1, 4]), ([2], [1])]
    for step, (reqs, extends) in enumerate(cases):
        _fill_kv(pool, seed=step)
        fb, loc = _short_batch(rows, lens, reqs, extends, seed=200 + step)
        t = runner.short_rows(fb)
        if max(extends) == 1:
            assert fb.mode is ForwardMode.DECODE and t is None and runner.can_run(fb)
            continue
        bucket = runner.bucket(len(reqs))  # the smallest token count of the bucket's graphs that holds the batch
        assert t == min(c for c in token_buckets(bucket, 4) if c >= fb.num_tokens)
        before = _snapshot(pool)
        with torch.inference_mode():
            want = runner.forward(fb)
        want_kv = _snapshot(pool)
        _restore(pool, before)
        got = runner.replay_short(fb, t)
        assert got.shape == (len(reqs), TINY["vocab_size"])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for buf, ref in zip(pool.k_buffers + pool.v_buffers, want_kv):
            torch.testing.assert_close(buf[loc], ref[loc], rtol=1e-5, atol=1e-6)
        live = fb.num_tokens
        assert runner.out_cache_loc[live:].eq(PADDING_SLOT).all() and runner.row_lens[len(reqs):].eq(0).all()


def test_multi_token_rows_refuse_what_they_do_not_compute(setup, short_runner):
    _model, _pool, rows, lens, _ = setup
    long_row, _ = _short_batch(rows, lens, [3, 7], [5, 1], seed=0)
    assert short_runner.short_rows(long_row) is None  # more new tokens than any row holds
    fb, _ = _short_batch(rows, lens, [3, 7], [3, 1], seed=0)
    fb.logits_indices = torch.tensor([0, 1, 2, 3])
    assert short_runner.short_rows(fb) is None  # logits of several rows of one request (prompt logprobs)
    from radixgen.runtime.model_runner import multi_token_rows

    assert multi_token_rows(8) == (2, 4, 8) and multi_token_rows(5) == (2, 4) and multi_token_rows(1) == ()


def test_multi_token_graphs_come_in_token_counts_a_few_jumpers_fill_cheaply():
    # a step where a few of 256 requests append forced tokens runs a graph of a few more positions, not 8 a row
    assert token_buckets(256, 8) == [258, 264, 288, 384, 768, 2048]
    assert token_buckets(1, 8) == [3, 8] and token_buckets(2, 2) == [4] and token_buckets(4, 1) == []
    for bs in (1, 3, 16, 48, 256):
        counts = token_buckets(bs, 4)
        assert counts == sorted(set(counts)) and counts[0] > bs and counts[-1] == 4 * bs


def test_verify_rows_replay_scores_every_token_as_the_eager_forward(setup):
    """A speculative verify batch (rows of 1 to k tokens, a logits row for every token) in the verify graphs'
    buffers: logits of every token equal the eager forward's; larger batches than verify_max_bs are refused."""
    model, pool, rows, lens, _ = setup
    attention = attention_backend_for(model.config, torch.device("cpu"), torch.float32)
    runner = CudaGraphRunner(lambda fb: model(fb, pool, attention, attention.plan(fb)), rows.req_to_token, max_bs=8,
                             max_context=TINY["max_position_embeddings"], use_graphs=False, row_tokens=(2, 4),
                             verify_max_bs=4)
    assert runner.verify_sizes == [1, 2, 4]
    cases = [([3, 7, 5], [1, 4, 2]), ([8], [3]), ([1, 4, 6, 9], [4, 1, 3, 1])]
    for step, (reqs, extends) in enumerate(cases):
        _fill_kv(pool, seed=step)
        fb, _ = _short_batch(rows, lens, reqs, extends, seed=300 + step)
        fb.logits_indices = torch.arange(fb.num_tokens)
        k = runner.verify_rows(fb)
        assert k == (2 if max(extends) <= 2 else 4) and runner.short_rows(fb) is None
        with torch.inference_mode():
            want = runner.forward(fb)
        got = runner.replay_verify(fb, k)
        assert got.shape == (fb.num_tokens, TINY["vocab_size"])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert runner.verify_logits_rows[fb.num_tokens:].eq(0).all()
    big, _ = _short_batch(rows, lens, [0, 1, 2, 3, 4], [2, 1, 1, 1, 1], seed=0)
    big.logits_indices = torch.arange(big.num_tokens)
    assert runner.verify_rows(big) is None  # 5 requests: above verify_max_bs


def test_step_prices_read_replays_as_they_run_and_correct_capture_times_for_real_contexts(short_runner):
    """A graph's price in decode steps: its replays over the decode graph's, as they run; one not replayed yet at
    its capture time plus what real contexts add to the decode replays (padding rows read no KV at capture)."""
    runner = short_runner
    bs = runner.bucket(5)
    t = min(c for c in token_buckets(bs, 4) if c >= 5 + 3)
    saved = (runner.measured, dict(runner.replay_seconds), dict(runner.short_replay_seconds),
             dict(runner.verify_replay_seconds))
    try:
        runner.measured = ReplayTimes()
        runner.replay_seconds[bs] = 0.010
        runner.short_replay_seconds[(bs, t)] = 0.015
        runner.verify_replay_seconds[(bs, 4)] = 0.016
        assert runner.jump_step_cost(5, 3) == pytest.approx(1.5)  # nothing measured yet: capture over capture
        runner.measured.seconds[(bs, 1)] = 0.013  # real contexts add 3 ms to a decode replay
        assert runner.jump_step_cost(5, 3) == pytest.approx((0.015 + 0.003) / 0.013)
        assert runner.step_cost(5, 4) == pytest.approx((0.016 + 0.003) / 0.013)
        runner.measured.seconds[(bs, t)] = 0.020
        runner.measured.seconds[(bs, -4)] = 0.026
        assert runner.jump_step_cost(5, 3) == pytest.approx(0.020 / 0.013)
        assert runner.step_cost(5, 4) == pytest.approx(0.026 / 0.013)
        assert runner.jump_step_cost(5, 0) == 1.0
    finally:
        runner.measured, runner.replay_seconds, runner.short_replay_seconds, runner.verify_replay_seconds = saved
