"""Scheduler policy tests with no model: a fake forward appends a token per sampled request.

Checks budgets, chunked prefill, cache reuse, in-queue prefix sharing, preemption under memory pressure, and
the slot-ownership invariant (free + tree + owned == total) after every step.
"""

from __future__ import annotations

import numpy as np
import pytest

from radixgen.radix import NoPrefixCache, RadixCache
from radixgen.runtime.kv_pool import ReqToTokenPool, SlotAllocator
from radixgen.runtime.request import Req, ReqState
from radixgen.runtime.scheduler import Scheduler, SchedulerLimits


class _Params:
    search_width = 1

    def __init__(self, max_new_tokens: int) -> None:
        self.max_new_tokens = max_new_tokens


def make(slots=4096, cache=True, max_prefill=64, chunk=32, max_running=16, policy="lpm"):
    limits = SchedulerLimits(max_running_requests=max_running, max_prefill_tokens=max_prefill,
                             chunked_prefill_size=chunk, max_context=1024, schedule_policy=policy)
    alloc = SlotAllocator(slots + 1)
    rows = ReqToTokenPool(max_running + 4, 1025, "cpu")
    tree = RadixCache() if cache else NoPrefixCache()
    return Scheduler(limits, alloc, rows, tree), alloc, tree


def req(rid, ids, max_new=4):
    return Req(rid=rid, origin_ids=np.asarray(ids, dtype=np.int64), params=_Params(max_new))


def check_slots(s: Scheduler, alloc: SlotAllocator, tree) -> None:
    owned = sum(len(s.slots[r.rid]) - r.tree_len for r in s.running)
    assert alloc.num_free + tree.stats().cached_tokens + owned == alloc.num_slots - 1
    tree.check_integrity()
    seen = [tree.all_slots()] + [s.slots[r.rid].view(r.tree_len) for r in s.running]
    allslots = np.concatenate(seen) if seen else np.zeros(0)
    assert len(np.unique(allslots)) == len(allslots), "a slot is owned twice"


def run(s, alloc, tree, steps=500, on_batch=None):
    """Drive the scheduler with a fake forward; returns finished reqs in finish order."""
    finished = []
    for _ in range(steps):
        batch = s.schedule()
        if batch is None:
            if not s.has_work():
                break
            continue
        if on_batch:
            on_batch(batch)
        s.commit(batch)
        for it in batch.items:
            if it.sample:
                r = it.req
                r.output_ids.append(1000 + len(r.output_ids))
                if len(r.output_ids) >= r.params.max_new_tokens:
                    s.finish(r)
                    finished.append(r)
        check_slots(s, alloc, tree)
    assert not s.has_work()
    return finished


def test_prefill_budget_and_chunking():
    s, alloc, tree = make(max_prefill=40, chunk=16)
    r = req("a", range(100), max_new=2)
    s.add(r)
    sizes = []
    run(s, alloc, tree, on_batch=lambda b: sizes.append([it.extend for it in b.items]))
    # 100 prompt tokens in chunks of <= 16, then 1 decode token.
    assert sizes[:7] == [[16]] * 6 + [[4]]
    assert sizes[-1] == [1]
    assert r.state is ReqState.FINISHED


def test_decodes_run_beside_prefill_chunks():
    s, _, _ = make(max_prefill=16, chunk=16)
    a = req("a", range(8), max_new=10)
    s.add(a)
    s.commit(s.schedule())
    a.output_ids.append(5)
    s.add(req("b", range(100, 164), max_new=1))
    batch = s.schedule()
    kinds = sorted((it.req.rid, it.extend) for it in batch.items)
    assert kinds == [("a", 1), ("b", 16)]  # the long prompt never stalls a's decode


def test_second_request_hits_cache():
    s, alloc, tree = make()
    prompt = list(range(50))
    first = req("a", prompt)
    s.add(first)
    run(s, alloc, tree)
    second = req("b", prompt + [7, 8])
    s.add(second)
    run(s, alloc, tree)
    assert first.cached_tokens == 0
    assert second.cached_tokens == 50


def test_no_cache_stand_in_shares_nothing_and_leaks_nothing():
    s, alloc, tree = make(cache=False)
    for i in range(3):
        s.add(req(f"r{i}", list(range(40))))
    done = run(s, alloc, tree)
    assert [r.cached_tokens for r in done] == [0, 0, 0]
    assert alloc.num_free == alloc.num_slots - 1


def test_in_queue_prefix_sharing_defers_duplicates():
    s, alloc, tree = make(max_prefill=512, chunk=512)
    shared = list(range(200))
    for i in range(4):
        s.add(req(f"q{i}", shared + [500 + i]))
    computed = []
    run(s, alloc, tree, on_batch=lambda b: computed.append(b.num_tokens))
    # The shared 200 tokens are computed once, then each request computes its own suffix.
    assert sum(computed) < 200 + 4 * 10 + 4 * 4


