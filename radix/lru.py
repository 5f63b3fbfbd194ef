"""The set of evictable leaves, kept incrementally, with a lazy min-heap on last access for LRU order.

A node is an evictable leaf when it is not a root, has no children and no lock. The tree calls `add`/`discard`
whenever that changes and `touched` when such a leaf's access tick moves. The heap is lazy: stale entries
(a leaf that was locked, grew a child, was evicted, or was touched again) are skipped when popped, and the heap
is rebuilt from the set once stale entries outnumber live ones, so its size stays O(number of leaves).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from .node import RadixNode

_HeapEntry = tuple[int, int, RadixNode]  # (last_access, uid, node): uids are unique, nodes never compared


class LeafLRU:
    """Evictable leaves, popped least recently used first (ties: oldest node first)."""

    def __init__(self) -> None:
        self._leaves: set[RadixNode] = set()
        self._heap: list[_HeapEntry] = []

    def __len__(self) -> int:
        return len(self._leaves)

    def __contains__(self, node: RadixNode) -> bool:
        return node in self._leaves

    def __iter__(self) -> Iterator[RadixNode]:
        return iter(self._leaves)

    def add(self, node: RadixNode) -> None:
        self._leaves.add(node)
        self._push(node)

    def discard(self, node: RadixNode) -> None:
        self._leaves.discard(node)

    def touched(self, node: RadixNode) -> None:
        """`node.last_access` changed: re-queue it if it is an evictable leaf (its old entry goes stale)."""
        if node in self._leaves:
            self._push(node)

    def pop(self) -> RadixNode | None:
        """Remove and return the least recently used evictable leaf, or None when there is none."""
        while self._heap:
            tick, _, node = heapq.heappop(self._heap)
            if node in self._leaves and node.last_access == tick:
                self._leaves.remove(node)
                return node
        return None

    def clear(self) -> None:
        self._leaves.clear()
        self._heap.clear()

    def check(self) -> None:
        """Every evictable leaf has a live heap entry (else `pop` could miss it)."""
        live = {(node.uid, tick) for tick, _, node in self._heap}
        for node in self._leaves:
            assert (node.uid, node.last_access) in live, f"evictable leaf {node!r} has no current heap entry"

    def _push(self, node: RadixNode) -> None:
        heapq.heappush(self._heap, (node.last_access, node.uid, node))
        if len(self._heap) > 2 * len(self._leaves) + 64:
            self._heap = [(n.last_access, n.uid, n) for n in self._leaves]
            heapq.heapify(self._heap)
