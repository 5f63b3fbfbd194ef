"""Trie walks inside a shared terminal (a JSON string, a number, a key's tail), cached per vocabulary, and
the hand-off from a grammar's walk into them.

Large terminals are compiled once as shared sub-automata (pda.py), so the same `ByteDFA` object appears in
every grammar that uses it. Walking the vocabulary trie inside one is the expensive part of a mask (a string
accepts most of the vocabulary), and its result does not depend on the grammar around it: it is cached on
the vocabulary, keyed by (DFA, DFA state, start nodes), and reused by every grammar and every position (an
LRU bounded by bytes, `Vocabulary.terminal_walks`).
`TerminalHandoff` is what a grammar's trie walk calls where it enters such a terminal: the cached walk, then
the grammar's own walk again from the nodes where the terminal may end.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from radixgen.grammars.automaton import DfaEscapes, PdaAutomaton
from radixgen.grammars.bytedfa import ByteDFA
from radixgen.grammars.token_walk import WalkResult, nodes_to_mask, walk_trie
from radixgen.grammars.vocabulary import Vocabulary


@dataclass(frozen=True)
class TerminalWalk:
    """What a terminal reads from DFA state `q` below some trie nodes (their own tokens included)."""

    packed: np.ndarray  # tokens read without leaving the terminal (read-only)
    exit_nodes: np.ndarray  # trie nodes where the terminal may end (its DFA accepts there)
    exit_parent_states: np.ndarray  # the DFA state at each exit node's parent


@dataclass(frozen=True)
class _Base:
    """A node set whose subtrees are pairwise disjoint, with its walk: the walks below its nodes read
    disjoint token sets and end at disjoint exits, so a nearby set's walk is this one minus and plus the
    few nodes that differ."""

    nodes: np.ndarray
    walk: TerminalWalk
    exit_owner: np.ndarray  # per exit node: the index in `nodes` it lies below


BASE_MIN_NODES = 32  # sets at least this large become bases (a character's ends: a few hundred nodes)
NODE_WALKS = 8  # sets this small without a base are the union of their nodes' walks (cached per node)


def terminal_walk(vocab: Vocabulary, dfa: ByteDFA, q: int, nodes: np.ndarray) -> TerminalWalk:
    """The walk of `dfa` from state `q` below the sorted, distinct trie `nodes`, cached per vocabulary.

    Cached per node set (one mask row, so a set seen again costs a lookup). Sets differ from context to
    context by a few nodes (a key's first character excludes different names' first characters), so the last
    large set walked of each size (by powers of two) is kept as a base (see `_Base`): a set near it costs the
    walks of the nodes it adds (cached per node) and, for each node it drops, the tokens of that node's subtree
    taken out of the base's (`Vocabulary.subtree_mask`, no walk), not one walk below all of them (thousands of
    nodes with a large vocabulary). One base per size, so smaller sets walked in between do not displace it. A
    set of a few nodes with no base is the union of its nodes' walks, cached per node."""
    # Keys of the vocabulary's cache (an LRU by bytes, lru.py): (DFA digest, q, node set bytes) -> TerminalWalk;
    # (digest, q, node) -> TerminalWalk; (digest, q, "base", size bucket) -> _Base. Keys and values are stored as plain
    # tuples of bytes, ints and arrays, which the cyclic garbage collector stops tracking: tens of thousands of
    # cached walks would otherwise lengthen every full collection, and those pauses land in mask times.
    cache = vocab.terminal_walks
    key = (dfa.digest, q, nodes.tobytes())
    stored = cache.get(key)
    if stored is not None:
        return TerminalWalk(*stored)
    size = nodes.shape[0].bit_length()
    base = None
    for bucket in (size, size - 1, size + 1):
        stored_base = cache.get((dfa.digest, q, "base", bucket))
        if stored_base is not None and near_sets(stored_base[0], nodes):
            base = _Base(stored_base[0], TerminalWalk(*stored_base[1]), stored_base[2])
            break
    if base is None and nodes.shape[0] <= NODE_WALKS:
        found = _joined_walks(vocab, _node_walks(vocab, dfa, q, nodes))
    elif base is not None:
        kept = in_sorted(base.nodes, nodes)
        added = _node_walks(vocab, dfa, q, nodes[~in_sorted(nodes, base.nodes)])
        packed = base.walk.packed.copy()
        for node in base.nodes[~kept].tolist():  # the base's subtrees are disjoint: these tokens were its alone
            packed &= ~vocab.subtree_mask(node)
        for one in added:
            packed |= one.packed
        exits = kept[base.exit_owner]
        found = TerminalWalk(packed, _joined([base.walk.exit_nodes[exits]] + [w.exit_nodes for w in added]),
                             _joined([base.walk.exit_parent_states[exits]] + [w.exit_parent_states for w in added]))
    else:
        walk = walk_trie(DfaEscapes(dfa), np.full(nodes.shape[0], q, dtype=np.int64), vocab.trie, nodes,
                         escapes=True)
        found = TerminalWalk(nodes_to_mask(vocab, walk.alive_nodes), walk.escape_nodes, walk.escape_parent_states)
        if nodes.shape[0] >= BASE_MIN_NODES:
            owner = subtree_owners(vocab, nodes, walk.escape_nodes)
            if owner is not None:
                cache.put((dfa.digest, q, "base", size), (nodes, _fields(found), owner),
                          nodes.nbytes + owner.nbytes + _nbytes(found), replace=True)
    found.packed.flags.writeable = False
    cache.put(key, _fields(found), len(key[2]) + _nbytes(found))
    return found


