"""Table-driven unit tests of each RadixCache verb, the stand-in NoPrefixCache, and check_integrity itself."""

from __future__ import annotations

import numpy as np
import pytest

from radixgen.radix import InsertResult, NoPrefixCache, PrefixCache, RadixCache


def ids(*tokens: int) -> np.ndarray:
    return np.array(tokens, dtype=np.int64)


def slots_for(tokens: np.ndarray, base: int) -> np.ndarray:
    """Distinct, recognisable slots: base + position."""
    return np.arange(base, base + len(tokens), dtype=np.int64)


def build(page_size: int, *seqs: tuple[int, ...]) -> RadixCache:
    """A cache holding `seqs`, the i-th inserted with slots 100*(i+1) + position."""
    cache = RadixCache(page_size)
    for i, seq in enumerate(seqs):
        cache.insert(ids(*seq), slots_for(ids(*seq), 100 * (i + 1)))
    cache.check_integrity()
    return cache


# ---------------------------------------------------------------- match_prefix

MATCH_CASES = [
    # (page_size, inserted sequences, query, expected slots)
    (1, [], (1, 2, 3), []),
    (1, [(1, 2, 3)], (), []),
    (1, [(1, 2, 3)], (1, 2, 3), [100, 101, 102]),
    (1, [(1, 2, 3)], (1, 2, 3, 4), [100, 101, 102]),
    (1, [(1, 2, 3)], (1, 2), [100, 101]),  # ends inside the edge: split
    (1, [(1, 2, 3)], (1, 9), [100]),
    (1, [(1, 2, 3)], (9, 2, 3), []),
    (1, [(1, 2, 3), (1, 2, 4)], (1, 2, 4, 5), [100, 101, 202]),  # second insert reuses 1,2
    (1, [(1, 2), (1, 2, 3, 4)], (1, 2, 3, 4), [100, 101, 202, 203]),  # extends a leaf
    (4, [(1, 2, 3, 4, 5, 6, 7, 8)], (1, 2, 3, 4, 5, 6, 7, 8), [100, 101, 102, 103, 104, 105, 106, 107]),
    (4, [(1, 2, 3, 4, 5, 6, 7, 8)], (1, 2, 3, 4, 5, 6, 7), [100, 101, 102, 103]),  # partial page: dropped
    (4, [(1, 2, 3, 4, 5, 6, 7, 8)], (1, 2, 3, 4, 5, 6, 9, 9), [100, 101, 102, 103]),  # mismatch mid-page
    (4, [(1, 2, 3, 4, 5, 6, 7, 8)], (1, 2, 3), []),
    (4, [(1, 2, 3, 4, 5)], (1, 2, 3, 4, 5), [100, 101, 102, 103]),  # token 5 was never stored
    (4, [(1, 2, 3, 4), (1, 2, 3, 5)], (1, 2, 3, 5), [200, 201, 202, 203]),  # pages differ: siblings
]


@pytest.mark.parametrize("page_size, inserted, query, expected", MATCH_CASES)
def test_match_prefix(page_size, inserted, query, expected):
    cache = build(page_size, *inserted)
    result = cache.match_prefix(ids(*query))
    assert result.slots.dtype == np.int64
    assert result.slots.tolist() == expected
    assert result.length == len(expected)
    cache.check_integrity()
    # The handle covers exactly the match: locking it protects exactly `length` tokens.
    cache.lock(result.node)
    assert cache.protected_size() == result.length
    cache.unlock(result.node)
    cache.check_integrity()


def test_match_splits_edge_so_handle_covers_exactly_the_match():
    cache = build(1, (1, 2, 3, 4, 5, 6))
    assert cache.stats().num_nodes == 1
    result = cache.match_prefix(ids(1, 2, 3, 9))
    assert result.length == 3 and cache.stats().num_nodes == 2
    cache.lock(result.node)
    assert cache.evict(100).tolist() == [103, 104, 105]
    assert cache.match_prefix(ids(1, 2, 3, 4)).slots.tolist() == [100, 101, 102]
    cache.check_integrity()


