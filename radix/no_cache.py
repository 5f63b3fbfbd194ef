"""NoPrefixCache: the stand-in used when prefix caching is off; it has RadixCache's interface, caches nothing.

The scheduler's code is the same for both, with no branch on whether caching is on: a match always comes back
empty and `insert` reports `stored_len == 0`, so the caller's usual release (`free(slots[stored_len:])`) frees
every slot.
"""

from __future__ import annotations

import numpy as np

from .api import CacheStats, InsertResult, IntArray, MatchResult, Namespace, SlotArray
from .node import EMPTY_IDS, RadixNode, as_token_ids


class NoPrefixCache:
    """Caches nothing; counts queries so hit-rate statistics read the same (always 0)."""

    stores_prefixes = False

    def __init__(self, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self._root = RadixNode(EMPTY_IDS, EMPTY_IDS, None, None, 0)
        self._match_calls = 0
        self._query_tokens = 0

    def match_prefix(self, token_ids: IntArray, namespace: Namespace = None) -> MatchResult:
        self._match_calls += 1
        self._query_tokens += len(as_token_ids(token_ids))
        return MatchResult(EMPTY_IDS, self._root, 0)

    def insert(self, token_ids: IntArray, slots: IntArray, namespace: Namespace = None) -> InsertResult:
        if np.shape(slots) != np.shape(token_ids):
            raise ValueError(
                f"slots must match token_ids in shape, got {np.shape(slots)} vs {np.shape(token_ids)}"
            )
        return InsertResult(0, 0)

    def lock(self, node: RadixNode) -> None:
        self._require_own(node)

    def unlock(self, node: RadixNode) -> None:
        self._require_own(node)

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def evict(self, num_tokens: int) -> SlotArray:
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return np.empty(0, dtype=np.int64)

    def reset(self) -> SlotArray:
        return np.empty(0, dtype=np.int64)

    def stats(self) -> CacheStats:
        return CacheStats(
            match_calls=self._match_calls,
            query_tokens=self._query_tokens,
            hit_tokens=0,
            inserted_tokens=0,
            evicted_tokens=0,
            num_nodes=0,
            cached_tokens=0,
            evictable_tokens=0,
            protected_tokens=0,
        )

    def all_slots(self) -> SlotArray:
        return np.empty(0, dtype=np.int64)

    def check_integrity(self) -> None:
        assert self._root.is_root and not self._root.children, "NoPrefixCache's root grew children"

    def pretty(self, max_tokens: int = 8) -> str:
        return f"NoPrefixCache(page_size={self.page_size})"

    def _require_own(self, node: RadixNode) -> None:
        if node is not self._root:
            raise ValueError(f"{node!r} was not returned by this NoPrefixCache")
