"""Prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's last n tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from radixgen.runtime.speculative.drafter import TokenIds

if TYPE_CHECKING:
    from radixgen.runtime.request import Req

_NONE = np.zeros(0, dtype=np.int64)


def ngram_lookup(tokens: TokenIds, k: int, min_n: int, max_n: int) -> TokenIds:
    """Up to `k` tokens that followed an earlier occurrence of the last n tokens of `tokens`, for the largest n in
    [min_n, max_n] that occurs; among its occurrences the latest one that has `k` tokens after it (else the one
    with the most). One pass over the sequence finds where the last token occurred before; the match lengths of
    those few candidates are then extended backwards together."""
    L = len(tokens)
    if L < 2 or min_n > L - 1:
        return _NONE
    ends = np.flatnonzero(tokens[: L - 1] == tokens[L - 1])  # candidate n-gram ends (never the suffix itself)
    if not len(ends):
        return _NONE
    length = np.ones(len(ends), dtype=np.int64)  # matched n-gram length of each candidate so far
    alive = np.ones(len(ends), dtype=bool)
    for j in range(1, min(max_n, L - 1)):
        back = ends - j
        ok = alive & (back >= 0)
        ok[ok] = tokens[back[ok]] == tokens[L - 1 - j]
        length += ok
        alive = ok
        if not alive.any():
            break
    best = int(length.max())
    if best < min_n:
        return _NONE
    hits = ends[length == best]
    full = hits[L - 1 - hits >= k]  # k tokens follow the occurrence
    start = int(full[-1] if len(full) else hits[0]) + 1
    return tokens[start : start + k]


class NgramDrafter:
    """Drafts from each request's own prompt and output (extraction, summaries, code edits copy long spans)."""

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min <= max, got {min_n}..{max_n}")
        self.min_n, self.max_n = min_n, max_n

    def propose(self, reqs: Sequence[Req], k: int) -> list[TokenIds]:
        return [ngram_lookup(r.fill_ids(), k, self.min_n, self.max_n) for r in reqs]

    def release(self, rid: str) -> None:
        pass