def test_match_accepts_int32_and_lists_and_refuses_bad_input():
    cache = build(1, (5, 6, 7))
    assert cache.match_prefix(np.array([5, 6], dtype=np.int32)).length == 2
    assert cache.match_prefix([5, 6, 7]).length == 3
    with pytest.raises(ValueError, match="1-D"):
        cache.match_prefix(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(TypeError, match="integer"):
        cache.match_prefix(np.array([5.0, 6.0]))


# ---------------------------------------------------------------- insert

INSERT_CASES = [
    # (page_size, already inserted, new sequence, expected InsertResult)
    (1, [], (1, 2, 3), InsertResult(0, 3)),
    (1, [], (), InsertResult(0, 0)),
    (1, [(1, 2, 3)], (1, 2, 3), InsertResult(3, 3)),
    (1, [(1, 2, 3)], (1, 2), InsertResult(2, 2)),  # a prefix of an edge: nothing new, no split
    (1, [(1, 2, 3)], (1, 2, 4), InsertResult(2, 3)),
    (1, [(1, 2, 3)], (1, 2, 3, 4, 5), InsertResult(3, 5)),
    (1, [(1, 2, 3)], (7, 8), InsertResult(0, 2)),
    (1, [(1, 2, 3), (1, 2, 4)], (1, 2, 4, 4), InsertResult(3, 4)),
    (4, [], (1, 2, 3), InsertResult(0, 0)),
    (4, [], (1, 2, 3, 4, 5, 6), InsertResult(0, 4)),
    (4, [(1, 2, 3, 4, 5, 6, 7, 8)], (1, 2, 3, 4, 5, 6, 7, 9), InsertResult(4, 8)),
    (4, [(1, 2, 3, 4, 5, 6, 7, 8)], (1, 2, 3, 4, 5, 6, 7, 8, 9), InsertResult(8, 8)),
]


@pytest.mark.parametrize("page_size, inserted, seq, expected", INSERT_CASES)
def test_insert_reports_cached_and_stored_lengths(page_size, inserted, seq, expected):
    cache = build(page_size, *inserted)
    before = cache.stats()
    result = cache.insert(ids(*seq), slots_for(ids(*seq), 900))
    assert result == expected
    cache.check_integrity()
    stats = cache.stats()
    assert stats.inserted_tokens - before.inserted_tokens == expected.stored_len - expected.cached_len
    # The tree kept its old slots for the cached range and took ours for the new range.
    match = cache.match_prefix(ids(*seq))
    assert match.length == expected.stored_len
    assert match.slots[expected.cached_len :].tolist() == list(
        range(900 + expected.cached_len, 900 + match.length)
    )


def test_insert_that_ends_inside_an_edge_does_not_split():
    cache = build(1, (1, 2, 3, 4))
    assert cache.insert(ids(1, 2), ids(7, 8)) == InsertResult(2, 2)
    assert cache.stats().num_nodes == 1


def test_insert_copies_its_inputs():
    cache = RadixCache()
    tokens, slots = np.array([1, 2, 3], dtype=np.int32), ids(10, 11, 12)
    cache.insert(tokens, slots)
    tokens[:] = 0
    slots[:] = 0
    assert cache.match_prefix(ids(1, 2, 3)).slots.tolist() == [10, 11, 12]


def test_insert_refuses_mismatched_slots():
    cache = RadixCache()
    with pytest.raises(ValueError, match="shape"):
        cache.insert(ids(1, 2, 3), ids(1, 2))
    with pytest.raises(TypeError, match="integer"):
        cache.insert(ids(1, 2), np.array([1.0, 2.0]))


def test_page_size_splits_only_at_page_boundaries():
    cache = build(2, (1, 2, 3, 4, 5, 6))
    assert cache.insert(ids(1, 2, 3, 9), ids(50, 51, 52, 53)) == InsertResult(2, 4)
    cache.check_integrity()  # every edge a whole number of pages
    assert cache.pretty() == (
        "RadixCache(page_size=2, evictable=8, protected=0)\n"
        "namespace None\n"
        "  [1 2] -> [100 101] t=2\n"
        "    [3 4 5 6] -> [102 103 104 105] t=1\n"
        "    [3 9] -> [52 53] t=2"
    )


# ---------------------------------------------------------------- namespaces


def test_namespaces_keep_trees_apart():
    cache = RadixCache()
    cache.insert(ids(1, 2, 3), ids(10, 11, 12))
    cache.insert(ids(1, 2, 3), ids(20, 21, 22), namespace="adapter-a")
    assert cache.insert(ids(1, 2), ids(30, 31), namespace=("salt", 7)) == InsertResult(0, 2)
    assert cache.match_prefix(ids(1, 2, 3)).slots.tolist() == [10, 11, 12]
    assert cache.match_prefix(ids(1, 2, 3), namespace="adapter-a").slots.tolist() == [20, 21, 22]
    assert cache.match_prefix(ids(1, 2, 3), namespace=("salt", 7)).slots.tolist() == [30, 31]
    cache.check_integrity()


def test_unknown_namespace_matches_nothing_and_creates_nothing():
    cache = build(1, (1, 2, 3))
    result = cache.match_prefix(ids(1, 2, 3), namespace="other")
    assert result.length == 0 and result.node.is_root
    assert cache.namespaces() == [None]
    cache.lock(result.node)  # a root handle: a harmless no-op
    cache.unlock(result.node)
    cache.check_integrity()


def test_emptied_namespace_is_dropped():
    cache = RadixCache()
    cache.insert(ids(1, 2), ids(0, 1), namespace="a")
    cache.insert(ids(3), ids(2), namespace="b")
    assert sorted(cache.namespaces()) == ["a", "b"]
    cache.evict(2)  # "a" is older
    assert cache.namespaces() == ["b"]
    cache.check_integrity()


# ---------------------------------------------------------------- eviction


def test_evict_in_lru_order():
    cache = build(1, (1, 1), (2, 2), (3, 3))  # inserted in order 1, 2, 3
    cache.match_prefix(ids(1, 1))  # 1 is now the most recent
    assert cache.evict(1).tolist() == [200, 201]  # whole leaves: at least 1 token frees 2
    assert cache.evict(2).tolist() == [300, 301]
    assert cache.evict(0).tolist() == []
    assert cache.evict(5).tolist() == [100, 101]
    assert cache.evict(5).dtype == np.int64
    assert cache.stats().evicted_tokens == 6
    cache.check_integrity()


def test_evict_cascades_to_parents_that_become_leaves():
    cache = build(1, (1, 2, 3), (1, 2, 4), (9,))
    cache.match_prefix(ids(9))
    # Leaves [3] and [4] go first (LRU), then [1 2] is a leaf older than [9].
    assert cache.evict(4).tolist() == [102, 202, 100, 101]
    assert cache.match_prefix(ids(1, 2)).length == 0
    assert cache.match_prefix(ids(9)).length == 1
    cache.check_integrity()


def test_eviction_order_follows_access_not_insertion():
    cache = build(1, (1, 2, 3), (1, 2, 4))
    cache.match_prefix(ids(1, 2, 3))
    assert cache.evict(1).tolist() == [202]


def test_evict_refuses_negative():
    with pytest.raises(ValueError):
        RadixCache().evict(-1)


# ---------------------------------------------------------------- locks


def test_locks_prevent_eviction_and_move_tokens_between_sizes():
    cache = build(1, (1, 2, 3), (1, 2, 4))
    node = cache.match_prefix(ids(1, 2, 3)).node
    cache.lock(node)
    cache.lock(node)
    assert (cache.evictable_size(), cache.protected_size()) == (1, 3)
    assert cache.evict(10).tolist() == [202]
    assert cache.evict(10).tolist() == []
    cache.unlock(node)
    assert cache.evict(10).tolist() == []  # still locked once
    cache.unlock(node)
    assert (cache.evictable_size(), cache.protected_size()) == (3, 0)
    cache.check_integrity()
    assert sorted(cache.evict(10).tolist()) == [100, 101, 102]


def test_unlocking_a_child_leaves_a_locked_parent_protected():
    cache = build(1, (1, 2, 3))
    parent = cache.match_prefix(ids(1, 2)).node
    child = cache.match_prefix(ids(1, 2, 3)).node
    cache.lock(parent)
    cache.lock(child)
    cache.unlock(child)
    assert cache.evict(10).tolist() == [102]
    assert cache.protected_size() == 2
    cache.check_integrity()


def test_split_of_a_locked_edge_keeps_the_lock():
    cache = build(1, (1, 2, 3, 4))
    node = cache.match_prefix(ids(1, 2, 3, 4)).node
    cache.lock(node)
    cache.insert(ids(1, 2, 9), ids(50, 51, 52))  # splits the locked edge after 1, 2
    cache.check_integrity()
    assert cache.protected_size() == 4 and cache.evictable_size() == 1
    cache.unlock(node)
    assert cache.protected_size() == 0
    cache.check_integrity()


def test_unlock_of_unlocked_node_raises():
    cache = build(1, (1, 2))
    node = cache.match_prefix(ids(1, 2)).node
    with pytest.raises(ValueError, match="not locked"):
        cache.unlock(node)


def test_dead_and_foreign_handles_are_refused():
    cache = build(1, (1, 2))
    node = cache.match_prefix(ids(1, 2)).node
    cache.evict(2)
    with pytest.raises(ValueError, match="not a live node"):
        cache.lock(node)
    other = build(1, (1, 2))
    with pytest.raises(ValueError, match="not a live node"):
        cache.lock(other.match_prefix(ids(1, 2)).node)
    kept = other.match_prefix(ids(1, 2)).node
    other.reset()
    with pytest.raises(ValueError, match="not a live node"):
        other.lock(kept)


# ---------------------------------------------------------------- reset, stats, pretty, slots


def test_reset_returns_every_slot_and_is_refused_while_locked():
    cache = build(1, (1, 2, 3), (1, 5), (7,))
    node = cache.match_prefix(ids(7)).node
    cache.lock(node)
    with pytest.raises(RuntimeError, match="locked"):
        cache.reset()
    cache.unlock(node)
    assert cache.reset().tolist() == [100, 101, 102, 201, 300]
    assert cache.all_slots().tolist() == []
    assert cache.stats().num_nodes == 0 and cache.evictable_size() == 0
    cache.check_integrity()
    assert cache.insert(ids(1, 2), ids(0, 1)) == InsertResult(0, 2)  # usable again


def test_stats_count_calls_hits_and_sizes():
    cache = RadixCache()
    cache.insert(ids(1, 2, 3), ids(0, 1, 2))
    cache.insert(ids(1, 2, 4), ids(5, 6, 7))
    cache.match_prefix(ids(1, 2, 3, 8))
    cache.match_prefix(ids(9))
    cache.evict(1)
    stats = cache.stats()
    assert (stats.match_calls, stats.query_tokens, stats.hit_tokens) == (2, 5, 3)
    assert (stats.inserted_tokens, stats.evicted_tokens) == (4, 1)
    assert (stats.num_nodes, stats.cached_tokens, stats.evictable_tokens, stats.protected_tokens) == (
        2,
        3,
        3,
        0,
    )
    assert stats.hit_rate == pytest.approx(0.6)


def test_all_slots_lists_every_held_slot_sorted():
    cache = build(1, (1, 2), (1, 3), (4,))
    assert cache.all_slots().tolist() == [100, 101, 201, 300]


def test_pretty_shows_structure_locks_and_elides_long_edges():
    cache = build(1, tuple(range(20)), (0, 1, 99))
    cache.lock(cache.match_prefix(ids(0, 1, 99)).node)
    assert cache.pretty(max_tokens=4) == (
        "RadixCache(page_size=1, evictable=18, protected=3)\n"
        "namespace None\n"
        "  [0 1] -> [100 101] lock=1 t=3\n"
        "    [2 3 4 5 ... +14] -> [102 103 104 105 ... +14] t=1\n"
        "    [99] -> [202] lock=1 t=3"
    )


# ---------------------------------------------------------------- check_integrity can fail


def _corrupt_slot_twice(cache: RadixCache) -> None:
    node = cache.match_prefix(ids(1, 2, 4)).node
    node.value[0] = 100


def _corrupt_size(cache: RadixCache) -> None:
    cache._evictable += 1


def _corrupt_child_key(cache: RadixCache) -> None:
    node = cache.match_prefix(ids(1, 2, 4)).node
    node.key[0] = 77


def _corrupt_lock(cache: RadixCache) -> None:
    cache.match_prefix(ids(1, 2, 4)).node.lock_ref = 1


def _corrupt_lengths(cache: RadixCache) -> None:
    node = cache.match_prefix(ids(1, 2, 4)).node
    node.value = node.value[:0]


def _corrupt_leaf_set(cache: RadixCache) -> None:
    cache._leaves.discard(cache.match_prefix(ids(1, 2, 4)).node)


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (_corrupt_slot_twice, "slots held twice"),
        (_corrupt_size, "evictable_size"),
        (_corrupt_child_key, "filed under a key"),
        (_corrupt_lock, "fewer locks than its children|protected_size"),
        (_corrupt_lengths, "tokens but"),
        (_corrupt_leaf_set, "evictable-leaf set"),
    ],
)
def test_check_integrity_catches_corruption(corrupt, message):
    cache = build(1, (1, 2, 3), (1, 2, 4))
    corrupt(cache)
    with pytest.raises(AssertionError, match=message):
        cache.check_integrity()


