"""One node of the radix tree, and the array helpers that compare and normalise edges."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

EMPTY_IDS: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
EMPTY_IDS.flags.writeable = False

ChildKey = int | bytes
"""A child's key in its parent's `children`: its first token (page_size 1) or its first page's bytes."""


@dataclass(eq=False)
class RadixNode:
    """An edge of the tree and the node it ends in; callers hold it only as an opaque handle.

    `key` (token ids) and `value` (KV slots) are int64 arrays of the same length, a positive multiple of the
    page size; a root has both empty and is the only node without a parent. `lock_ref` counts the locks taken
    on this node or any node below it (so a parent's is at least the sum of its children's). `last_access` is
    the tick of the last match/insert through this node; a parent's is never older than its children's.
    A node removed by `evict` (or cut off by `reset`) has `parent is None` and a non-empty key: it is dead.
    """

    key: npt.NDArray[np.int64]
    value: npt.NDArray[np.int64]
    parent: RadixNode | None
    namespace: Hashable
    uid: int  # creation order; breaks ties between equal access ticks in the LRU heap
    last_access: int = 0
    lock_ref: int = 0
    children: dict[ChildKey, RadixNode] = field(default_factory=dict)

    @property
    def is_root(self) -> bool:
        return self.parent is None and len(self.key) == 0

    def __repr__(self) -> str:  # the dataclass repr would recurse through parent and children
        kind = "root" if self.is_root else f"len={len(self.key)}"
        return (
            f"RadixNode(#{self.uid} {kind} ns={self.namespace!r} lock={self.lock_ref} t={self.last_access})"
        )


def as_token_ids(token_ids: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """A 1-D int64 view of `token_ids` (no copy when it already is one); refuses non-integer input."""
    arr = np.asarray(token_ids)
    if arr.ndim != 1:
        raise ValueError(f"token_ids must be 1-D, got shape {arr.shape}")
    if arr.dtype != np.int64:
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"token_ids must be an integer array, got dtype {arr.dtype}")
        arr = arr.astype(np.int64)
    return arr


def first_mismatch(edge: npt.NDArray[np.int64], query: npt.NDArray[np.int64]) -> int:
    """Length of the common prefix of two int64 arrays, vectorised.

    A byte comparison (memcmp) settles the common case, a whole-edge match, several times faster than an
    elementwise compare; only a real mismatch pays for `argmin` over the equality mask.
    """
    n = min(len(edge), len(query))
    a, b = edge[:n], query[:n]
    if a.tobytes() == b.tobytes():
        return n
    return int((a == b).argmin())
