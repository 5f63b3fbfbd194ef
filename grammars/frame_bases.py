"""Frame walks from large pop sets, derived from a nearby set's walk of the same frame.

A frame below a pop set near the root (a key's first character: every one-character node but those starting a
declared name) is walked below hundreds of nodes covering most of the trie (masks.py, `MaskCache._frame_walk`).
Positions of one key differ only in the few characters they exclude, so the frame is walked from nearly the same
set again and again. A walk from a set of nodes is the union of the walks below each of them; where the nodes of
a set walked once (the base) have disjoint subtrees, each node's share of the base's tokens is exactly the base's
tokens in its subtree. So a nearby set's walk is the base's tokens without the subtrees of the nodes it drops
(`Vocabulary.subtree_mask`, no walk), plus the walk below the few nodes it adds; its escape nodes are the base's
below the nodes it keeps, plus those of the added walk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from radixgen.grammars.terminal_walks import in_sorted, near_sets, subtree_owners
from radixgen.grammars.vocabulary import Vocabulary

BASE_MIN_NODES = 64  # pop sets at least this large become bases...
BASE_MAX_NODES = 4096  # ...and at most this large: past it the set operations cost about what the walk does


@dataclass(frozen=True)
class _Base:
    nodes: np.ndarray  # sorted, distinct, pairwise disjoint subtrees
    packed: np.ndarray  # the tokens the frame reads below them
    escape_nodes: np.ndarray  # where its rule may end below them
    escape_owner: np.ndarray  # per escape node: the index in `nodes` it lies below


Walk = tuple[np.ndarray, np.ndarray]  # (packed tokens, escape nodes) of a frame below some nodes


class FrameBases:
    """Per grammar: a large pop set each (frame, root) was walked from, kept when its nodes' subtrees are
    disjoint, and the walks derived from it."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self._bases: dict[tuple[int, bool], _Base] = {}

    def offer(self, frame: int, root: bool, nodes: np.ndarray, walk: Walk) -> None:
        """Keep the walk of `frame` below the sorted, distinct `nodes` as its base, if they qualify: large (within
        bounds), with disjoint subtrees, and not smaller than the base it replaces (the few nodes a derived walk
        adds are walked on their own and must not displace the base they were derived from)."""
        current = self._bases.get((frame, root))
        if not BASE_MIN_NODES <= nodes.shape[0] <= BASE_MAX_NODES or (
                current is not None and current.nodes.shape[0] > nodes.shape[0]):
            return
        packed, escape_nodes = walk
        owner = subtree_owners(self.vocab, nodes, escape_nodes)
        if owner is not None:
            self._bases[(frame, root)] = _Base(nodes, packed, escape_nodes, owner)

    def derive(self, frame: int, root: bool, nodes: np.ndarray,
               walk_below: Callable[[np.ndarray], Walk]) -> Walk | None:
        """The walk of `frame` below the sorted, distinct `nodes` from its base, or None without a base near
        them. `walk_below(added nodes)` walks the nodes the base lacks."""
        base = self._bases.get((frame, root))
        if base is None or not near_sets(base.nodes, nodes):
            return None
        kept = in_sorted(base.nodes, nodes)
        packed = base.packed.copy()
        for node in base.nodes[~kept].tolist():
            packed &= ~self.vocab.subtree_mask(node)
        escapes = [base.escape_nodes[kept[base.escape_owner]]]
        added = nodes[~in_sorted(nodes, base.nodes)]
        if added.size:
            added_packed, added_escapes = walk_below(added)
            packed |= added_packed
            escapes.append(added_escapes)
            if base.nodes.shape[0] + added.shape[0] <= BASE_MAX_NODES:
                self._grow(frame, root, base, added, (added_packed, added_escapes))
        return packed, np.concatenate(escapes)

    def _grow(self, frame: int, root: bool, base: _Base, added: np.ndarray, walk: Walk) -> None:
        """Make the base the union of itself and the nodes a derived walk added (when the subtrees stay
        disjoint), so later sets near both need no walk at all."""
        nodes = np.union1d(base.nodes, added)  # (sorted)
        escape_nodes = np.concatenate([base.escape_nodes, walk[1]])
        owner = subtree_owners(self.vocab, nodes, escape_nodes)
        if owner is not None:
            self._bases[(frame, root)] = _Base(nodes, base.packed | walk[0], escape_nodes, owner)
