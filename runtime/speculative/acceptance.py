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
    owner = np.repeat(np.arange(b), k)
    # draft j of request i is drafts[d_i + j] and its position's sample sampled[d_i + i + j] (each run one longer)
    hit = sampled[np.arange(len(drafts)) + owner] == drafts
    kept = k.astype(np.int64)  # every draft kept unless one misses (a faithful copy: the common case)
    if hit.all():
        return kept
    miss = np.flatnonzero(~hit)
    who = owner[miss]
    first = np.ones(len(miss), dtype=bool)  # the first miss of each request (misses are in request order)
    np.not_equal(who[1:], who[:-1], out=first[1:])
    who = who[first]
    kept[who] = miss[first] - (np.cumsum(k) - k)[who]
    return kept
