"""Property tests: random programs of insert/match/lock/unlock/evict/reset against a naive oracle.

The oracle is a dict of every cached page-aligned prefix (per namespace) -> the slots of its last page. It
predicts match and insert exactly; for evict, whose choice depends on LRU ticks, it checks what any correct
eviction must satisfy: only cached, unlocked tokens are freed, what remains is still prefix-closed, and enough
is freed. The test also plays the caller, so it checks that no slot ever leaks or is held twice.
check_integrity() runs after every step. (LRU order itself is pinned by the unit tests.)
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixgen.radix import RadixCache, RadixNode

# Sequences = a cut of one of a few related base sequences + a short random tail over a tiny alphabet, so
# they share prefixes often and diverge at every offset, inside pages as well as at page boundaries.
BASES = [[0] * 16, [0] * 6 + [1] * 10, [0] * 3 + [2] * 13, [1, 2, 3, 0] * 4]
TOKENS = st.builds(
    lambda base, cut, tail: BASES[base][:cut] + tail,
    st.integers(0, len(BASES) - 1),
    st.integers(0, 16),
    st.lists(st.integers(0, 2), max_size=6),
)
NAMESPACES = st.sampled_from([None, "a"])
Prefix = tuple[Hashable, tuple[int, ...]]  # (namespace, tokens)


class RadixMachine(RuleBasedStateMachine):
    page_size = 1

    def __init__(self) -> None:
        super().__init__()
        self.cache = RadixCache(self.page_size)
        self.oracle: dict[Prefix, tuple[int, ...]] = {}  # every cached prefix -> slots of its last page
        self.locks: list[tuple[RadixNode, Hashable, tuple[int, ...]]] = []  # handle, namespace, locked prefix
        self.allocated = 0  # slots handed out so far are 0 .. allocated-1
        self.freed: list[int] = []  # slots the caller gave back to its allocator

    # ------------------------------------------------------------ the caller's side

    def alloc(self, n: int) -> np.ndarray:
        self.allocated += n
        return np.arange(self.allocated - n, self.allocated, dtype=np.int64)

    def expected_match(self, ns: Hashable, seq: list[int]) -> list[int]:
        page = self.page_size
        slots: list[int] = []
        for end in range(page, len(seq) + 1, page):
            page_slots = self.oracle.get((ns, tuple(seq[:end])))
            if page_slots is None:
                break
            slots.extend(page_slots)
        return slots

    def do_insert(self, ns: Hashable, seq: list[int], slots: np.ndarray, matched: int) -> None:
        expected_cached = len(self.expected_match(ns, seq))
        result = self.cache.insert(np.array(seq, dtype=np.int64), slots, namespace=ns)
        stored = len(seq) - len(seq) % self.page_size
        assert (result.cached_len, result.stored_len) == (expected_cached, stored)
        assert result.cached_len >= matched  # a locked match cannot have gone away
        page = self.page_size
        for end in range(result.cached_len + page, stored + 1, page):
            self.oracle[(ns, tuple(seq[:end]))] = tuple(slots[end - page : end].tolist())
        self.freed += slots[matched : result.cached_len].tolist() + slots[result.stored_len :].tolist()

    def protected(self) -> set[Prefix]:
        page = self.page_size
        return {
            (ns, locked[:end]) for _, ns, locked in self.locks for end in range(page, len(locked) + 1, page)
        }

    # ------------------------------------------------------------ rules

    @rule(ns=NAMESPACES, seq=TOKENS)
    def insert(self, ns, seq):
        self.do_insert(ns, seq, self.alloc(len(seq)), matched=0)

    @rule(ns=NAMESPACES, seq=TOKENS, keep_lock=st.booleans())
    def request(self, ns, seq, keep_lock):
        """The scheduler's round trip: match, lock, compute the rest, insert, unlock (or keep running)."""
        tokens = np.array(seq, dtype=np.int64)
        match = self.cache.match_prefix(tokens, namespace=ns)
        assert match.slots.tolist() == self.expected_match(ns, seq)
        self.cache.lock(match.node)
        slots = np.concatenate([match.slots, self.alloc(len(seq) - match.length)])
        self.do_insert(ns, seq, slots, matched=match.length)
        if keep_lock:
            self.locks.append((match.node, ns, tuple(seq[: match.length])))
        else:
            self.cache.unlock(match.node)

    @rule(ns=NAMESPACES, seq=TOKENS, lock=st.booleans())
    def match(self, ns, seq, lock):
        result = self.cache.match_prefix(np.array(seq, dtype=np.int64), namespace=ns)
        assert result.slots.tolist() == self.expected_match(ns, seq)
        assert result.length == len(result.slots)
        if lock:
            self.cache.lock(result.node)
            self.locks.append((result.node, ns, tuple(seq[: result.length])))

    @precondition(lambda self: self.locks)
    @rule(which=st.integers(0, 1000))
    def unlock(self, which):
        node, _, _ = self.locks.pop(which % len(self.locks))
        self.cache.unlock(node)

    @rule(num_tokens=st.integers(0, 16))
    def evict(self, num_tokens):
        evictable_before = self.cache.evictable_size()
        freed = self.cache.evict(num_tokens).tolist()
        assert len(freed) == len(set(freed))
        assert len(freed) >= num_tokens or self.cache.evictable_size() == 0
        assert self.cache.evictable_size() == evictable_before - len(freed)
        by_slot = {slot: prefix for prefix, page_slots in self.oracle.items() for slot in page_slots}
        removed = {by_slot[slot] for slot in freed}  # KeyError: a slot the tree should not have held
        assert sum(len(self.oracle[prefix]) for prefix in removed) == len(freed), "freed part of a page"
        assert not removed & self.protected(), "evicted a locked prefix"
        for prefix in removed:
            del self.oracle[prefix]
        for ns, tokens in self.oracle:
            parent = tokens[: -self.page_size]
            assert not parent or (ns, parent) in self.oracle, "eviction left a hole in a path"
        self.freed += freed

    @precondition(lambda self: not self.locks)
    @rule()
    def reset(self):
        self.freed += self.cache.reset().tolist()
        self.oracle.clear()

    # ------------------------------------------------------------ invariants

    @invariant()
    def tree_is_consistent(self):
        self.cache.check_integrity()

    @invariant()
    def sizes_match_oracle(self):
        protected = self.protected()
        assert self.cache.protected_size() == len(protected) * self.page_size
        assert self.cache.evictable_size() == (len(self.oracle) - len(protected)) * self.page_size

    @invariant()
    def no_slot_leaks_or_doubles(self):
        held = self.cache.all_slots().tolist()
        assert sorted(held) == sorted(slot for page_slots in self.oracle.values() for slot in page_slots)
        assert sorted(held + self.freed) == list(range(self.allocated))


class PagedRadixMachine(RadixMachine):
    page_size = 4


SETTINGS = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestRadixProperties = RadixMachine.TestCase
TestRadixProperties.settings = SETTINGS
TestPagedRadixProperties = PagedRadixMachine.TestCase
TestPagedRadixProperties.settings = SETTINGS