def terminal_top_walk(vocab: Vocabulary, dfa: ByteDFA, q: int) -> tuple[np.ndarray, np.ndarray]:
    """A stack whose top frame is state `q` of terminal `dfa`: (packed tokens it reads without leaving the
    terminal, sorted trie nodes where the terminal may end: its pops). The frames below never matter here,
    so the walk is the DFA's alone, cached per vocabulary and shared by every grammar with the terminal."""
    cache = vocab.terminal_walks
    key = (dfa.digest, q, "top")
    stored: tuple[np.ndarray, np.ndarray] | None = cache.get(key)
    if stored is not None:
        return stored
    walk = walk_trie(DfaEscapes(dfa), q, vocab.trie, escapes=True, past_escapes=True)
    packed = nodes_to_mask(vocab, walk.alive_nodes)
    packed.flags.writeable = False
    found = (packed, sorted_unique(walk.escape_nodes))
    cache.put(key, found, packed.nbytes + found[1].nbytes)
    return found


def _fields(walk: TerminalWalk | WalkResult) -> tuple[np.ndarray | None, ...]:
    """A walk as the plain tuple of its fields (how the cache stores it, see `terminal_walk`)."""
    return tuple(getattr(walk, f.name) for f in fields(walk))


def _nbytes(walk: TerminalWalk | WalkResult) -> int:
    """The bytes of a cached walk's arrays (its share of the cache budget)."""
    return sum(a.nbytes for a in _fields(walk) if isinstance(a, np.ndarray))


def sorted_unique(nodes: np.ndarray) -> np.ndarray:
    """`np.unique` of an int array, free when it is sorted and distinct already (a walk's nodes usually are)."""
    if nodes.shape[0] < 2 or bool((nodes[1:] > nodes[:-1]).all()):
        return nodes
    return np.unique(nodes)


def in_sorted(values: np.ndarray, members: np.ndarray) -> np.ndarray:
    """bool per value: it is one of the sorted `members` (`np.isin` by binary search, for small sets)."""
    if members.shape[0] == 0:
        return np.zeros(values.shape[0], dtype=bool)
    at = np.searchsorted(members, values)
    found: np.ndarray = members[np.minimum(at, members.shape[0] - 1)] == values
    return found


def near_sets(base: np.ndarray, nodes: np.ndarray) -> bool:
    """Few enough nodes differ for the base to pay (at most a quarter of the set); both sorted and distinct."""
    common = int(in_sorted(nodes, base).sum())
    return bool((base.shape[0] - common) + (nodes.shape[0] - common) <= nodes.shape[0] // 4)


def _joined_walks(vocab: Vocabulary, walks: list[TerminalWalk]) -> TerminalWalk:
    """The walk below several nodes: the union of the walks below each."""
    packed = np.zeros(vocab.mask_words, dtype=np.int32)
    for walk in walks:
        packed |= walk.packed
    return TerminalWalk(packed, _joined([w.exit_nodes for w in walks]), _joined([w.exit_parent_states for w in walks]))


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)