def test_without_a_cache_requests_sharing_a_prefix_are_admitted_together():
    """Deferring to a cache that stores nothing would admit one request per step (a prefill each)."""
    s, _, _ = make(cache=False, max_prefill=2048, chunk=512)
    shared = list(range(200))
    for i in range(4):
        s.add(req(f"q{i}", shared + [500 + i]))
    first = s.schedule()
    assert sorted(it.req.rid for it in first.items) == ["q0", "q1", "q2", "q3"]


def test_lpm_orders_by_cached_prefix():
    s, alloc, tree = make(max_running=1, policy="lpm")
    s.add(req("warm", list(range(30)), max_new=1))
    run(s, alloc, tree)
    s.add(req("cold", list(range(100, 130)), max_new=1))
    s.add(req("hot", list(range(30)) + [1, 2], max_new=1))
    order = []
    run(s, alloc, tree, on_batch=lambda b: order.extend(it.req.rid for it in b.items if it.req.rid not in order))
    assert order == ["hot", "cold"]


@pytest.mark.parametrize("cache", [True, False])
def test_memory_pressure_preempts_and_finishes_everything(cache):
    s, alloc, tree = make(slots=120, cache=cache, max_prefill=64, chunk=64)
    reqs = [req(f"r{i}", [i] * 30 + list(range(10)), max_new=20) for i in range(6)]
    for r in reqs:
        s.add(r)
    done = run(s, alloc, tree, steps=5000)
    assert {r.rid for r in done} == {r.rid for r in reqs}
    assert all(len(r.output_ids) == 20 for r in reqs)
    assert s.num_preemptions > 0
    freed = tree.reset()
    alloc.free(freed)
    assert alloc.num_free == alloc.num_slots - 1


def test_abort_waiting_and_running_release_everything():
    s, alloc, tree = make()
    a, b = req("a", range(20), max_new=50), req("b", range(30, 60), max_new=50)
    s.add(a)
    s.add(b)
    s.commit(s.schedule())
    s.abort(a)
    s.abort(b)
    assert not s.has_work()
    alloc.free(tree.reset())
    assert alloc.num_free == alloc.num_slots - 1


def test_overlapped_decode_follows_the_in_flight_step_or_declines():
    """With a step's samples still on the device, only its requests' next decode is scheduled, each at its
    kv_len (the host's fill_ids are one token short); anything that needs the host's tokens declines."""
    s, _, _ = make()
    a, b = req("a", range(8), max_new=10), req("b", range(20, 28), max_new=1)
    s.add(a)
    s.add(b)
    s.commit(s.schedule())  # both prefilled; their first samples are in flight
    batch = s.schedule([a, b])
    assert batch is not None and batch.in_flight_rows == [0]  # b's in-flight token is its last
    assert [(it.req.rid, it.start, it.extend, it.sample) for it in batch.items] == [("a", 8, 1, True)]
    assert s.schedule([b]) is None  # a runs outside the in-flight step
    s.add(req("c", range(40, 48)))
    assert s.schedule([a, b]) is None  # a request waits for admission


def test_device_row_is_rewritten_from_where_it_went_stale():
    s, _, _ = make(max_prefill=64, chunk=16)
    r = req("a", range(40), max_new=3)
    s.add(r)
    froms = []

    def step() -> None:
        batch = s.schedule()
        froms.append([(it.start, it.sync_from) for it in batch.items])
        s.commit(batch)
        if batch.items[0].sample:
            r.output_ids.append(7)

    for _ in range(5):
        step()
    # Each prefill chunk goes into the tree, whose slots replace the row's: the next step rewrites it whole.
    # A decode, which inserts nothing, leaves the row current: the next one writes its new position only.
    assert froms == [[(0, 0)], [(16, 0)], [(32, 0)], [(40, 0)], [(41, 41)]]


def test_delivery_is_deferred_only_with_overlap_on_and_grammars_only_where_allowed():
    s, _, _ = make()
    plain, constrained = req("a", range(4)), req("b", range(4))
    constrained.matcher = object()  # type: ignore[assignment]  # a stand-in: only its presence matters
    assert not s.can_defer_delivery([plain])
    s.limits.overlap_schedule = True
    assert s.can_defer_delivery([plain])
    assert s.can_defer_delivery([plain, constrained])
    s.limits.overlap_constrained = False
    assert s.can_defer_delivery([plain])
    assert not s.can_defer_delivery([plain, constrained])


