"""A thread-safe least-recently-used map bounded by the bytes of its values.

Holds the per-vocabulary cache of trie walks inside shared terminals (terminal_walks.py), which every grammar
compiled against the vocabulary fills: in a long-running server the set of schemas, hence of terminals and
start nodes, is unbounded, so the cache evicts the walks used least recently once their arrays exceed the
budget. An evicted walk is walked again on its next use (same result, only slower).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class ByteLru(Generic[V]):
    """`get` / `put` by key; `put` of a value of `nbytes` evicts the oldest entries beyond `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, key: Hashable, value: V, nbytes: int, replace: bool = False) -> V:
        """Store `value` unless `key` is present (or with `replace`, in its place); returns the stored value
        (the earlier one when it is kept)."""
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                if not replace:
                    return found[0]
                self._bytes -= found[1]
            self._items[key] = (value, nbytes)
            self._bytes += nbytes
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, (_, size) = self._items.popitem(last=False)
                self._bytes -= size
                self.evictions += 1
            return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)
