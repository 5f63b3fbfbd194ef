"""Bounded repetitions of a one-item terminal, fused with what closes them into one terminal DFA.

`x{lo,hi} c` where `x` is one item (a JSON string character, a character class: its DFA accepts only at its
end) and `c` is a terminal that cannot start with a byte `x` can start with (the closing quote) is regular:
one DFA with a copy of `x`'s states per count (its *counting states*), `c` reachable from the counts `lo..hi`.
As a grammar it would be a rule state per count, each calling `x` as a sub-automaton, and every token walk
over it alternates between the rule and `x` once per character (milliseconds per position of a long
string). As one terminal it is walked as a plain DFA, shared by every grammar with the same parts and bounds
(the DFA is cached by their identity, and terminal DFAs are already shared per identity, so its trie walks
are cached per vocabulary: terminal_walks.py), and its counts far from the bounds share walks through the
lookahead representatives (lookahead.py).

The table has `hi * (states of x - 1) + states of c` rows, so one DFA holds repetitions up to
`MAX_FUSED_STATES` rows. A longer one (a `maxLength` of thousands) is read in blocks (`blocked_repeat`): a
count n is `B * i + j` with `j < B`, so `x{lo,hi} c` is i blocks `x{B}` (one fused DFA) then a tail
`x{jlo,jhi} c` (another), one grammar state per block count. Walks stay inside fused DFAs except at a block's
end, so a string of any bound costs what a short one does.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from radixgen.grammars.bytedfa import DEAD, ByteDFA
from radixgen.grammars.ir import Alt, Expr, Graph, Repeat, RuleRef, Seq, Terminal

MAX_FUSED_STATES = 4608  # rows of a fused DFA (about 4.5 MB): a JSON string character{0,256} and its quote
FUSED_CACHE_SIZE = 64


def one_item(dfa: ByteDFA) -> bool:
    """`dfa` reads one item: nothing after it accepts, it never returns to its start, never accepts empty."""
    return (not dfa.accepting[0] and not (dfa.trans[dfa.accepting] >= 0).any()
            and not (dfa.trans == 0).any())


def chainable(item: ByteDFA, close: ByteDFA) -> bool:
    """`item{lo,hi} close` is deterministic as one chain of counted copies of `item` (any bounds)."""
    if not one_item(item) or close.accepts_empty() or (close.trans == 0).any():
        return False
    return not ((item.trans[0] >= 0) & (close.trans[0] >= 0)).any()  # else a byte could continue or close


def _rows_per_count(item: ByteDFA) -> int:
    return item.num_states - int(item.accepting.sum())


def fusable(item: ByteDFA, close: ByteDFA, hi: int) -> bool:
    """`item{lo,hi} close` can be one `bounded_repeat` DFA within `MAX_FUSED_STATES` rows."""
    return chainable(item, close) and hi * _rows_per_count(item) + close.num_states <= MAX_FUSED_STATES


def block_items(item: ByteDFA, close: ByteDFA) -> int:
    """Items per block of `blocked_repeat`: the largest power of two whose block and tail DFAs each fit in
    `MAX_FUSED_STATES` rows (0 when not even one item does)."""
    size = 1
    while fusable(item, close, 2 * size):
        size *= 2
    return size if fusable(item, close, size) else 0


@lru_cache(maxsize=FUSED_CACHE_SIZE)
def bounded_repeat(item: ByteDFA, lo: int, hi: int, close: ByteDFA) -> ByteDFA:
    """The DFA of `item{lo,hi} close` (see `fusable`); the same object for the same arguments.

    Layout: count c in 0..hi-1 owns rows `c * k .. c * k + k - 1` (k = item's non-accepting states, its
    start first: the boundary before character c + 1); row `hi * k` is the boundary after `hi` characters;
    `close`'s states after its start follow. An item's accepting state is the next count's boundary, and
    every boundary from `lo` on also reads `close`'s first byte."""
    counted, k = _counting_rows(item, hi)
    close_base = hi * k  # close state s (s >= 1) is row close_base + s
    close_rows = close.trans[1:]
    closing = np.where(close_rows >= 0, close_rows + close_base, DEAD)
    trans = np.concatenate([counted, np.full((1, 256), DEAD, dtype=np.int64), closing]).astype(np.int32)
    first = close.trans[0]
    boundaries = np.arange(lo, hi + 1, dtype=np.int64) * k
    trans[np.ix_(boundaries, np.flatnonzero(first >= 0))] = (first[first >= 0] + close_base)[None, :]
    accepting = np.concatenate([np.zeros(hi * k + 1, dtype=bool), close.accepting[1:]])
    return ByteDFA(np.ascontiguousarray(trans), accepting)


