"""Which drafted tokens a verify step keeps.

The drafts are deterministic proposals (a one-hot draft distribution q). For them the standard rejection rule of
speculative sampling (accept d with probability min(1, p(d)/q(d)) = p(d); on a rejection draw from the residual
max(p - q, 0), which is p without d, renormalised) is the same as drawing a token t ~ p at the position, as plain
decoding would, and keeping d only when t == d: P(t == d) = p(d), and a t != d is distributed as the residual.
So each verified position is sampled exactly as without speculation (the same seeded draw, at the same output
index), and a request keeps the samples up to and including the first that differs from its draft.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def accepted_lengths(sampled: npt.NDArray[np.int64], drafts: npt.NDArray[np.int64],
                     counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Drafts kept per request. `sampled`: the tokens drawn at every verified position, requests one after the
    other, request i with `counts[i]` positions (its k_i drafts + 1); `drafts`: request i's k_i drafts laid out
    the same way, each request's run one shorter. Vectorised over the batch: a draft is kept while every draft
    before it matched its position's sample."""
    b = len(counts)
    k = counts - 1
    if not len(drafts):
        return np.zeros(b, dtype=np.int64)
    starts = np.cumsum(counts) - counts
    # the sample at the position of draft j of request i is sampled[starts[i] + j]
    owner = np.repeat(np.arange(b), k)
    within = np.arange(len(drafts)) - np.repeat(np.cumsum(k) - k, k)
    miss = np.flatnonzero(sampled[starts[owner] + within] != drafts)
    kept = k.astype(np.int64, copy=True)  # every draft kept unless one misses
    np.minimum.at(kept, owner[miss], within[miss])  # the first mismatch of each request wins
    return kept
