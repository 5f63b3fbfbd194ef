"""Frame walks over the distinct token suffixes below a set of pop nodes, merged once per vocabulary.

A frame walk (masks.py, stage k of a stack's mask) resumes a frame at the trie nodes where the frame above it may
end (its pop nodes) and reads what follows them in each token. What it reads below a pop node depends only on
the bytes after that node, and the subtrees below a pop set repeat the same few suffixes: every token ending a
JSON string (`abc"`, `x",` ...) is followed by `,`, `}`, `:` or nothing. So the subtrees below a pop set are
merged into one small trie of suffixes (`SuffixTrie`), built once per vocabulary and pop set and shared by every
frame and grammar, and a frame walk steps that trie (in Python: it is small) instead of every subtree; the tokens
and trie nodes behind each suffix are looked up, not walked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radixgen.grammars.automaton import PdaAutomaton
from radixgen.grammars.token_walk import EDGE_CHILDREN, Handoff, nodes_to_mask
from radixgen.grammars.vocabulary import Vocabulary


@dataclass(frozen=True)
class SuffixTrie:
    """The subtrees below a set of trie nodes, merged by suffix. Suffix node 0 is the empty suffix (the pop nodes
    themselves); each suffix node stands for the trie nodes that are some pop node followed by its suffix."""

    children: tuple[tuple[tuple[int, int], ...], ...]  # per suffix node: (byte, child suffix node), ascending
    nodes: tuple[np.ndarray, ...]  # per suffix node: the trie nodes it stands for, sorted
    tokens: tuple[np.ndarray, ...]  # per suffix node: the token ids those trie nodes spell


@dataclass(frozen=True)
class SuffixWalk:
    """A frame's walk from a pop set: the tokens it reads without leaving the frame (read-only: shared by every
    walk that reads the same suffixes), and the trie nodes where the frame's rule may end (the pops of the frame
    below). `escape_suffixes`: the suffix nodes those trie nodes stand for, when they are all there is (no walk
    handed off into a terminal), so a caller can key the next pop set by them instead of by its nodes."""

    packed: np.ndarray
    escape_nodes: np.ndarray  # not sorted, may repeat
    escape_suffixes: tuple[int, ...] | None = None


def suffix_trie(vocab: Vocabulary, pops: np.ndarray) -> SuffixTrie:
    """The `SuffixTrie` of the sorted, distinct trie nodes `pops`, cached per vocabulary (in its walk LRU)."""
    key = ("suffixes", pops.tobytes())
    stored = vocab.terminal_walks.get(key)
    if stored is not None:
        return SuffixTrie(*stored)
    child_start, child_count, node_byte = vocab.trie.lists()
    members: list[list[int]] = [pops.tolist()]
    children: list[tuple[tuple[int, int], ...]] = []
    i = 0
    while i < len(members):
        groups: dict[int, list[int]] = {}
        for node in members[i]:  # children of ascending nodes come out ascending (breadth-first numbering)
            first = child_start[node]
            for child in range(first, first + child_count[node]):
                groups.setdefault(node_byte[child], []).append(child)
        kids = []
        for byte in sorted(groups):
            kids.append((byte, len(members)))
            members.append(groups[byte])
        children.append(tuple(kids))
        i += 1
    sizes = np.fromiter(map(len, members), dtype=np.int64, count=len(members))
    flat = np.fromiter((n for group in members for n in group), dtype=np.int64, count=int(sizes.sum()))
    ids, counts = vocab.trie.node_token_counts(flat)
    per_suffix = np.add.reduceat(counts, np.concatenate(([0], np.cumsum(sizes)[:-1]))) if flat.size else counts
    nodes = tuple(np.split(flat, np.cumsum(sizes)[:-1]))
    tokens = tuple(np.split(ids, np.cumsum(per_suffix)[:-1]))
    found = SuffixTrie(tuple(children), nodes, tokens)
    vocab.terminal_walks.put(key, (found.children, found.nodes, found.tokens),
                             len(key[1]) + 2 * flat.nbytes + ids.nbytes + 64 * len(members))
    return found


def suffix_walk(vocab: Vocabulary, automaton: PdaAutomaton, start: int, pops: np.ndarray, escapes: bool,
                handoff: Handoff | None) -> SuffixWalk:
    """What `token_walk.walk_trie(automaton, start, trie, pops, escapes=escapes, handoff=handoff,
    start_parents=start, past_escapes=True)` finds (as a mask row and escape nodes), stepping the pop set's
    suffix trie: the state after a suffix is the same below every pop node it follows."""
    trie = suffix_trie(vocab, pops)
    children = trie.children
    alive: list[int] = []
    escaped: list[int] = []
    handed: list[tuple[int, int]] = []
    work = [(0, start)]
    while work:
        suffix, state = work.pop()
        if handoff is not None and automaton.terminal_top[state] >= 0:
            alive.append(suffix)
            handed.append((suffix, state))
            continue
        if escapes:
            nonempty = bool(automaton.nonempty[state])
            if nonempty:
                alive.append(suffix)
            if automaton.escapes[state]:
                escaped.append(suffix)
                if not nonempty:
                    continue
        else:
            alive.append(suffix)
        kids = children[suffix]
        if not kids:
            continue
        if len(kids) <= EDGE_CHILDREN and not automaton.row_known(state):
            for byte, child in kids:  # a state nobody has stepped yet: only the edges taken
                target = automaton.edge(state, byte)
                if target >= 0:
                    work.append((child, target))
        else:
            row = automaton.row_tuple(state)
            for byte, child in kids:
                target = row[byte]
                if target >= 0:
                    work.append((child, target))
    packed = _suffixes_mask(vocab, pops, trie, tuple(sorted(alive)))
    escape_nodes = [trie.nodes[s] for s in escaped]
    if not handed:
        return SuffixWalk(packed, np.concatenate(escape_nodes) if escape_nodes else np.zeros(0, dtype=np.int64),
                          tuple(sorted(escaped)))
    nodes = np.concatenate([trie.nodes[s] for s, _ in handed])
    states = np.repeat(np.array([st for _, st in handed], dtype=np.int64), [trie.nodes[s].shape[0] for s, _ in handed])
    assert handoff is not None
    below = handoff(nodes, states, escapes, True)
    packed = packed | nodes_to_mask(vocab, below.alive_nodes)
    if below.packed is not None:
        packed |= below.packed
    escape_nodes.append(below.escape_nodes)
    return SuffixWalk(packed, np.concatenate(escape_nodes))


def _suffixes_mask(vocab: Vocabulary, pops: np.ndarray, trie: SuffixTrie, alive: tuple[int, ...]) -> np.ndarray:
    """Packed row (read-only) of the tokens behind the suffix nodes `alive` of the pop set `pops`, cached per
    vocabulary: frames that differ (the positions of an object) mostly read the same suffixes below a pop set
    (`,` or `}` after a value), so their walks share one row."""
    key = ("suffix-mask", pops.tobytes(), alive)
    found: np.ndarray | None = vocab.terminal_walks.get(key)
    if found is None:
        found = np.zeros(vocab.mask_words, dtype=np.int32)
        ids = np.concatenate([trie.tokens[s] for s in alive]) if alive else np.zeros(0, dtype=np.int64)
        if ids.size:
            np.bitwise_or.at(found.view(np.uint32), ids >> 5,
                             np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32)))
        found.flags.writeable = False
        found = vocab.terminal_walks.put(key, found, found.nbytes + len(key[1]) + 8 * len(alive))
    return found
