"""Continuous-batching scheduler: which tokens of which requests the next forward computes.

Policy code only: ints, numpy arrays and handles, never tensors, so it runs and is tested on the CPU alone.
Each step builds one batch of every running request's next tokens (decodes cost one token each) plus prefill
chunks of waiting or partly prefilled requests, up to a token budget (chunked prefill). KV memory comes from
the slot allocator; when it runs short the radix tree evicts unlocked leaves, and when that is not enough the
newest running request is preempted: its computed KV goes into the tree (so re-admission often hits the
cache) and it is re-queued at the front with its generated tokens kept, never dropped.

With the overlap schedule on, a step's sampled tokens may still be on the device when the next step is
scheduled: `schedule(in_flight)` then builds that step's decode only (its input tokens read on the device), so
it launches before the samples reach the host; it declines, and the loop delivers the samples and schedules
normally, whenever admission, prefill chunks, eviction or preemption need the host's token ids, or a request
has tokens to compute that were not sampled (a grammar's jump-forward appended them).

Slot ownership invariant: every KV slot is exactly one of free (allocator), owned by the radix tree, or owned
by running requests (positions [tree_len, kv_len) of their slot buffers): by one, except the beams of a beam
search (and the candidates of a contrastive search), which share the positions they have in common;
`beam_refs` counts a slot's holders beyond the first. A search's beams are scheduled together (all decode in the
same step, or none does) and never preempted. A beam step's moves go in one call each (`refork_many`,
`release_beams`), which leave exactly what the one-by-one calls would.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from radixgen.radix import MatchResult, Namespace, PrefixCache
from radixgen.runtime.request import Req, ReqState
from radixgen.runtime.slot_buffer import SlotBuffer

if TYPE_CHECKING:
    from radixgen.runtime.kv_pool import ReqToTokenPool, SlotAllocator

SlotArray = npt.NDArray[np.int64]


@dataclass
class ScheduledReq:
    req: Req
    start: int  # first position computed (== req.kv_len when scheduled)
    extend: int  # positions computed this step
    sample: bool  # the step reaches the end of fill_ids: sample the next token from the last row
    sync_from: int  # the device req_to_token row is rewritten over [sync_from, start + extend)
    logits_from: int | None = None  # offset within the extend from which every row needs logits (prompt logprobs)
    drafts: int = 0  # a verify step: the extend is the last token plus this many drafted tokens, all sampled


@dataclass
class ScheduleBatch:
    items: list[ScheduledReq] = field(default_factory=list)
    preempted: list[Req] = field(default_factory=list)
    # An overlapped decode: item i's input token is row in_flight_rows[i] of the in-flight step's samples, still
    # on the device (the host's fill_ids are one token short). None: every input token is on the host.
    in_flight_rows: list[int] | None = None

    @property
    def num_tokens(self) -> int:
        return sum(it.extend for it in self.items)

    @property
    def is_decode(self) -> bool:
        return all(it.extend == 1 for it in self.items)


@dataclass
class SchedulerLimits:
    max_running_requests: int
    max_prefill_tokens: int  # prefill tokens per step (decodes are not counted)
    chunked_prefill_size: int  # per request per step; <= 0 disables chunking
    max_context: int
    schedule_policy: str = "lpm"
    lpm_queue_limit: int = 128  # above this queue length, lpm falls back to fcfs (matching costs grow)
    # Defer a request when another one is computing at least this many tokens of its uncached prefix: it waits
    # one step and takes them from the cache (prefill dominates; even a short shared chunk is worth it).
    share_defer_threshold: int = 8
    # Launch each decode step before the previous step's sampled tokens reach the host (see the module doc).
    overlap_schedule: bool = False
    # ... for steps of constrained requests too (their matchers then see each token after the next launch).
    overlap_constrained: bool = True


class Scheduler:
    """Waiting / running queues over a slot allocator, a req_to_token row pool and a prefix cache."""

    def __init__(self, limits: SchedulerLimits, allocator: SlotAllocator, req_rows: ReqToTokenPool,
                 prefix_cache: PrefixCache) -> None:
        self.limits = limits
        self.allocator = allocator
        self.req_rows = req_rows
        self.cache = prefix_cache
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.slots: dict[str, SlotBuffer] = {}
        self.beam_refs = np.zeros(allocator.num_slots, dtype=np.int32)  # holders of a slot beyond the first
        self._beam_rows: dict[str, int] = {}  # admitted searches' rows kept for their beams / candidates, by rid
        self.num_beams = 0  # running beams (requests forked by `fork`)
        self._admit_counter = itertools.count()
        self.num_preemptions = 0

    # ----------------------------------------------------------------- queues
    def add(self, req: Req) -> None:
        req.state = ReqState.WAITING
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def slot_view(self, req: Req, start: int = 0, stop: int | None = None) -> SlotArray:
        return self.slots[req.rid].view(start, stop)

    # ------------------------------------------------------------- allocation
    def _alloc(self, n: int) -> SlotArray | None:
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        slots = self.allocator.alloc(n)
        if slots is None:
            short = n - self.allocator.num_free
            freed = self.cache.evict(short)
            if len(freed):
                self.allocator.free(freed)
            slots = self.allocator.alloc(n)
        return slots

    # ------------------------------------------------------------ the step
    def schedule(self, in_flight: Sequence[Req] = ()) -> ScheduleBatch | None:
        """The next step's batch, or None when there is nothing to compute.

        `in_flight`: the requests of the step whose sampled tokens are still on the device. The batch is then
        their next decode (`in_flight_rows` set), or None when that step's tokens must be delivered first; the
        caller then delivers them and calls again without `in_flight`."""
        if in_flight:
            return self._schedule_overlapped(in_flight)
        batch = ScheduleBatch()
        budget = self.limits.max_prefill_tokens
        chunk = self.limits.chunked_prefill_size if self.limits.chunked_prefill_size > 0 else 1 << 62

        # 1. running requests: decodes first (one token each, plus its drafts), then continuing chunks.
        running = sorted(self.running, key=lambda r: (r.remaining > 1, r.admit_seq))
        beams: dict[str, list[Req]] = {}
        if self.num_beams:
            for req in running:
                if req.beam_group is not None:
                    beams.setdefault(req.beam_group, []).append(req)
        for req in running:
            if req.state is not ReqState.RUNNING:
                continue  # preempted earlier in this loop
            if req.beam_group is not None:
                self._schedule_beams(batch, beams.pop(req.beam_group, []), keep=req)
                continue
            drafts = len(req.draft_ids) if req.remaining == 1 else 0
            n = min(req.remaining, chunk) if req.remaining > 1 else 1 + drafts
            if req.remaining > 1:
                n = min(n, budget)
                if n <= 0:
                    continue
            slots = self._alloc(n)
            if slots is None and drafts:  # memory is short: verify no drafts rather than preempt for them
                drafts, n = 0, 1
                slots = self._alloc(n)
            while slots is None and self._preempt_one(batch, keep=req):
                slots = self._alloc(n)
            if slots is None:
                continue  # nothing left to preempt; try again next step
            if req.remaining > 1:
                budget -= n
            self._extend(batch, req, slots, drafts)

        # 2. admit waiting requests in policy order while budget and memory last.
        if budget > 0 and self.waiting:
            self._admit(batch, budget, chunk)
        return batch if batch.items else None

    def _schedule_beams(self, batch: ScheduleBatch, group: list[Req], keep: Req) -> None:
        """One decode position for every beam of a group, or for none of them (memory short)."""
        if not group:
            return  # scheduled with the group's first beam
        slots = self._alloc(len(group))
        while slots is None and self._preempt_one(batch, keep=keep):
            slots = self._alloc(len(group))
        if slots is None:
            return
        for req, slot in zip(group, np.split(slots, len(group))):
            self._extend(batch, req, slot)

    def _schedule_overlapped(self, in_flight: Sequence[Req]) -> ScheduleBatch | None:
        """One decode position, at its kv_len, for each in-flight request that is still running and may add a
        token after the one in flight (one whose in-flight token ends it by EOS or a stop string wastes that
        position). None when the synchronous path is needed: requests to admit, running requests outside the
        in-flight step (chunks to prefill), or memory short (evicting is tried; preempting is not)."""
        if self.waiting and len(self.running) < self.limits.max_running_requests:
            return None
        pending = {r.rid for r in in_flight}
        if any(r.rid not in pending for r in self.running):
            return None
        if any(r.state is ReqState.RUNNING and r.remaining > 0 for r in in_flight):
            return None  # tokens to compute beyond the one in flight (jump-forward): an extend, on the host's ids
        if any(len(r.draft_ids) for r in self.running):
            return None  # drafts to verify: a verify step, on the host's ids
        max_context = self.limits.max_context
        keep = [j for j, r in enumerate(in_flight)
                if r.state is ReqState.RUNNING and r.output_budget(max_context) > 1]
        if not keep:
            return None
        slots = self._alloc(len(keep))
        if slots is None:
            return None
        batch = ScheduleBatch(in_flight_rows=keep)
        for j, slot in zip(keep, np.split(slots, len(keep))):
            req = in_flight[j]
            batch.items.append(ScheduledReq(req, req.kv_len, 1, True, self._place(req, slot)))
        return batch

    def can_defer_delivery(self, reqs: Sequence[Req]) -> bool:
        """May the next step be scheduled while these requests' sampled tokens are still on the device? With the
        overlap schedule on, yes, constrained requests included where `overlap_constrained` (a matcher then sees
        its token after the next forward is launched, before that step samples)."""
        if not self.limits.overlap_schedule or not reqs:
            return False
        return self.limits.overlap_constrained or all(r.matcher is None for r in reqs)

    def rewind(self, req: Req, kv_len: int) -> None:
        """Forget the KV of positions [kv_len, req.kv_len) of a running request (computed for a token that was
        then replaced) and free their slots; the next step computes them again."""
        assert req.tree_len <= kv_len <= req.kv_len, "only positions the request owns can be rewound"
        buf = self.slots[req.rid]
        dropped = buf.view(kv_len, req.kv_len).copy()
        buf.truncate(kv_len)
        if len(dropped):
            self.allocator.free(dropped)
        req.kv_len = kv_len
        req.synced_len = min(req.synced_len, kv_len)

    def _extend(self, batch: ScheduleBatch, req: Req, slots: SlotArray, drafts: int = 0) -> None:
        """Positions [kv_len, kv_len + len(slots)) of `req` into the batch; the last `drafts` of them hold drafted
        tokens (a verify step), which are never cached: the engine rewinds the rejected ones."""
        start, n = req.kv_len, len(slots)
        sync_from = self._place(req, slots)
        logits_from = None
        if req.logprob_start_len is not None and req.output_ids == [] and start + n > req.logprob_start_len - 1:
            logits_from = max(req.logprob_start_len - 1 - start, 0)
        batch.items.append(ScheduledReq(req, start, n, start + n - drafts == req.fill_len, sync_from, logits_from,
                                        drafts))

    def _place(self, req: Req, slots: SlotArray) -> int:
        """Give positions [kv_len, kv_len + len(slots)) these slots; returns the first position whose device
        req_to_token entry the step must (re)write, the row then being current through the new positions."""
        start = req.kv_len
        buf = self.slots[req.rid]
        buf.truncate(start)
        buf.extend(slots)
        sync_from = min(req.synced_len, start)
        req.synced_len = start + len(slots)
        return sync_from

    def _admit(self, batch: ScheduleBatch, budget: int, chunk: int) -> None:
        lim = self.limits
        order = list(self.waiting)
        matches: dict[str, MatchResult] = {}
        if lim.schedule_policy == "lpm" and len(order) <= lim.lpm_queue_limit:
            for req in order:
                matches[req.rid] = self._match(req)
            order.sort(key=lambda r: -matches[r.rid].length)
        inflight = _InflightPrefixes(enabled=self.cache.stores_prefixes)
        for r in self.running:
            if r.remaining > 1:
                inflight.add(r)
        admitted: set[str] = set()
        kept_rows = sum(self._beam_rows.values())  # rows kept for admitted beam searches' beams
        for req in order:
            beam_rows = req.params.search_width - 1 if req.rid not in self._beam_rows else 0
            if budget <= 0 or len(self.running) + kept_rows + beam_rows >= lim.max_running_requests:
                break
            m = self._match(req)  # fresh: eviction for earlier admissions may have changed the tree
            # In-queue prefix sharing: if another request is computing a longer shared prefix right now,
            # wait one step and take it from the cache instead of computing it again.
            shared = inflight.shared_len(req)
            if shared - m.length >= lim.share_defer_threshold:
                continue
            row = self.req_rows.alloc()
            if row is None:
                break
            prefix_len = m.length
            n = min(req.fill_len - prefix_len, chunk, budget)
            self.cache.lock(m.node)
            slots = self._alloc(n)
            if slots is None:
                self.cache.unlock(m.node)
                self.req_rows.free(row)
                break
            buf = SlotBuffer(req.fill_len + 16)
            buf.extend(np.asarray(m.slots, dtype=np.int64))
            self.slots[req.rid] = buf
            req.req_pool_idx, req.node, req.tree_len, req.kv_len = row, m.node, prefix_len, prefix_len
            req.synced_len = 0
            if not req.admitted_once:
                req.cached_tokens = prefix_len
                req.admitted_once = True
            req.admit_seq = next(self._admit_counter)
            if beam_rows:
                self._beam_rows[req.rid] = beam_rows
                kept_rows += beam_rows
            req.state = ReqState.RUNNING
            self.running.append(req)
            admitted.add(req.rid)
            budget -= n
            self._extend(batch, req, slots)
            inflight.add(req)
        if admitted:
            self.waiting = deque(r for r in self.waiting if r.rid not in admitted)

    def _match(self, req: Req) -> MatchResult:
        ids = req.fill_ids()
        limit = req.fill_len - 1  # always compute at least one token: its logits are sampled
        floor = req.scoring_floor
        if floor is not None:
            limit = min(limit, floor)
        return self.cache.match_prefix(ids[:limit], namespace=req.namespace)

    # ----------------------------------------------------------- after forward
    def commit(self, batch: ScheduleBatch) -> None:
        """Record the computed positions; share finished prefill chunks through the tree (not a decoding
        request's few appended tokens, a jump-forward row: like a decode step's, they wait for its finish)."""
        for it in batch.items:
            it.req.kv_len = it.start + it.extend
            if it.extend > 1 and not it.drafts and it.start < it.req.prompt_len:
                self._cache_computed(it.req)

    def _cache_computed(self, req: Req) -> None:
        """Insert positions [0, kv_len) into the tree; free our duplicates; re-lock the deeper node."""
        ids = req.fill_ids()[: req.kv_len]
        buf = self.slots[req.rid]
        res = self.cache.insert(ids, buf.view(0, req.kv_len), namespace=req.namespace)
        if res.cached_len > req.tree_len:
            self.allocator.free(buf.view(req.tree_len, res.cached_len).copy())
        if res.stored_len <= req.tree_len:
            return  # nothing new went into the tree (caching off, or a partial page)
        m = self.cache.match_prefix(ids[: res.stored_len], namespace=req.namespace)
        buf.replace(0, np.asarray(m.slots, dtype=np.int64))
        self.cache.lock(m.node)
        assert req.node is not None, "a running request holds its tree node"
        self.cache.unlock(req.node)
        req.node, req.tree_len = m.node, m.length
        req.synced_len = 0  # row entries were replaced by the tree's slots

    # --------------------------------------------------------------- release
    def finish(self, req: Req) -> None:
        """Release everything a running request holds; its computed KV goes into the tree (a beam's is
        dropped: it shares its slots with the other beams)."""
        self._beam_rows.pop(req.rid, None)
        if req.state is ReqState.RUNNING:
            if req.beam_group is not None:
                self.release_beam(req)
            else:
                self._release(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.state = ReqState.FINISHED

    # ------------------------------------------------------------- beams
    def fork(self, parent: Req, child: Req) -> None:
        """Make `child` (the parent's tokens so far, not yet running) a running beam holding the parent's
        computed positions: its own table row, the parent's slots (shared, counted in `beam_refs`), the
        parent's tree node locked once more. The caller keeps the rows it needs (a search's admission keeps
        its width: num_beams beams, or top_k contrastive candidates)."""
        assert parent.state is ReqState.RUNNING and parent.node is not None, "forks come from a running request"
        row = self.req_rows.alloc()
        if row is None:
            raise RuntimeError("no request row left for a fork (admission keeps a search's width of rows)")
        held = self.slots[parent.rid].view(0, parent.kv_len)
        buf = SlotBuffer(child.fill_len + 16)
        buf.extend(held)
        self.slots[child.rid] = buf
        self.beam_refs[held[parent.tree_len:]] += 1
        self.cache.lock(parent.node)
        child.req_pool_idx, child.node, child.tree_len, child.kv_len = row, parent.node, parent.tree_len, parent.kv_len
        child.synced_len = 0
        child.cached_tokens, child.admitted_once, child.admit_seq = parent.cached_tokens, True, parent.admit_seq
        child.state = ReqState.RUNNING
        self.running.append(child)
        self.num_beams += 1

    def start_beams(self, root: Req) -> None:
        """The rows kept at admission for a beam search's beams are theirs now."""
        self._beam_rows.pop(root.rid, None)

    def refork(self, beam: Req, parent: Req) -> None:
        """Make running beam `beam` a fork of `parent` in place: it gives back the slots no other beam holds and
        holds the parent's instead (its row and its place among the running requests are kept: a dropped beam
        becomes a new child without a release and a fork)."""
        assert parent.node is not None and beam.node is not None, "running beams hold tree nodes"
        buf = self.slots[beam.rid]
        self._give_back_beam_slots(buf.view(beam.tree_len, beam.kv_len))
        held = self.slots[parent.rid].view(0, parent.kv_len)
        buf.truncate(0)
        buf.extend(held)
        self.beam_refs[held[parent.tree_len:]] += 1
        if beam.node is not parent.node:
            self.cache.lock(parent.node)
            self.cache.unlock(beam.node)
        beam.node, beam.tree_len, beam.kv_len, beam.synced_len = parent.node, parent.tree_len, parent.kv_len, 0
        assert beam.req_pool_idx is not None, "a running beam holds a row"
        self.req_rows.rehold(beam.req_pool_idx)  # state kept per row (decode K/V copies) is not the new sequence's

    def refork_many(self, beams: Sequence[Req], parents: Sequence[Req]) -> None:
        """`refork(beams[i], parents[i])` for every i in order: the same slots freed (in the same order), holders
        counted, rows re-held and nodes locked. The beams are distinct and none of them is a parent (a step's
        dropped beams are not continued in that step).

        The beams of a search, each reforked from another beam of it, stand on one tree node at one length:
        for those the accounting is array work over all of them at once (`_refork_level`). Any other pair
        (across searches or lengths) makes the call go one by one."""
        if not beams:
            return
        assert len(beams) == len(parents), "one parent per beam"
        targets = {id(b) for b in beams}
        assert len(targets) == len(beams) and not targets & {id(p) for p in parents}, \
            "distinct beams, none of them a parent"
        if all(b.node is p.node and b.tree_len == p.tree_len and b.kv_len == p.kv_len
               for b, p in zip(beams, parents)):
            self._refork_level(beams, parents)
            return
        for beam, parent in zip(beams, parents):
            self.refork(beam, parent)

    def _refork_level(self, beams: Sequence[Req], parents: Sequence[Req]) -> None:
        """`refork_many` where each beam stands on its parent's node at its parent's tree_len and kv_len. A beam
        and its parent hold the same slots up to where they parted; there, giving a slot back and taking it
        again cancel out, so only the positions from there on are given back, counted and copied."""
        bufs = [self.slots[b.rid] for b in beams]
        srcs = [self.slots[p.rid] for p in parents]
        lo = [b.tree_len for b in beams]
        mine = np.concatenate([buf.view(t, b.kv_len) for buf, b, t in zip(bufs, beams, lo)])
        theirs = np.concatenate([src.view(t, b.kv_len) for src, b, t in zip(srcs, beams, lo)])
        lengths = np.fromiter((b.kv_len - t for b, t in zip(beams, lo)), dtype=np.int64, count=len(beams))
        ends = np.cumsum(lengths)
        starts = ends - lengths
        kept = lengths.copy()  # positions each beam shares with its parent, from its tree_len
        differ = np.flatnonzero(mine != theirs)
        if len(differ):
            pair = np.searchsorted(ends, differ, side="right")
            at, first = np.unique(pair, return_index=True)  # the pairs that differ, and where they first do
            kept[at] = differ[first] - starts[at]
        tail = np.arange(len(mine)) >= np.repeat(starts + kept, lengths)  # positions after the parting
        self._give_back_many(np.split(mine[tail], np.cumsum(lengths - kept)[:-1]))
        gained = theirs[tail]
        if len(gained):
            np.add.at(self.beam_refs, gained, 1)  # a parent of several beams gains each of them as a holder
        for beam, parent, buf, src, cut in zip(beams, parents, bufs, srcs, (np.asarray(lo) + kept).tolist()):
            buf.truncate(cut)
            buf.extend(src.view(cut, parent.kv_len))
            beam.synced_len = 0
            assert beam.req_pool_idx is not None, "a running beam holds a row"
            self.req_rows.rehold(beam.req_pool_idx)

    def _give_back_beam_slots(self, owned: SlotArray) -> None:
        """Free the slots of `owned` no other beam holds; the others lose one holder."""
        shared = self.beam_refs[owned] > 0
        if (~shared).any():
            self.allocator.free(owned[~shared].copy())
        self.beam_refs[owned[shared]] -= 1

    def _give_back_many(self, blocks: Sequence[SlotArray]) -> None:
        """`_give_back_beam_slots(block)` for each block in order (each block's slots distinct), with one free:
        every slot loses one holder per block holding it; one whose holders were all among the blocks is freed
        at its last block, and the free stack ends as the one-by-one calls leave it (block by block)."""
        refs = self.beam_refs
        for block in blocks:
            refs[block] -= 1
        freed = []
        for block in reversed(blocks):  # a freed slot's last block is the first one met from the end
            gone = block[refs[block] < 0]
            if len(gone):
                refs[gone] = 0
                freed.append(gone)
        if freed:
            self.allocator.free(np.concatenate(freed) if len(freed) > 1 else freed[0])

    def release_beams(self, reqs: Sequence[Req], state: ReqState = ReqState.FINISHED) -> None:
        """`release_beam(req, state)` for every request in order (distinct running beams), the slots given back
        at once and the running list filtered once."""
        if not reqs:
            return
        bufs = [self.slots.pop(r.rid) for r in reqs]
        self._give_back_many([buf.view(r.tree_len, r.kv_len) for r, buf in zip(reqs, bufs)])
        for req in reqs:
            assert req.node is not None and req.req_pool_idx is not None, "a running request holds a node and a row"
            self.cache.unlock(req.node)
            self.req_rows.free(req.req_pool_idx)
            req.node, req.req_pool_idx, req.tree_len, req.kv_len = None, None, 0, 0
        gone = {id(r) for r in reqs}
        self.running[:] = [r for r in self.running if id(r) not in gone]
        if state is not ReqState.BEAMS:
            self.num_beams -= len(reqs)
        for req in reqs:
            req.state = state

    def release_beam(self, req: Req, state: ReqState = ReqState.FINISHED) -> None:
        """Give back a running beam's row, node lock and the slots no other beam holds (nothing is cached)."""
        buf = self.slots.pop(req.rid)
        self._give_back_beam_slots(buf.view(req.tree_len, req.kv_len))
        assert req.node is not None and req.req_pool_idx is not None, "a running request holds a node and a row"
        self.cache.unlock(req.node)
        self.req_rows.free(req.req_pool_idx)
        req.node, req.req_pool_idx, req.tree_len, req.kv_len = None, None, 0, 0
        self._drop_running(req)
        if state is not ReqState.BEAMS:  # a beam (the search's own request, released at its start, is none)
            self.num_beams -= 1
        req.state = state

    def _release(self, req: Req) -> None:
        """Give the computed KV to the tree (which keeps what it stores) and free the rest."""
        buf = self.slots.pop(req.rid)
        res = self.cache.insert(req.fill_ids()[: req.kv_len], buf.view(0, req.kv_len), namespace=req.namespace)
        if res.cached_len > req.tree_len:
            self.allocator.free(buf.view(req.tree_len, res.cached_len).copy())
        tail = buf.view(max(res.stored_len, req.tree_len))
        if len(tail):
            self.allocator.free(tail.copy())
        assert req.node is not None and req.req_pool_idx is not None, "a running request holds a node and a row"
        self.cache.unlock(req.node)
        self.req_rows.free(req.req_pool_idx)
        req.node, req.req_pool_idx, req.tree_len, req.kv_len = None, None, 0, 0
        self._drop_running(req)

    def _drop_running(self, req: Req) -> None:
        """Take `req` out of the running list, found by identity (Req's dataclass equality compares every field)."""
        for i, r in enumerate(self.running):
            if r is req:
                del self.running[i]
                return

    def _preempt_one(self, batch: ScheduleBatch, keep: Req) -> bool:
        """Preempt the newest running request (not `keep`, not already in this batch)."""
        in_batch = {it.req.rid for it in batch.items}
        victims = [r for r in self.running if r is not keep and r.rid not in in_batch and r.beam_group is None]
        if not victims:
            return False
        victim = max(victims, key=lambda r: r.admit_seq)
        self._release(victim)
        victim.state = ReqState.WAITING
        self.waiting.appendleft(victim)
        batch.preempted.append(victim)
        self.num_preemptions += 1
        return True

    def abort(self, req: Req) -> None:
        self.finish(req)


class _InflightPrefixes:
    """Token sequences being computed this step, to detect waiting requests that share their prefix.

    Disabled (records nothing, shares nothing) when the cache stores nothing: waiting would then gain nothing,
    and every request sharing a prefix would be admitted one step after the previous one."""

    def __init__(self, enabled: bool = True) -> None:
        self._enabled = enabled
        self._seqs: list[tuple[Namespace, npt.NDArray[np.int64]]] = []

    def add(self, req: Req) -> None:
        if self._enabled:
            self._seqs.append((req.namespace, req.fill_ids()))

    def shared_len(self, req: Req) -> int:
        ids = req.fill_ids()
        best = 0
        for ns, seq in self._seqs:
            if ns != req.namespace:
                continue
            n = min(len(seq), len(ids) - 1)
            if n <= best:
                continue
            neq = np.flatnonzero(seq[:n] != ids[:n])
            best = max(best, int(neq[0]) if len(neq) else n)
        return best
