"""Byte-level DFAs: the terminals of every grammar, built from literals, character sets and regexes.

A `ByteDFA` reads UTF-8 bytes, so a token may end in the middle of a multi-byte character: the states between
the bytes of one character are ordinary DFA states. Characters are encoded exactly (no overlong forms, no
surrogates), so the accepted byte strings are exactly the UTF-8 encodings of the accepted texts.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

DEAD = -1
MAX_CODEPOINT = 0x10FFFF


@dataclass(frozen=True, eq=False)
class ByteDFA:
    """trans[state, byte] -> next state or -1; state 0 is the start; every state can reach acceptance."""

    trans: np.ndarray  # int32[n, 256]
    accepting: np.ndarray  # bool[n]

    @property
    def num_states(self) -> int:
        return int(self.trans.shape[0])

    def matches(self, data: bytes) -> bool:
        state = 0
        for b in data:
            state = int(self.trans[state, b])
            if state < 0:
                return False
        return bool(self.accepting[state])

    def accepts_empty(self) -> bool:
        return bool(self.accepting[0])

    @cached_property
    def digest(self) -> bytes:
        """16-byte hash of the table and accepting states: the key of per-vocabulary caches of walks inside
        this DFA, so equal DFAs of different grammars share them, and a key holds no DFA alive."""
        h = hashlib.blake2b(digest_size=16)
        h.update(np.ascontiguousarray(self.trans, dtype=np.int32).tobytes())
        h.update(np.ascontiguousarray(self.accepting, dtype=bool).tobytes())
        return h.digest()


def live_pairs(dfa: ByteDFA, state: int) -> tuple[tuple[int, int], ...]:
    """(byte, next state) for every live byte of `state`, ascending (cached on the DFA)."""
    cache: dict[int, tuple[tuple[int, int], ...]] = dfa.__dict__.setdefault("_live_pairs", {})
    found = cache.get(state)
    if found is None:
        row = dfa.trans[state]
        live = np.flatnonzero(row >= 0)
        found = cache[state] = tuple(zip(live.tolist(), row[live].tolist()))
    return found


def start_distances(dfa: ByteDFA) -> np.ndarray:
    """int64 per state: the fewest bytes that reach it from the start (read-only, cached on the DFA)."""
    found: np.ndarray | None = dfa.__dict__.get("_start_distances")
    if found is None:
        found = np.full(dfa.num_states, np.iinfo(np.int64).max, dtype=np.int64)
        frontier = np.zeros(dfa.num_states, dtype=bool)
        frontier[0] = True
        depth = 0
        while frontier.any():
            found[frontier] = depth
            targets = dfa.trans[frontier]
            frontier = np.zeros(dfa.num_states, dtype=bool)
            frontier[targets[targets >= 0]] = True
            frontier &= found == np.iinfo(np.int64).max
            depth += 1
        found.flags.writeable = False
        dfa.__dict__["_start_distances"] = found
    return found


# ---------------------------------------------------------------------------------------------------------
# Character automata: a transition function per state that is piecewise constant over codepoint intervals.


@dataclass(frozen=True)
class CharTransitions:
    """Codepoint -> next char state, as intervals: `starts[i] <= cp < starts[i+1]` goes to `targets[i]`.

    `starts[0] == 0`; a target of -1 means no transition.
    """

    starts: tuple[int, ...]
    targets: tuple[int, ...]

    def at(self, cp: int) -> int:
        return self.targets[bisect_right(self.starts, cp) - 1]

    def constant_on(self, lo: int, hi: int) -> bool:
        """True when every codepoint in [lo, hi] has the same target."""
        return bisect_right(self.starts, hi) == bisect_right(self.starts, lo)

    @staticmethod
    def from_intervals(intervals: Sequence[tuple[int, int, int]], default: int) -> CharTransitions:
        """Non-overlapping (lo, hi, target) intervals (inclusive) over `default` elsewhere."""
        starts: list[int] = []
        targets: list[int] = []
        pos = 0
        for lo, hi, target in sorted(intervals):
            if lo > pos:
                starts.append(pos)
                targets.append(default)
            starts.append(lo)
            targets.append(target)
            pos = hi + 1
        if pos <= MAX_CODEPOINT:
            starts.append(pos)
            targets.append(default)
        # Merge neighbours with equal targets so constant_on sees maximal runs.
        merged_s: list[int] = []
        merged_t: list[int] = []
        for s, t in zip(starts, targets):
            if merged_t and merged_t[-1] == t:
                continue
            merged_s.append(s)
            merged_t.append(t)
        return CharTransitions(tuple(merged_s), tuple(merged_t))


# UTF-8 lead bytes: (lead lo, lead hi, continuation bytes, first codepoint of lead lo's block, bits per lead).
_LEAD_RANGES = ((0xC2, 0xDF, 1), (0xE0, 0xEF, 2), (0xF0, 0xF4, 3))


def _second_byte_range(lead: int) -> tuple[int, int]:
    """Allowed first continuation byte after `lead` (excludes overlongs, surrogates and > U+10FFFF)."""
    special = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}
    return special.get(lead, (0x80, 0xBF))


def _lead_base(lead: int, k: int) -> int:
    if k == 1:
        return (lead & 0x1F) << 6
    if k == 2:
        return (lead & 0x0F) << 12
    return (lead & 0x07) << 18


class _Utf8Builder:
    """Expands a character automaton into a byte automaton, sharing identical intermediate states."""

    def __init__(self, num_char_states: int) -> None:
        self.rows: list[np.ndarray] = [np.full(256, DEAD, dtype=np.int32) for _ in range(num_char_states)]
        self._interned: dict[bytes, int] = {}
        self._const: dict[tuple[int, int, int, int], int] = {}

    def _intern(self, row: np.ndarray) -> int:
        key = row.tobytes()
        found = self._interned.get(key)
        if found is not None:
            return found
        self.rows.append(row)
        idx = len(self.rows) - 1
        self._interned[key] = idx
        return idx

    def _const_node(self, target: int, k: int, lo: int, hi: int) -> int:
        """State expecting `k` continuation bytes (the next in [lo, hi], the rest any), then `target`."""
        key = (target, k, lo, hi)
        found = self._const.get(key)
        if found is not None:
            return found
        row = np.full(256, DEAD, dtype=np.int32)
        row[lo:hi + 1] = target if k == 1 else self._const_node(target, k - 1, 0x80, 0xBF)
        idx = self._intern(row)
        self._const[key] = idx
        return idx

    def _node(self, fn: CharTransitions, base: int, k: int, lo: int, hi: int) -> int:
        """State after a lead/continuation prefix: `k` continuation bytes remain, the next one in [lo, hi];
        continuation byte c selects codepoints from base + (c - 0x80) * 64**(k-1). -1 when nothing follows."""
        span = 64 ** (k - 1)
        first = base + (lo - 0x80) * span
        last = base + (hi - 0x80) * span + span - 1
        if fn.constant_on(first, last):
            target = fn.at(first)
            return DEAD if target < 0 else self._const_node(target, k, lo, hi)
        row = np.full(256, DEAD, dtype=np.int32)
        for c in range(lo, hi + 1):
            sub = base + (c - 0x80) * span
            row[c] = fn.at(sub) if k == 1 else self._node(fn, sub, k - 1, 0x80, 0xBF)
        return self._intern(row) if (row >= 0).any() else DEAD

    def fill_char_state(self, state: int, fn: CharTransitions) -> None:
        row = self.rows[state]
        starts = np.asarray(fn.starts)
        row[:0x80] = np.asarray(fn.targets)[np.searchsorted(starts, np.arange(0x80), side="right") - 1]
        for lead_lo, lead_hi, k in _LEAD_RANGES:
            for lead in range(lead_lo, lead_hi + 1):
                lo, hi = _second_byte_range(lead)
                row[lead] = self._node(fn, _lead_base(lead, k), k, lo, hi)


def _prune(trans: np.ndarray, accepting: np.ndarray, start: int) -> ByteDFA:
    """Keep states reachable from `start` that can reach acceptance; renumber with start = 0."""
    n = trans.shape[0]
    # Co-reachability: iterate backwards until no new state can reach an accepting one.
    live = accepting.copy()
    while True:
        safe = np.where(trans >= 0, trans, 0)
        reach = (live[safe] & (trans >= 0)).any(axis=1) | live
        if (reach == live).all():
            break
        live = reach
    if not live[start]:
        return ByteDFA(np.full((1, 256), DEAD, dtype=np.int32), np.zeros(1, dtype=bool))
    trans = np.where((trans >= 0) & live[np.where(trans >= 0, trans, 0)], trans, DEAD)
    order = [start]
    seen = {start}
    i = 0
    while i < len(order):
        for t in np.unique(trans[order[i]]):
            t = int(t)
            if t >= 0 and t not in seen:
                seen.add(t)
                order.append(t)
        i += 1
    remap = np.full(n + 1, DEAD, dtype=np.int32)
    remap[np.array(order)] = np.arange(len(order), dtype=np.int32)
    new_trans = remap[trans[np.array(order)]]  # DEAD (-1) indexes the extra last slot, which is DEAD
    return ByteDFA(np.ascontiguousarray(new_trans, dtype=np.int32), accepting[np.array(order)].copy())


def dfa_from_char_automaton(transitions: Sequence[CharTransitions], accepting: Sequence[bool],
                            start: int) -> ByteDFA:
    """A character automaton (deterministic, codepoint-labelled) -> the equivalent byte-level DFA."""
    builder = _Utf8Builder(len(transitions))
    for state, fn in enumerate(transitions):
        builder.fill_char_state(state, fn)
    trans = np.stack(builder.rows).astype(np.int32)
    acc = np.zeros(trans.shape[0], dtype=bool)
    acc[: len(accepting)] = np.asarray(accepting, dtype=bool)
    return _prune(trans, acc, start)


def dfa_from_bytes(literal: bytes) -> ByteDFA:
    """Exactly `literal`."""
    n = len(literal) + 1
    trans = np.full((n, 256), DEAD, dtype=np.int32)
    for i, b in enumerate(literal):
        trans[i, b] = i + 1
    accepting = np.zeros(n, dtype=bool)
    accepting[-1] = True
    return ByteDFA(trans, accepting)


def dfa_from_strings(strings: Iterable[bytes]) -> ByteDFA:
    """Exactly the given byte strings, as the minimal acyclic DFA (common prefixes and suffixes shared, so the
    decimal spellings of a range of numbers take a few states, not one per number)."""
    children: list[dict[int, int]] = [{}]
    final = [False]
    for data in sorted(set(strings)):
        node = 0
        for b in data:
            nxt = children[node].get(b)
            if nxt is None:
                nxt = children[node][b] = len(children)
                children.append({})
                final.append(False)
            node = nxt
        final[node] = True
    # A node's children are created after it: in reverse creation order, equal futures get one state.
    signature: dict[tuple[bool, tuple[tuple[int, int], ...]], int] = {}
    merged = [0] * len(children)
    for node in range(len(children) - 1, -1, -1):
        key = (final[node], tuple(sorted((b, merged[c]) for b, c in children[node].items())))
        merged[node] = signature.setdefault(key, len(signature))
    trans = np.full((len(signature), 256), DEAD, dtype=np.int32)
    accepting = np.zeros(len(signature), dtype=bool)
    for (is_final, moves), state in signature.items():
        accepting[state] = is_final
        for b, target in moves:
            trans[state, b] = target
    return _prune(trans, accepting, merged[0])


def dfa_from_char_set(intervals: Sequence[tuple[int, int]], negated: bool = False) -> ByteDFA:
    """One character from the union of inclusive codepoint intervals (or its complement)."""
    inside, outside = (DEAD, 1) if negated else (1, DEAD)
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(intervals):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    fn = CharTransitions.from_intervals([(lo, hi, inside) for lo, hi in merged], outside)
    final = CharTransitions.from_intervals([], DEAD)
    return dfa_from_char_automaton([fn, final], [False, True], start=0)