# ---------------------------------------------------------------- one caller, two caches


class _Allocator:
    """The smallest slot allocator a scheduler could have: a free list over `size` slots."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free_slots = list(range(size))

    def alloc(self, n: int) -> np.ndarray:
        out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return np.array(out, dtype=np.int64)

    def free(self, slots: np.ndarray) -> None:
        self.free_slots.extend(slots.tolist())


def _serve(cache: PrefixCache, allocator: _Allocator, prompts: list[tuple[int, ...]]) -> list[int]:
    """The scheduler's protocol, written once for any PrefixCache; returns the cached length per prompt."""
    cached = []
    for prompt in prompts:
        tokens = ids(*prompt)
        match = cache.match_prefix(tokens)
        cache.lock(match.node)
        new_slots = allocator.alloc(len(tokens) - match.length)
        slots = np.concatenate([match.slots, new_slots])  # ... the forward pass writes KV here ...
        result = cache.insert(tokens, slots)
        allocator.free(slots[match.length : result.cached_len])
        allocator.free(slots[result.stored_len :])
        cache.unlock(match.node)
        cached.append(match.length)
        cache.check_integrity()
    return cached


@pytest.mark.parametrize(
    "cache, expected_cached",
    [(RadixCache(1), [0, 3, 4, 0]), (RadixCache(2), [0, 2, 4, 0]), (NoPrefixCache(), [0, 0, 0, 0])],
    ids=["radix", "radix-page2", "no-cache"],
)
def test_same_caller_code_for_both_caches_and_no_leak(cache, expected_cached):
    allocator = _Allocator(64)
    prompts = [(1, 2, 3, 4, 5), (1, 2, 3, 9), (1, 2, 3, 4, 6), (8, 8, 8)]
    assert _serve(cache, allocator, prompts) == expected_cached
    held = cache.all_slots().tolist()
    assert sorted(held + allocator.free_slots) == list(range(64))  # every slot is held or free, once
    allocator.free(cache.evict(cache.evictable_size()))
    assert sorted(allocator.free_slots) == list(range(64))


def test_no_prefix_cache_refuses_foreign_handles_and_counts_queries():
    cache = NoPrefixCache()
    with pytest.raises(ValueError):
        cache.lock(RadixCache().match_prefix(ids(1)).node)
    cache.match_prefix(ids(1, 2, 3))
    stats = cache.stats()
    assert (stats.match_calls, stats.query_tokens, stats.hit_rate) == (1, 3, 0.0)
    assert cache.insert(ids(1, 2), ids(3, 4)) == InsertResult(0, 0)
    assert cache.evict(10).tolist() == [] and cache.reset().tolist() == []
