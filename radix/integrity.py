"""check_integrity: recompute every invariant of a RadixCache from scratch (docs/radix.md lists them).

Slow (a full walk) by design; tests call it after every operation. Raises AssertionError with a message naming
the broken invariant and the node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .node import RadixNode
    from .tree import RadixCache


def check_integrity(cache: RadixCache) -> None:
    page = cache.page_size
    evictable = protected = num_nodes = 0
    leaves: set[RadixNode] = set()
    slot_arrays = []
    for namespace, root in cache._roots.items():
        assert root.is_root, f"root of {namespace!r} has a parent or a key: {root!r}"
        assert root.namespace == namespace, f"root {root!r} filed under namespace {namespace!r}"
        assert root.lock_ref == 0, f"root {root!r} carries a lock count"
        assert root.children, f"root of {namespace!r} is empty but was not dropped"
        stack = [root]
        while stack:
            node = stack.pop()
            child_locks = 0
            for child_key, child in node.children.items():
                _check_edge(cache, child, page)
                assert child.parent is node, f"{child!r} does not point back to its parent {node!r}"
                assert child.namespace == namespace, f"{child!r} sits in the tree of {namespace!r}"
                assert cache._child_key(child.key) == child_key, (
                    f"{child!r} filed under a key not its first page"
                )
                assert child.last_access <= node.last_access or node.is_root, (
                    f"{child!r} was accessed after its parent {node!r}"
                )
                child_locks += child.lock_ref
                stack.append(child)
            if node.is_root:
                continue
            num_nodes += 1
            slot_arrays.append(node.value)
            assert node.lock_ref >= child_locks, f"{node!r} holds fewer locks than its children together"
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
                if not node.children:
                    leaves.add(node)
    assert evictable == cache._evictable, f"evictable_size {cache._evictable} != recomputed {evictable}"
    assert protected == cache._protected, f"protected_size {cache._protected} != recomputed {protected}"
    assert num_nodes == cache._num_nodes, f"node count {cache._num_nodes} != recomputed {num_nodes}"
    assert leaves == set(cache._leaves), (
        f"evictable-leaf set is off: missing {leaves - set(cache._leaves)}, extra {set(cache._leaves) - leaves}"
    )
    cache._leaves.check()
    if slot_arrays:
        slots = np.concatenate(slot_arrays)
        unique, counts = np.unique(slots, return_counts=True)
        assert len(unique) == len(slots), f"slots held twice: {unique[counts > 1][:10].tolist()}"


def _check_edge(cache: RadixCache, node: RadixNode, page: int) -> None:
    """The per-node invariants: shapes, dtypes, page alignment, a sane lock count."""
    assert node.key.dtype == np.int64 and node.value.dtype == np.int64, f"{node!r} arrays are not int64"
    assert node.key.ndim == 1 and node.value.ndim == 1, f"{node!r} arrays are not 1-D"
    assert len(node.key) == len(node.value), f"{node!r}: {len(node.key)} tokens but {len(node.value)} slots"
    assert len(node.key) > 0, f"{node!r} has an empty edge"
    assert len(node.key) % page == 0, f"{node!r}: edge of {len(node.key)} tokens is not whole pages of {page}"
    assert node.lock_ref >= 0, f"{node!r} has a negative lock count"
    assert node.last_access <= cache._tick, f"{node!r} was accessed in the future"
