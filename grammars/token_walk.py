"""Which tokens can an automaton read from a state: a breadth-first walk of the vocabulary trie.

All trie nodes of one depth are stepped together with one gather from the automaton's table; a node whose
state is dead prunes its whole subtree. The cost is proportional to the live part of the trie, not to the
vocabulary size times the token length. Narrow levels (a handful of live nodes, typical where the grammar
allows few bytes) are stepped in plain Python instead, where numpy's per-call overhead would dominate.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np

from radixgen.grammars.automaton import ByteAutomaton, DfaEscapes, EscapeFlags
from radixgen.grammars.vocabulary import TokenTrie, Vocabulary

NARROW = 12  # levels with at most this many live nodes are stepped in Python
EDGE_CHILDREN = 4  # below an unknown row, nodes with at most this many children step edge by edge


@dataclass(frozen=True)
class WalkResult:
    """`alive_nodes`: trie nodes (in the walked subtrees) readable without leaving what the state knows.
    `escape_nodes`: trie nodes where the walk reached an escaping state (answers below them need the
    frames the state does not hold); empty for automata without escapes.
    `packed`: more readable tokens, already as a mask row (from cached walks the handoff reused), or None."""

    alive_nodes: np.ndarray
    escape_nodes: np.ndarray
    escape_parent_states: np.ndarray  # the (non-escaping) state at each escape node's parent
    packed: np.ndarray | None = None


def walk_mask(vocab: Vocabulary, walk: WalkResult) -> np.ndarray:
    """Packed bitmask of every token a walk found readable."""
    out = nodes_to_mask(vocab, walk.alive_nodes)
    if walk.packed is not None:
        out |= walk.packed
    return out


Handoff = Callable[[np.ndarray, np.ndarray, bool, bool], "WalkResult"]  # (nodes, states, escapes, past_escapes)
Frontier = tuple[np.ndarray, np.ndarray] | tuple[list[int], list[int]]  # (nodes, states) of one trie level


def walk_trie(automaton: ByteAutomaton | DfaEscapes, state: int | np.ndarray, trie: TokenTrie,
              start_node: int | np.ndarray = 0, escapes: bool = False, handoff: Handoff | None = None,
              start_parents: np.ndarray | None = None, past_escapes: bool = False) -> WalkResult:
    """Walk the subtrees of `start_node` (whose bytes led to `state`; arrays walk several at once).

    With `escapes`, the automaton's `escapes` / `nonempty` flags split the answer into the exact part and the
    escape nodes, whose subtrees (the escape node's own token included) are left out of `alive_nodes` except
    where a non-escaping path reaches them. With `past_escapes` too, escape nodes are only recorded: the walk
    goes on below them with the stacks that did not escape, so `alive_nodes` is everything readable without
    leaving what the state knows, and the escape nodes are the points where it may be left.

    `handoff(nodes, states, escapes, past_escapes)`, when given, walks the subtrees below states the automaton
    marks in `terminal_top` (the caller reuses cached terminal walks there). `start_parents` makes the start nodes
    count as freshly reached (checked for escapes, with these parent states) instead of already alive."""
    nodes = np.atleast_1d(np.asarray(start_node, dtype=np.int64))
    states = np.atleast_1d(np.asarray(state, dtype=np.int64))
    walk = _Walk(automaton, trie, escapes, handoff, past_escapes)
    if start_parents is None:
        walk.alive.append(nodes[nodes != 0])
        frontier: Frontier = (nodes, states)
    elif nodes.size <= NARROW:
        frontier = walk.reached(nodes.tolist(), states.tolist(), start_parents.tolist())
    else:
        frontier = walk.reached_wide(nodes, states, start_parents.astype(np.int64))
    # The frontier stays in the form its level produced: lists from narrow levels, arrays from wide ones.
    while len(frontier[0]):
        if len(frontier[0]) <= NARROW:
            frontier = walk.reached(*_narrow_level(automaton, trie, *_as_lists(frontier)))
        else:
            frontier = walk.wide_level(np.asarray(frontier[0], dtype=np.int64),
                                       np.asarray(frontier[1], dtype=np.int64))
    return walk.result()


def _as_lists(frontier: Frontier) -> tuple[list[int], list[int]]:
    nodes, states = frontier
    if isinstance(nodes, np.ndarray):
        return nodes.tolist(), np.asarray(states).tolist()
    return nodes, states  # type: ignore[return-value]


class _Walk:
    """Accumulates one walk's answer; levels come in as Python lists (narrow) or arrays (wide)."""

    def __init__(self, automaton: ByteAutomaton | DfaEscapes, trie: TokenTrie, escapes: bool,
                 handoff: Handoff | None, past_escapes: bool) -> None:
        self.automaton = automaton
        self.trie = trie
        self.escapes = escapes
        # the automaton again as the owner of the escape flags, read afresh each level (interning may grow
        # them); a walk with `escapes` is only given automata that have them
        self.flags = cast(EscapeFlags, automaton) if escapes else None
        self.past_escapes = past_escapes
        self.handoff = handoff
        self.uses_handoff = handoff is not None and hasattr(automaton, "terminal_top")
        self.alive: list[np.ndarray] = []
        self.alive_py: list[int] = []
        self.escape_py: list[int] = []
        self.escape_parent_py: list[int] = []
        self.escape_arrays: list[tuple[np.ndarray, np.ndarray]] = []
        self.handed_nodes: list[np.ndarray] = []
        self.handed_states: list[np.ndarray] = []

    def reached(self, nodes: list[int], states: list[int], parents: list[int]) -> tuple[list[int], list[int]]:
        """Record freshly reached (node, state) pairs; return those whose subtrees the walk continues."""
        automaton = self.automaton
        terminal_top = automaton.terminal_top if self.uses_handoff else None  # type: ignore[union-attr]
        flags = self.flags
        escapes_flags = flags.escapes if flags is not None else None
        nonempty = flags.nonempty if flags is not None else None
        past = self.past_escapes
        next_nodes: list[int] = []
        next_states: list[int] = []
        handed_n: list[int] = []
        handed_s: list[int] = []
        for node, st, parent in zip(nodes, states, parents):
            if terminal_top is not None and terminal_top[st] >= 0:
                self.alive_py.append(node)
                handed_n.append(node)
                handed_s.append(st)
                continue
            if escapes_flags is not None:
                if nonempty[st]:  # type: ignore[index]
                    self.alive_py.append(node)
                if escapes_flags[st]:
                    self.escape_py.append(node)
                    self.escape_parent_py.append(parent)
                    if not past or not nonempty[st]:  # type: ignore[index]
                        continue  # below an escape node the caller walks again with full context
            else:
                self.alive_py.append(node)
            next_nodes.append(node)
            next_states.append(st)
        if handed_n:
            self.handed_nodes.append(np.array(handed_n, dtype=np.int64))
            self.handed_states.append(np.array(handed_s, dtype=np.int64))
        return next_nodes, next_states

    def wide_level(self, nodes: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        trie, automaton = self.trie, self.automaton
        counts = trie.child_count[nodes]
        total = int(counts.sum())
        if total == 0:
            return nodes[:0], states[:0]
        run_ends = np.cumsum(counts)
        # children of every frontier node, contiguous runs concatenated
        children = np.repeat(trie.child_start[nodes] - (run_ends - counts), counts) + np.arange(total)
        automaton.ensure_rows(states)
        parent_states = np.repeat(states, counts)
        nxt = automaton.table[parent_states, trie.node_byte[children]]
        live = nxt >= 0
        return self.reached_wide(children[live], nxt[live].astype(np.int64), parent_states[live])

    def reached_wide(self, nodes: np.ndarray, states: np.ndarray,
                     parent_states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`reached` for arrays."""
        automaton = self.automaton
        if self.uses_handoff and nodes.size:
            terminal_top = automaton.terminal_top  # type: ignore[union-attr]
            handed = terminal_top[states] >= 0
            if handed.any():
                self.alive.append(nodes[handed])
                self.handed_nodes.append(nodes[handed])
                self.handed_states.append(states[handed])
                keep = ~handed
                nodes, states, parent_states = nodes[keep], states[keep], parent_states[keep]
        flags = self.flags
        if flags is not None and nodes.size:
            escaped = flags.escapes[states]
            self.alive.append(nodes[flags.nonempty[states]])
            if escaped.any():
                self.escape_arrays.append((nodes[escaped], parent_states[escaped]))
                keep = flags.nonempty[states] if self.past_escapes else ~escaped
                nodes, states = nodes[keep], states[keep]
        else:
            self.alive.append(nodes)
        return nodes, states

    def result(self) -> WalkResult:
        alive = self.alive + [np.array(self.alive_py, dtype=np.int64)]
        escape_nodes = [n for n, _ in self.escape_arrays] + [np.array(self.escape_py, dtype=np.int64)]
        escape_parents = [p for _, p in self.escape_arrays]
        escape_parents.append(np.array(self.escape_parent_py, dtype=np.int64))
        packed = None
        if self.handed_nodes:
            assert self.handoff is not None
            sub = self.handoff(np.concatenate(self.handed_nodes), np.concatenate(self.handed_states),
                               self.escapes, self.past_escapes)
            alive.append(sub.alive_nodes)
            escape_nodes.append(sub.escape_nodes)
            escape_parents.append(sub.escape_parent_states)
            packed = sub.packed
        return WalkResult(np.concatenate(alive), np.concatenate(escape_nodes), np.concatenate(escape_parents),
                          packed)


def _narrow_level(automaton: ByteAutomaton | DfaEscapes, trie: TokenTrie, nodes: list[int],
                  states: list[int]) -> tuple[list[int], list[int], list[int]]:
    """One level for a few nodes: for each node, the live bytes of its state that are also child bytes.
    Returns (children, their states, their parents' states)."""
    child_start, child_count, node_byte = trie.lists()
    out_parents: list[int] = []
    out_nodes: list[int] = []
    out_states: list[int] = []
    edge = getattr(automaton, "edge", None)  # a lazily determinized automaton: rows may be unknown
    for node, state in zip(nodes, states):
        count = child_count[node]
        if count == 0:
            continue
        lo = child_start[node]
        hi = lo + count
        if edge is not None and count <= EDGE_CHILDREN and not automaton.row_known(state):  # type: ignore[union-attr]
            # A node with few children under a state nobody has stepped yet: compute only those edges.
            for i in range(lo, hi):
                target = edge(state, node_byte[i])
                if target >= 0:
                    out_parents.append(state)
                    out_nodes.append(i)
                    out_states.append(target)
            continue
        pairs = automaton.live_pairs(state)
        if len(pairs) <= count:
            for byte, target in pairs:
                i = bisect_left(node_byte, byte, lo, hi)
                if i < hi and node_byte[i] == byte:
                    out_parents.append(state)
                    out_nodes.append(i)
                    out_states.append(target)
                    lo = i + 1
        else:
            row = automaton.row_tuple(state)
            for i in range(lo, hi):
                target = row[node_byte[i]]
                if target >= 0:
                    out_parents.append(state)
                    out_nodes.append(i)
                    out_states.append(target)
    return out_nodes, out_states, out_parents


def nodes_to_mask(vocab: Vocabulary, nodes: np.ndarray) -> np.ndarray:
    """Packed bitmask of the tokens spelled by trie `nodes` (specials never included)."""
    out = np.zeros(vocab.mask_words, dtype=np.int32)
    if nodes.size == 0:
        return out
    first, more, more_nodes, more_ids = vocab.trie.token_ids()
    ids = first[nodes]
    ids = ids[ids >= 0]
    if more[nodes].any():
        ids = np.concatenate([ids, more_ids[np.isin(more_nodes, nodes)]])
    allowed = np.zeros(out.shape[0] * 32, dtype=bool)
    allowed[ids] = True
    out[:] = np.packbits(allowed, bitorder="little").view("<i4")
    return out
