"""PDA states that behave alike for the next few bytes, so their token masks can share one trie walk.

A bounded repetition (`char{0,255}`, from a string's `maxLength`) compiles to one rule state per count.
Every count is a different automaton state, so without help each position of the chain pays a fresh trie
walk (milliseconds) the first time it is reached. Yet two counts that both leave at least `depth` characters
to go accept exactly the same byte strings of up to `depth` bytes: for every token that short their masks
are equal.

`lookahead_representatives(pda, depth)` finds such states by Moore's partition refinement, stopped after
`depth` rounds: two states are `k`-equivalent when they agree on accepting and on their calls, and every
byte (and every call of a rule that reads at least one byte) leads to `k - 1`-equivalent states. By
induction, replacing frames of a parser stack by `depth`-equivalent ones changes nothing a string of at most
`depth` bytes can observe: which strings are readable and whether the end is accepting. States inside a
shared terminal are only merged with states of the same terminal (the counts of a fused bounded repetition,
counted.py), so a representative's walk is still that terminal's walk, cached per vocabulary.
"""

from __future__ import annotations

import numpy as np

from radixgen.grammars.bytedfa import ByteDFA
from radixgen.grammars.columns import group_bytes
from radixgen.grammars.pda import PdaTables


def _nullable_starts(pda: PdaTables) -> np.ndarray:
    """bool per state: a rule started here may finish without reading a byte (through calls too)."""
    nullable: np.ndarray = pda.accept.copy()
    edges = [(g, c, r) for g, calls in enumerate(pda.calls) for c, r in calls]
    if not edges:
        return nullable
    source, callee, ret = np.array(edges, dtype=np.int64).T
    while True:
        grown = source[nullable[callee] & nullable[ret] & ~nullable[source]]
        if grown.size == 0:
            return nullable
        nullable[grown] = True


_MULTIPLIERS_SEED = 0x10CA1


def _row_classes(rows: np.ndarray) -> np.ndarray:
    """Class id per row of an int matrix, equal ids exactly for equal rows (hashed, verified, exact
    fallback on a collision)."""
    multipliers = np.random.default_rng(_MULTIPLIERS_SEED).integers(
        1, 2**63, size=rows.shape[1], dtype=np.uint64) | np.uint64(1)
    with np.errstate(over="ignore"):
        hashes = rows.astype(np.uint64) @ multipliers
    distinct = np.unique(hashes)
    inverse: np.ndarray = np.searchsorted(distinct, hashes)
    first = np.empty(distinct.shape[0], dtype=np.int64)
    first[inverse] = np.arange(rows.shape[0])
    if (rows == rows[first[inverse]]).all():
        return inverse
    exact: np.ndarray = np.unique(rows, axis=0, return_inverse=True)[1].reshape(-1)
    return exact


def lookahead_representatives(pda: PdaTables, depth: int) -> np.ndarray:
    """int64 per PDA state: the smallest state `depth`-equivalent to it (itself when none is).

    Rule states come first in the PDA and only read bytes into rule states; a terminal's states only read
    bytes into the same terminal and call nothing. So the rule states are refined alone, and each terminal
    by `_terminal_representatives`, cached per DFA (a fused bounded string has thousands of states)."""
    num = pda.num_states
    rules = min((offset for offset, _ in pda.terminals), default=num)
    nullable = _nullable_starts(pda) if any(pda.calls) else np.zeros(num, dtype=bool)
    # Fixed part of each rule state's behaviour: accepting and the rules it calls (callees are compared as
    # states, and a call of a nullable rule returns without a byte read, so its return state is compared as
    # itself).
    max_calls = max((len(edges) for edges in pda.calls), default=0)
    call_rets = np.full((rules, max(max_calls, 1)), -1, dtype=np.int64)  # returns compared one round behind
    call_keys: dict[tuple[tuple[int, int], ...], int] = {(): 0}
    call_key = np.zeros(rules, dtype=np.int64)
    for g, edges in enumerate(pda.calls[:rules]):
        if edges:
            key = tuple((c, r if nullable[c] else -1) for c, r in edges)
            call_key[g] = call_keys.setdefault(key, len(call_keys))
            for i, (c, r) in enumerate(edges):
                if not nullable[c]:
                    call_rets[g, i] = r
    out = np.arange(num, dtype=np.int64)
    base = np.stack([pda.accept[:rules].astype(np.int64), call_key], axis=1)
    out[:rules] = _representatives(pda.trans[:rules], base, call_rets, depth)
    for offset, dfa in pda.terminals:
        out[offset:offset + dfa.num_states] = offset + _terminal_representatives(dfa, depth)
    return out


def _terminal_representatives(dfa: ByteDFA, depth: int) -> np.ndarray:
    """`lookahead_representatives` of one terminal's states, as local DFA states (read-only), cached on the
    DFA (so it goes with it)."""
    cache: dict[int, np.ndarray] = dfa.__dict__.setdefault("_lookahead", {})
    found = cache.get(depth)
    if found is None:
        no_calls = np.full((dfa.num_states, 1), -1, dtype=np.int64)
        found = _representatives(dfa.trans, dfa.accepting[:, None].astype(np.int64), no_calls, depth)
        found.flags.writeable = False
        cache[depth] = found
    return found


def _representatives(table: np.ndarray, base: np.ndarray, call_rets: np.ndarray, depth: int) -> np.ndarray:
    """Moore's refinement, `depth` rounds, of states that start in the classes of `base` rows and step by
    `table` (bytes) and `call_rets` (returns of calls, -1 none); targets index the same states."""
    num = table.shape[0]
    if num == 0:
        return np.zeros(0, dtype=np.int64)
    # Bytes whose columns are equal in every state are one column here.
    trans = table[:, group_bytes(table)[1]].astype(np.int64)
    live = trans >= 0
    safe_trans = np.where(live, trans, 0)
    has_ret = call_rets >= 0
    safe_rets = np.where(has_ret, call_rets, 0)
    classes = _row_classes(base)
    count = int(classes.max()) + 1
    for _ in range(depth):
        signature = np.concatenate([classes[:, None], np.where(live, classes[safe_trans], -1),
                                    np.where(has_ret, classes[safe_rets], -1)], axis=1)
        refined = _row_classes(signature)
        refined_count = int(refined.max()) + 1
        classes = refined
        if refined_count == count:
            break  # stable: equivalent at every depth
        count = refined_count
    representative = np.full(count, num, dtype=np.int64)
    np.minimum.at(representative, classes, np.arange(num, dtype=np.int64))
    of_state: np.ndarray = representative[classes]
    return of_state
