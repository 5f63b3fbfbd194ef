"""What the peer backends' adapters share: a bounded cache, their tokenizer object per vocabulary, the mask row
view their fills write into, and the refusal of a constraint kind a peer lacks."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import numpy as np

from radixgen.grammars.backend import Encode
from radixgen.grammars.vocabulary import Vocabulary


def unsupported_kind(backend: str, kind: str, why: str) -> ValueError:
    """The error of a constraint kind a backend cannot compile (it becomes the request's 400)."""
    return ValueError(f"the {backend} grammar backend does not support {kind!r} constraints ({why}); "
                      f"use grammar_backend='radixgen'")


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """A thread-safe map keeping the `size` entries used most recently; `get_or_build` builds a missing one
    outside the lock (two threads may both build it; the first stored wins)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_build(self, key: K, build: Callable[[], V]) -> V:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = build()
        with self._lock:
            value = self._items.setdefault(key, value)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._items)


class PerVocabulary(Generic[V]):
    """A backend's tokenizer object per vocabulary, the few used most recently kept. Keyed by identity: an
    entry holds its vocabulary, so the id stays that vocabulary's while the entry lives."""

    def __init__(self, build: Callable[[Vocabulary, Encode | None], V], size: int = 4) -> None:
        self._build = build
        self._cache: BoundedCache[int, tuple[Vocabulary, V]] = BoundedCache(size)

    def get(self, vocab: Vocabulary, encode: Encode | None = None) -> V:
        """The object built for `vocab` (with the first call's `encode`: the tokenizer `vocab` was read from)."""
        return self._cache.get_or_build(id(vocab), lambda: (vocab, self._build(vocab, encode)))[1]


def copy_mask(mask: np.ndarray, row: np.ndarray) -> None:
    """`mask` (ceil(V/32) words) into the front of `row`, the rest of `row` zeroed."""
    words = mask.shape[0]
    row[:words] = mask
    row[words:] = 0


def mask_view(row: np.ndarray, words: int) -> np.ndarray:
    """The first `words` of `row` as a (1, words) view a peer's fill writes into (a C-contiguous int32 row)."""
    if row.dtype != np.int32 or row.shape[0] < words or not row[:words].flags.c_contiguous:
        raise ValueError(f"a mask row must be C-contiguous int32 with at least {words} words, "
                         f"got {row.dtype} {row.shape}")
    return row[np.newaxis, :words]