def _counting_rows(item: ByteDFA, count: int) -> tuple[np.ndarray, int]:
    """The rows of `count` chained copies of `item`'s non-accepting states (k rows per count, its start first;
    an item's end leads k rows on, to the next count's boundary) and k."""
    keep = np.flatnonzero(~item.accepting)  # the start (0) first: it is not accepting
    k = keep.shape[0]
    local = np.full(item.num_states, DEAD, dtype=np.int64)
    local[keep] = np.arange(k)
    local[item.accepting] = k  # the next count's boundary, k rows on
    rows = item.trans[keep]
    chain = np.where(rows >= 0, local[np.maximum(rows, 0)], DEAD)  # [k, 256], relative to the count's base
    bases = np.arange(count, dtype=np.int64)[:, None, None] * k
    return np.where(chain[None] >= 0, chain[None] + bases, DEAD).reshape(count * k, 256), k


@lru_cache(maxsize=FUSED_CACHE_SIZE)
def exact_repeat(item: ByteDFA, count: int) -> ByteDFA:
    """The DFA of `item{count}`: `bounded_repeat`'s counting rows, the boundary after the last item its only
    accepting state (it reads nothing more)."""
    counted, _ = _counting_rows(item, count)
    trans = np.concatenate([counted, np.full((1, 256), DEAD, dtype=np.int64)]).astype(np.int32)
    accepting = np.zeros(trans.shape[0], dtype=bool)
    accepting[-1] = True
    return ByteDFA(np.ascontiguousarray(trans), accepting)


def blocked_repeat(item: Terminal, lo: int, hi: int, close: Terminal, block: int) -> Graph:
    """`item{lo,hi} close` as blocks: from block count i (node i), another block `item{block}` (to node i + 1)
    or the tail `item{jlo,jhi} close` with `jlo..jhi` the counts left for that i below `block` (to the end).
    Each count n has one split `block * i + j`, so exactly one path reads it; the tails of the inner block
    counts are one DFA."""
    blocks = hi // block
    whole = Terminal(exact_repeat(item.dfa, block), f"{item.label}{{{block}}}")
    edges: list[tuple[int, Expr, int]] = []
    for i in range(blocks + 1):
        if i < blocks:
            edges.append((i, whole, i + 1))
        jlo, jhi = max(0, lo - block * i), min(block - 1, hi - block * i)
        if jlo <= jhi:
            tail = bounded_repeat(item.dfa, jlo, jhi, close.dfa)
            edges.append((i, Terminal(tail, f"{item.label}{{{jlo},{jhi}}}{close.label}"), blocks + 1))
    return Graph(tuple(edges), blocks + 1)


def _as_terminal(expr: Expr, rules: dict[str, Expr]) -> Terminal | None:
    """`expr` as one terminal: itself, or a rule whose whole body is one terminal (`char ::= /.../`)."""
    if isinstance(expr, RuleRef):
        expr = rules.get(expr.name, expr)
    return expr if isinstance(expr, Terminal) else None


def fuse_bounded_repeats(expr: Expr, rules: dict[str, Expr]) -> Expr:
    """`expr` with every `item{lo,hi}` directly followed (in a sequence) by a closing terminal replaced by
    their `bounded_repeat` terminal where `fusable` (nested expressions included)."""
    if isinstance(expr, Seq):
        items = [fuse_bounded_repeats(e, rules) for e in expr.items]
        out: list[Expr] = []
        i = 0
        while i < len(items):
            fused = _fused_pair(items[i], items[i + 1], rules) if i + 1 < len(items) else None
            out.append(items[i] if fused is None else fused)
            i += 1 if fused is None else 2
        return Seq(tuple(out))
    if isinstance(expr, Repeat):
        return Repeat(fuse_bounded_repeats(expr.item, rules), expr.min, expr.max)
    if isinstance(expr, Alt):
        return Alt(tuple(fuse_bounded_repeats(e, rules) for e in expr.options))
    if isinstance(expr, Graph):
        return Graph(tuple((a, fuse_bounded_repeats(e, rules), b) for a, e, b in expr.edges), expr.end)
    return expr


def _fused_pair(first: Expr, second: Expr, rules: dict[str, Expr]) -> Terminal | Graph | None:
    if not isinstance(first, Repeat) or first.max is None or first.max == 0 or first.min > first.max:
        return None
    item, close = _as_terminal(first.item, rules), _as_terminal(second, rules)
    if item is None or close is None or not chainable(item.dfa, close.dfa):
        return None
    if fusable(item.dfa, close.dfa, first.max):
        dfa = bounded_repeat(item.dfa, first.min, first.max, close.dfa)
        return Terminal(dfa, f"{item.label}{{{first.min},{first.max}}}{close.label}")
    block = block_items(item.dfa, close.dfa)
    return blocked_repeat(item, first.min, first.max, close, block) if block else None
