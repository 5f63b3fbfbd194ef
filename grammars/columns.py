"""Group the 256 bytes of a state by where they lead (one numpy pass; the determinizers' inner loop)."""

from __future__ import annotations

import numpy as np

# Fixed odd multipliers: column hashes are dot products with them (mod 2**64), verified exactly below.
_MULTIPLIERS = np.random.default_rng(0x5EED).integers(1, 2**63, size=4096, dtype=np.uint64) | np.uint64(1)


def group_bytes(targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """targets int[k, 256] (one row per member) -> (group of each byte int[256], first byte of each group).

    Bytes share a group exactly when their target columns are equal.
    """
    k = targets.shape[0]
    if k == 1:
        _, first, inverse = np.unique(targets[0], return_index=True, return_inverse=True)
        return inverse.reshape(-1), first
    if k <= _MULTIPLIERS.shape[0]:
        with np.errstate(over="ignore"):
            hashes = _MULTIPLIERS[:k] @ targets.astype(np.uint64)
        _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        if (targets == targets[:, first[inverse]]).all():  # no hash collision merged different columns
            return inverse, first
    labels: dict[bytes, int] = {}
    firsts: list[int] = []
    cols = np.ascontiguousarray(targets.T)
    groups = np.empty(256, dtype=np.int64)
    for b in range(256):
        key = cols[b].tobytes()
        if key not in labels:
            labels[key] = len(firsts)
            firsts.append(b)
        groups[b] = labels[key]
    return groups, np.array(firsts, dtype=np.int64)
