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
    with the most). The ends of the occurrences of the last token are marked over the whole sequence at once,
    then narrowed to those of the last 2, 3, ... tokens, one comparison of the sequence per n."""
    L = len(tokens)
    if L < 2 or min_n > L - 1:
        return _NONE
    hit = tokens[: L - 1] == tokens[L - 1]  # hit[i]: the last token occurs at i (never the suffix itself)
    if not hit.any():
        return _NONE
    n = 1
    while n < min(max_n, L - 1):
        # hit[i]: the last n tokens occur ending at i + n - 1; longer[i]: the last n + 1 ending at i + n
        longer = hit[1:] & (tokens[: L - 1 - n] == tokens[L - 1 - n])
        if not longer.any():
            break
        hit, n = longer, n + 1
    if n < min_n:
        return _NONE
    ends = np.flatnonzero(hit) + (n - 1)
    full = ends[L - 1 - ends >= k]  # k tokens follow the occurrence
    start = int(full[-1] if len(full) else ends[0]) + 1
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
