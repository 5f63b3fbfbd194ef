"""The scheduler's batched beam bookkeeping (`refork_many`, `release_beams`) leaves exactly what the one-by-one
calls (`refork`, `release_beam`) leave: twin schedulers fed the same random sequences of forks, reforks,
releases and decode steps, one through each, are compared after every call (free slot stack, request rows,
beam refs, running list, every request's slots and node, the tree's locks). Mutants of the batched calls (a
swapped parent, a reordered free, a miscounted holder, a row not re-held, a lock left behind) are caught by
the same comparison. The engine's beam step gives the same searches and state with either kind of call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from radixgen.radix import NoPrefixCache, PrefixCache, RadixCache
from radixgen.radix.node import RadixNode
from radixgen.runtime.beam_steps import BeamSearches, EndedSearch
from radixgen.runtime.kv_pool import ReqToTokenPool, SlotAllocator
from radixgen.runtime.request import Req, ReqState
from radixgen.runtime.sampling_params import SamplingParams
from radixgen.runtime.scheduler import Scheduler, SchedulerLimits

MAX_CONTEXT = 512
VOCAB = 40
EOS = 2


class OneByOne(Scheduler):
    """The batched calls as loops over the one-by-one ones (the reference)."""

    def refork_many(self, beams: Sequence[Req], parents: Sequence[Req]) -> None:
        for beam, parent in zip(beams, parents):
            self.refork(beam, parent)

    def release_beams(self, reqs: Sequence[Req], state: ReqState = ReqState.FINISHED) -> None:
        for req in reqs:
            self.release_beam(req, state)


def make(kind: type[Scheduler], cache: bool, slots: int = 6000, rows: int = 64) -> Scheduler:
    limits = SchedulerLimits(max_running_requests=rows, max_prefill_tokens=64, chunked_prefill_size=24,
                             max_context=MAX_CONTEXT)
    tree: PrefixCache = RadixCache() if cache else NoPrefixCache()
    return kind(limits, SlotAllocator(slots + 1), ReqToTokenPool(rows + 4, MAX_CONTEXT + 1, "cpu"), tree)


# ----------------------------------------------------------------- comparison
def _path(node: RadixNode | None) -> tuple[int, ...] | None:
    """A node by the tokens from its root (equal in twin trees)."""
    if node is None:
        return None
    keys = []
    while node is not None:
        keys.append(node.key.tolist())
        node = node.parent
    return tuple(t for key in reversed(keys) for t in key)


def _tree(cache: PrefixCache) -> list[tuple[tuple[int, ...] | None, tuple[int, ...], int]]:
    """Every node of a radix tree (path, slots, lock count), in path order; nothing for the stand-in."""
    if not isinstance(cache, RadixCache):
        return []
    out = []
    todo = list(cache._roots.values())
    while todo:
        node = todo.pop()
        out.append((_path(node), tuple(node.value.tolist()), node.lock_ref))
        todo.extend(node.children.values())
    return sorted(out)


def assert_same(a: Scheduler, b: Scheduler, reqs_a: dict[str, Req], reqs_b: dict[str, Req]) -> None:
    """Twin schedulers (and their twin requests, by rid) hold exactly the same state."""
    assert a.allocator.num_free == b.allocator.num_free, "free slot count"
    n = a.allocator.num_free
    assert np.array_equal(a.allocator._free[:n], b.allocator._free[:n]), "free slot stack"
    assert a.req_rows._free_rows == b.req_rows._free_rows, "free request rows"
    assert np.array_equal(a.req_rows.allocations, b.req_rows.allocations), "row holders"
    assert np.array_equal(a.beam_refs, b.beam_refs), "beam refs"
    assert [r.rid for r in a.running] == [r.rid for r in b.running], "running list"
    assert a.num_beams == b.num_beams and a._beam_rows == b._beam_rows, "beam counts"
    assert sorted(a.slots) == sorted(b.slots), "slot buffers held"
    for rid, buf in a.slots.items():
        assert np.array_equal(buf.view(), b.slots[rid].view()), f"slots of {rid}"
    for rid, ra in reqs_a.items():
        rb = reqs_b[rid]
        assert (ra.state, ra.req_pool_idx, ra.tree_len, ra.kv_len, ra.synced_len) == \
            (rb.state, rb.req_pool_idx, rb.tree_len, rb.kv_len, rb.synced_len), f"request {rid}"
        assert _path(ra.node) == _path(rb.node), f"node of {rid}"
        assert ra.output_ids == rb.output_ids, f"tokens of {rid}"
    assert _tree(a.cache) == _tree(b.cache), "tree slots and locks"
    assert a.cache.evictable_size() == b.cache.evictable_size()
    assert a.cache.protected_size() == b.cache.protected_size()


def check_holders(s: Scheduler) -> None:
    """Every slot is free, cached or owned, owned ones counted once per holder beyond the first."""
    owned = [s.slot_view(r, r.tree_len, r.kv_len) for r in s.running]
    slots, holders = np.unique(np.concatenate(owned), return_counts=True) if owned else (np.zeros(0, int),) * 2
    assert (s.beam_refs[slots] == holders - 1).all()
    assert np.count_nonzero(s.beam_refs) == np.count_nonzero(holders > 1)
    assert s.allocator.num_free + s.cache.stats().cached_tokens + len(slots) == s.allocator.num_slots - 1


# ----------------------------------------------------------------- random sequences
@dataclass
class Twin:
    """One scheduler and its requests by rid."""

    s: Scheduler
    reqs: dict[str, Req] = field(default_factory=dict)

    def beams(self) -> list[Req]:
        return [r for r in self.s.running if r.beam_group is not None]


def _roots(rng: np.random.Generator, n: int) -> list[tuple[str, np.ndarray]]:
    """Prompts of `n` searches, some sharing a prefix (so searches share tree nodes)."""
    base = rng.integers(3, VOCAB, size=30)
    out = []
    for g in range(n):
        keep = int(rng.integers(0, 30)) if g % 2 else 0
        tail = rng.integers(3, VOCAB, size=int(rng.integers(5, 40)))
        out.append((f"r{g}", np.concatenate([base[:keep], tail]).astype(np.int64)))
    return out


def _start(twin: Twin, roots: list[tuple[str, np.ndarray]], widths: list[int]) -> None:
    """Prefill every root, then fork its first beams from it as the engine does."""
    s = twin.s
    for rid, ids in roots:
        twin.reqs[rid] = Req(rid=rid, origin_ids=ids, params=SamplingParams(num_beams=4, temperature=0))
        s.add(twin.reqs[rid])
    while any(twin.reqs[rid].kv_len < len(ids) for rid, ids in roots):
        batch = s.schedule()
        assert batch is not None
        s.commit(batch)
    for (rid, _), width in zip(roots, widths):
        root = twin.reqs[rid]
        root.beam_group = rid
        for k in range(width):
            child = Req(rid=f"{rid}#{k}", origin_ids=root.origin_ids, params=root.params, beam_group=rid)
            twin.reqs[child.rid] = child
            s.fork(root, child)
        s.start_beams(root)
        s.release_beam(root, ReqState.BEAMS)


Op = Callable[[Twin, bool], None]  # applied to a twin, batched or one by one


def _decode(tokens: dict[str, int]) -> Op:
    def op(twin: Twin, batched: bool) -> None:
        for r in twin.beams():
            r.output_ids.append(tokens[r.rid])
        batch = twin.s.schedule()
        assert batch is not None and all(it.extend == 1 for it in batch.items)
        twin.s.commit(batch)
    return op


def _reforks(pairs: list[tuple[str, str]]) -> Op:
    def op(twin: Twin, batched: bool) -> None:
        beams = [twin.reqs[b] for b, _ in pairs]
        parents = [twin.reqs[p] for _, p in pairs]
        for beam, parent in zip(beams, parents):
            beam.output_ids = list(parent.output_ids)
        if batched:
            twin.s.refork_many(beams, parents)
        else:
            for beam, parent in zip(beams, parents):
                twin.s.refork(beam, parent)
    return op


def _releases(rids: list[str]) -> Op:
    def op(twin: Twin, batched: bool) -> None:
        reqs = [twin.reqs[r] for r in rids]
        if batched:
            twin.s.release_beams(reqs)
        else:
            for r in reqs:
                twin.s.release_beam(r)
    return op


def _forks(pairs: list[tuple[str, str]]) -> Op:
    def op(twin: Twin, batched: bool) -> None:
        for child_rid, parent_rid in pairs:
            parent = twin.reqs[parent_rid]
            child = Req(rid=child_rid, origin_ids=parent.origin_ids, params=parent.params,
                        beam_group=parent.beam_group, output_ids=list(parent.output_ids))
            twin.reqs[child_rid] = child
            twin.s.fork(parent, child)
    return op


def random_ops(rng: np.random.Generator, twin: Twin, step: int) -> list[Op]:
    """One round of moves chosen from `twin`'s state (the same for both twins): a decode, then reforks (some
    across searches, some several children of one parent), releases and forks."""
    beams = twin.beams()
    ops: list[Op] = [_decode({r.rid: int(rng.integers(3, VOCAB)) for r in beams})]
    rids = [r.rid for r in beams]
    order = rng.permutation(len(rids))
    n_drop = int(rng.integers(0, max(1, len(rids) // 2) + 1))
    dropped = [rids[i] for i in order[:n_drop]]
    kept = [rids[i] for i in order[n_drop:]]
    if kept and dropped:
        group = {r.rid: r.beam_group for r in beams}
        pairs = []
        for d in dropped:
            same = [k for k in kept if group[k] == group[d]]
            pool = same if same and rng.random() < 0.8 else kept
            pairs.append((d, pool[int(rng.integers(0, len(pool)))]))
        ops.append(_reforks(pairs))
    free_rows = twin.s.req_rows.num_free
    released: list[str] = []
    if len(rids) > 4 and rng.random() < 0.5:
        released = [rids[i] for i in rng.permutation(len(rids))[: int(rng.integers(1, 4))]]
        ops.append(_releases(released))
    alive = [k for k in kept if k not in released]
    if alive and free_rows > 4 and rng.random() < 0.5:
        ops.append(_forks([(f"f{step}.{k}", alive[int(rng.integers(0, len(alive)))])
                           for k in range(int(rng.integers(1, 4)))]))
    return ops


def run_twins(seed: int, cache: bool, batched_kind: type[Scheduler] = Scheduler, steps: int = 30) -> None:
    rng = np.random.default_rng(seed)
    a, b = Twin(make(OneByOne, cache)), Twin(make(batched_kind, cache))
    roots = _roots(rng, 5)
    widths = [int(rng.integers(1, 5)) for _ in roots]
    for twin in (a, b):
        _start(twin, roots, widths)
    assert_same(a.s, b.s, a.reqs, b.reqs)
    for step in range(steps):
        if not a.beams():
            break
        for op in random_ops(rng, a, step):
            op(a, False)
            op(b, True)
            assert_same(a.s, b.s, a.reqs, b.reqs)
            check_holders(b.s)
    for twin, batched in ((a, False), (b, True)):
        _releases([r.rid for r in twin.beams()])(twin, batched)
    assert_same(a.s, b.s, a.reqs, b.reqs)
    assert not b.s.beam_refs.any() and not b.s.running


@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_batched_beam_bookkeeping_equals_one_by_one(seed, cache):
    run_twins(seed, cache)


def test_batched_give_back_frees_shared_slots_at_their_last_holder():
    """Three beams sharing slots given back at once (`_give_back_many`, for releases and reforks): each slot
    freed once, in the one-by-one order, an outside holder kept."""
    blocks = [np.array([5, 6, 9], dtype=np.int64), np.array([5, 7], dtype=np.int64),
              np.array([6, 8, 5], dtype=np.int64)]
    stacks = []
    for batched in (False, True):
        s = make(Scheduler, cache=False)
        s.beam_refs[[5, 6, 7, 8, 9]] = [2, 1, 0, 0, 1]  # 5 held by the three blocks, 9 by one and someone else
        taken = s.allocator.alloc(20)
        assert taken is not None
        s.allocator.free(np.setdiff1d(taken, [5, 6, 7, 8, 9]))
        if not batched:
            for block in blocks:
                s._give_back_beam_slots(block)
        else:
            s._give_back_many(blocks)
        n = s.allocator.num_free
        stacks.append(s.allocator._free[:n].tolist())
        assert s.beam_refs[9] == 0 and not s.beam_refs.any()
    assert stacks[0] == stacks[1]
    assert sorted(stacks[0][-4:]) == [5, 6, 7, 8]


# ----------------------------------------------------------------- mutants
class SwappedParents(Scheduler):
    def refork_many(self, beams: Sequence[Req], parents: Sequence[Req]) -> None:
        super().refork_many(beams, list(parents[1:]) + list(parents[:1]))


class ReversedFrees(Scheduler):
    def _reversed_frees(self, call: Callable[[], None]) -> None:
        free = self.allocator.free
        self.allocator.free = lambda slots: free(np.asarray(slots)[::-1])
        try:
            call()
        finally:
            del self.allocator.free

    def refork_many(self, beams: Sequence[Req], parents: Sequence[Req]) -> None:
        self._reversed_frees(lambda: super(ReversedFrees, self).refork_many(beams, parents))

    def release_beams(self, reqs: Sequence[Req], state: ReqState = ReqState.FINISHED) -> None:
        self._reversed_frees(lambda: super(ReversedFrees, self).release_beams(reqs, state))


class LostHolder(Scheduler):
    def _give_back_many(self, blocks: Sequence[np.ndarray]) -> None:
        super()._give_back_many(blocks)
        owned = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.int64)
        if len(owned) > 1:
            self.beam_refs[owned[0]] += 1  # a slot given back twice counted once


class NoRehold(Scheduler):
    def refork_many(self, beams: Sequence[Req], parents: Sequence[Req]) -> None:
        super().refork_many(beams, parents)
        for beam in beams[:1]:
            assert beam.req_pool_idx is not None
            self.req_rows.allocations[beam.req_pool_idx] -= 1


class LockLeft(Scheduler):
    def release_beams(self, reqs: Sequence[Req], state: ReqState = ReqState.FINISHED) -> None:
        nodes = [r.node for r in reqs]
        super().release_beams(reqs, state)
        for node in nodes[:1]:
            assert node is not None
            self.cache.lock(node)


@pytest.mark.parametrize("mutant", [SwappedParents, ReversedFrees, LostHolder, NoRehold, LockLeft])
def test_the_comparison_catches_a_wrong_batched_update(mutant):
    caught = 0
    for seed in range(4):
        try:
            run_twins(seed, cache=True, batched_kind=mutant, steps=12)
        except AssertionError:
            caught += 1
    assert caught, f"{mutant.__name__} went unnoticed"


# ----------------------------------------------------------------- the engine's beam step
@dataclass
class Loop:
    """A stand-in engine loop: a scheduler, its beam searches, the requests seen (by rid), arrivals by step."""

    s: Scheduler
    searches: BeamSearches
    arrivals: dict[int, list[Req]]
    gen: torch.Generator
    reqs: dict[str, Req] = field(default_factory=dict)

    def step(self, step: int) -> list[EndedSearch]:
        """One engine step: arrivals join, the batch is computed (random logits), the beam searches step."""
        s = self.s
        for req in self.arrivals.get(step, []):
            self.reqs[req.rid] = req
            s.add(req)
        batch = s.schedule()
        if batch is None:
            return []
        s.commit(batch)
        sampled = [it.req for it in batch.items if it.sample]
        logits = torch.randn(len(sampled), VOCAB, generator=self.gen)
        logits[:, EOS] += 1.5  # searches end at different steps
        ended = self.searches.step(sampled, logits, np.arange(len(sampled))) if sampled else []
        for req in s.running:
            self.reqs.setdefault(req.rid, req)
        for e in ended:
            s.finish(e.root)
        return ended


def _loop(kind: type[Scheduler], cache: bool) -> Loop:
    """Eight searches of widths 2..5 and different options, arriving at different steps."""
    s = make(kind, cache)
    arrivals: dict[int, list[Req]] = {}
    for g in range(8):
        params = SamplingParams(num_beams=2 + g % 4, temperature=0, max_new_tokens=6 + 3 * (g % 3),
                                num_return_sequences=2, length_penalty=0.5 * (g % 3))
        ids = (np.arange(10 + g) * (g + 3) % (VOCAB - 3) + 3).astype(np.int64)
        arrivals.setdefault(g * 2 % 11, []).append(Req(rid=f"q{g}", origin_ids=ids, params=params))
    searches = BeamSearches(s, lambda reqs: (None, None), frozenset({EOS}), VOCAB, MAX_CONTEXT)
    return Loop(s, searches, arrivals, torch.Generator().manual_seed(3))


@pytest.mark.parametrize("cache", [True, False])
def test_the_beam_step_with_batched_calls_equals_it_with_one_by_one_calls(cache):
    """Searches arriving at different steps (so first forks, reforks and ended searches share steps): the
    searches return the same hypotheses and the schedulers hold the same state after each step."""
    a, b = _loop(OneByOne, cache), _loop(Scheduler, cache)
    results = 0
    for step in range(200):
        ended_a, ended_b = a.step(step), b.step(step)
        assert [(e.root.rid, e.results) for e in ended_a] == [(e.root.rid, e.results) for e in ended_b]
        results += len(ended_b)
        assert_same(a.s, b.s, a.reqs, b.reqs)
        check_holders(b.s)
        if step > 12 and not a.s.has_work():
            break
    assert results == 8 and not b.s.running and not b.s.beam_refs.any() and not b.searches.runs