def test_rewind_frees_the_positions_it_forgets_and_the_overlap_waits_for_unsampled_tokens():
    s, alloc, _ = make()
    s.limits.overlap_schedule = True
    r = req("a", range(8))
    s.add(r)
    batch = s.schedule()
    assert batch is not None
    s.commit(batch)
    r.output_ids.append(5)
    batch = s.schedule()  # the decode of token 5
    assert batch is not None and batch.is_decode
    s.commit(batch)
    free = alloc.num_free
    s.rewind(r, r.kv_len - 1)  # token 5 was replaced after its forward launched
    assert alloc.num_free == free + 1 and r.kv_len == 8 and r.synced_len <= 8
    r.output_ids[-1:] = [6, 7, 8]  # the replacement and two forced tokens: none sampled, none computed
    assert s.schedule([r]) is None  # no overlapped decode: the host's ids must go in an extend
    batch = s.schedule()
    assert batch is not None and [(it.start, it.extend, it.sync_from) for it in batch.items] == [(8, 3, 8)]


@pytest.mark.parametrize("cache", [True, False])
def test_forked_beams_share_their_parents_slots_and_give_each_back_once(cache):
    """Forks (and beams re-forked in place) hold their parent's slots (counted in beam_refs), beams decode
    together, and releasing every beam in any order frees each slot exactly once (or leaves it to the tree)."""
    from radixgen.runtime.sampling_params import SamplingParams

    s, alloc, tree = make(cache=cache, max_running=8)
    root = Req(rid="r", origin_ids=np.arange(1, 21, dtype=np.int64), params=SamplingParams(num_beams=3, temperature=0))
    s.add(root)
    while root.kv_len < 20:
        batch = s.schedule()
        s.commit(batch)
    root.beam_group = root.rid
    beams = []
    for i in range(3):
        child = Req(rid=f"b{i}", origin_ids=root.origin_ids, params=root.params, beam_group="r")
        s.fork(root, child)
        beams.append(child)
    s.start_beams(root)
    s.release_beam(root, ReqState.BEAMS)
    for step in range(4):  # each beam adds a token; beam 0 forks once more, the last beam is dropped
        for b in beams:
            b.output_ids.append(500 + step)
        batch = s.schedule()
        assert sorted(it.req.rid for it in batch.items) == sorted(b.rid for b in beams)
        s.commit(batch)
        views = [s.slot_view(b, 0, 20) for b in beams]
        assert all((v == views[0]).all() for v in views), "one copy of the prompt"
        if step % 2:  # the last beam dropped, a new request forked from beam 0
            extra = Req(rid=f"f{step}", origin_ids=root.origin_ids, params=root.params, beam_group="r",
                        output_ids=list(beams[0].output_ids))
            s.fork(beams[0], extra)
            s.release_beam(beams.pop())
            beams.append(extra)
        else:  # the last beam's request and row become beam 0's child
            row = beams[-1].req_pool_idx
            held_before = s.req_rows.allocations[row]
            beams[-1].output_ids = list(beams[0].output_ids)
            s.refork(beams[-1], beams[0])
            assert beams[-1].req_pool_idx == row and s.req_rows.allocations[row] == held_before + 1
            assert (s.slot_view(beams[-1]) == s.slot_view(beams[0])).all()
        owned = np.concatenate([s.slot_view(b, b.tree_len, b.kv_len) for b in beams])
        holders = np.unique(owned, return_counts=True)
        assert (s.beam_refs[holders[0]] == holders[1] - 1).all()
    for b in beams:
        s.finish(b)
    assert not s.beam_refs.any() and not s.running
    assert alloc.num_free + tree.stats().cached_tokens == alloc.num_slots - 1


def test_a_decoding_requests_multi_token_row_waits_for_its_finish_to_enter_the_tree():
    # a jump-forward row (forced tokens appended in one step) is a decode step's kind of work: inserting it into
    # the tree at every such step cost the loop a radix walk per request (the prompt's chunks are shared at once)
    s, alloc, tree = make(chunk=64)
    r = req("a", range(40), max_new=16)
    s.add(r)
    s.commit(s.schedule())
    prompt = tree.stats().cached_tokens
    assert prompt >= 32  # the prompt, shared at once
    r.output_ids += [500, 501, 502, 503]  # a sampled token and three forced ones
    batch = s.schedule()
    assert batch is not None and [(it.start, it.extend) for it in batch.items] == [(40, 4)]
    s.commit(batch)
    assert r.kv_len == 44 and tree.stats().cached_tokens == prompt
    check_slots(s, alloc, tree)
    s.finish(r)
    assert tree.stats().cached_tokens >= 43  # all it computed, at its finish
    check_slots(s, alloc, tree)
