"""What the prefix caches return, and the interface both of them implement.

`RadixCache` (the tree) and `NoPrefixCache` (caching off) share `PrefixCache`, so the scheduler is written once
and never asks which one it holds: turning caching off swaps the object, never adds an `if`.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from .node import RadixNode

Namespace = Hashable
"""Selects a separate tree (a cache salt, a LoRA adapter): keys of different namespaces never share nodes."""

IntArray = npt.NDArray[np.integer]
SlotArray = npt.NDArray[np.int64]


class MatchResult(NamedTuple):
    """The longest cached prefix of a query.

    `slots[i]` is the KV slot of token `i` of the query, for `i < length`. `node` is the deepest node of the
    match: its path from the root covers exactly `length` tokens (the tree splits an edge where the match ends
    inside it), so `lock(node)` protects exactly these slots. With nothing matched, `node` is the namespace's
    root and locking it is a no-op.
    """

    slots: SlotArray
    node: RadixNode
    length: int


class InsertResult(NamedTuple):
    """How an inserted sequence's slots split between the tree and the caller.

    `cached_len`: the leading tokens that were already cached; the tree keeps its own slots for them, so the
    caller's `slots[:cached_len]` are duplicates (except any it got from `match_prefix`, which are the tree's).
    `stored_len`: the tree now holds the sequence up to here; `slots[cached_len:stored_len]` belong to the tree.
    `slots[stored_len:]` stay the caller's: the tail of a partial page, or everything for `NoPrefixCache`.

    The caller's release is the same for every cache:
    `free(slots[prefix_len:cached_len]); free(slots[stored_len:])`, `prefix_len` being its matched length.
    """

    cached_len: int
    stored_len: int


@dataclass(frozen=True)
class CacheStats:
    """Counters since construction (kept across `reset`) and the current size of the tree."""

    match_calls: int  # calls of match_prefix
    query_tokens: int  # tokens offered to match_prefix (hit rate = hit_tokens / query_tokens)
    hit_tokens: int  # tokens match_prefix found cached
    inserted_tokens: int  # tokens insert stored (not counting the already-cached ones)
    evicted_tokens: int  # tokens evict removed
    num_nodes: int  # nodes now in the tree, roots excluded
    cached_tokens: int  # tokens now in the tree (= evictable + protected)
    evictable_tokens: int  # of which in no locked path
    protected_tokens: int  # of which in a locked path

    @property
    def hit_rate(self) -> float:
        """Fraction of queried tokens that were cached; 0.0 before any query."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


class PrefixCache(Protocol):
    """The verbs the scheduler uses; see docs/radix.md for the caller's protocol."""

    page_size: int
    stores_prefixes: bool  # False for NoPrefixCache: nothing inserted is ever matched again

    def match_prefix(self, token_ids: IntArray, namespace: Namespace = None) -> MatchResult: ...

    def insert(self, token_ids: IntArray, slots: IntArray, namespace: Namespace = None) -> InsertResult: ...

    def lock(self, node: RadixNode) -> None: ...

    def unlock(self, node: RadixNode) -> None: ...

    def evict(self, num_tokens: int) -> SlotArray: ...

    def evictable_size(self) -> int: ...

    def protected_size(self) -> int: ...

    def reset(self) -> SlotArray: ...

    def stats(self) -> CacheStats: ...

    def all_slots(self) -> SlotArray: ...

    def check_integrity(self) -> None: ...

    def pretty(self, max_tokens: int = 8) -> str: ...