def subtree_owners(vocab: Vocabulary, nodes: np.ndarray, below: np.ndarray) -> np.ndarray | None:
    """Index in the sorted `nodes` of the one node above each of `below` (their descendants), or None when
    some node of `nodes` lies below another (the subtrees are not disjoint)."""
    parent = vocab.trie.node_parent
    ancestors = parent[nodes]
    while ancestors.size:
        if in_sorted(ancestors, nodes).any():
            return None
        ancestors = parent[ancestors[ancestors != 0]]
    owner = np.full(below.shape[0], -1, dtype=np.int64)
    current = below.copy()
    pending = np.arange(below.shape[0])
    for _ in range(len(vocab.trie.level_start)):  # one trie level up per round
        if pending.size == 0:
            break
        at = np.searchsorted(nodes, current)
        hit = nodes[np.minimum(at, nodes.shape[0] - 1)] == current
        owner[pending[hit]] = at[hit]
        pending, current = pending[~hit], parent[current[~hit]]
    return owner


def _node_walks(vocab: Vocabulary, dfa: ByteDFA, q: int, nodes: np.ndarray) -> list[TerminalWalk]:
    """The walk below each of `nodes` alone, cached per (DFA, state, node) with its tokens as a mask row, so a
    set near a base adds or removes it with one row operation."""
    cache = vocab.terminal_walks
    out = []
    for node in nodes.tolist():
        stored = cache.get((dfa.digest, q, node))
        if stored is None:
            walk = walk_trie(DfaEscapes(dfa), q, vocab.trie, node, escapes=True)
            found = TerminalWalk(nodes_to_mask(vocab, walk.alive_nodes), walk.escape_nodes, walk.escape_parent_states)
            found.packed.flags.writeable = False
            cache.put((dfa.digest, q, node), _fields(found), _nbytes(found))
        else:
            found = TerminalWalk(*stored)
        out.append(found)
    return out


class TerminalHandoff:
    """The `handoff` of a grammar's trie walks (see `walk_trie`): subtrees below configurations that are one
    stack inside a shared terminal are answered from `terminal_walk`, one per configuration from all of
    its nodes at once; where the terminal may end, the configuration's own walk resumes."""

    def __init__(self, vocab: Vocabulary, automaton: PdaAutomaton) -> None:
        self.vocab = vocab
        self.automaton = automaton

    def __call__(self, nodes: np.ndarray, states: np.ndarray, escapes: bool, past_escapes: bool) -> WalkResult:
        automaton = self.automaton
        pda = automaton.pda
        assert pda.terminal_of is not None
        packed = np.zeros(self.vocab.mask_words, dtype=np.int32)
        exit_nodes: list[np.ndarray] = []
        exit_configs: list[np.ndarray] = []
        order = np.argsort(states, kind="stable")
        states, nodes = states[order], nodes[order]
        firsts = np.flatnonzero(np.concatenate(([True], states[1:] != states[:-1])))
        for state, group in zip(states[firsts].tolist(), np.split(nodes, firsts[1:])):
            (stack,) = automaton.stacks(state)
            offset, dfa = pda.terminals[int(pda.terminal_of[stack[-1]])]
            inside = terminal_walk(self.vocab, dfa, stack[-1] - offset, sorted_unique(group))
            packed |= inside.packed
            if inside.exit_nodes.size:
                exit_nodes.append(inside.exit_nodes)
                exit_configs.append(self._exit_configs(stack[:-1], offset, inside))
        if not exit_nodes:
            empty = np.zeros(0, dtype=np.int64)
            return WalkResult(empty, empty, empty, packed)
        below = self._walk_exits(np.concatenate(exit_nodes), np.concatenate(exit_configs), escapes, past_escapes)
        if below.packed is not None:
            packed |= below.packed
        return WalkResult(below.alive_nodes, below.escape_nodes, below.escape_parent_states, packed)

    def _exit_configs(self, prefix: tuple[int, ...], offset: int, inside: TerminalWalk) -> np.ndarray:
        """Per exit node of a terminal walk: the configuration `prefix + (its parent's PDA state,)`."""
        parents = inside.exit_parent_states
        configs = np.empty_like(parents)
        for q in np.unique(parents).tolist():
            configs[parents == q] = self.automaton.intern_stacks((prefix + (offset + q,),))
        return configs

    def _walk_exits(self, nodes: np.ndarray, parents: np.ndarray, escapes: bool,
                    past_escapes: bool) -> WalkResult:
        """Walk from each of `nodes` freshly reached by its byte from configuration `parents`."""
        automaton = self.automaton
        automaton.ensure_rows(parents)
        starts = automaton.table[parents, self.vocab.trie.node_byte[nodes]].astype(np.int64)
        live = starts >= 0
        return walk_trie(automaton, starts[live], self.vocab.trie, nodes[live], escapes=escapes, handoff=self,
                         start_parents=parents[live], past_escapes=past_escapes)
