"""A growable int64 buffer: the KV slot of each position of one request (host side)."""

from __future__ import annotations

import numpy as np


class SlotBuffer:
    """Append-mostly array with amortised O(1) growth; `view()` is positions [0, len)."""

    __slots__ = ("_data", "_len")

    def __init__(self, capacity: int = 64) -> None:
        self._data = np.empty(max(capacity, 16), dtype=np.int64)
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def view(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self._data[start : self._len if stop is None else stop]

    def extend(self, slots: np.ndarray) -> None:
        n = len(slots)
        if self._len + n > len(self._data):
            grown = np.empty(max(2 * len(self._data), self._len + n), dtype=np.int64)
            grown[: self._len] = self._data[: self._len]
            self._data = grown
        self._data[self._len : self._len + n] = slots
        self._len += n

    def replace(self, start: int, slots: np.ndarray) -> None:
        """Overwrite positions [start, start + len(slots)) (which must exist)."""
        assert start + len(slots) <= self._len
        self._data[start : start + len(slots)] = slots

    def truncate(self, length: int) -> None:
        self._len = min(self._len, length)
