"""RadixCache: token-id prefixes -> KV slot indices, with locks and LRU eviction of unlocked leaves.

The tree stores slot indices, never KV memory: the KV pool holds the memory and the slot allocator the free
slots. Every namespace has its own root. Sizes (evictable/protected tokens, node count) and the evictable-leaf
set are kept incrementally; `check_integrity` recomputes all of them from scratch. docs/radix.md lists the
invariants and the caller's protocol.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from .api import CacheStats, InsertResult, IntArray, MatchResult, Namespace, SlotArray
from .lru import LeafLRU
from .node import EMPTY_IDS, ChildKey, RadixNode, as_token_ids, first_mismatch


class RadixCache:
    """A radix tree over token ids whose edges hold the KV slots of their tokens.

    `page_size` > 1 makes the tree page-granular: only whole pages are inserted and matched, and edges split
    only at page boundaries (so a slot page is never shared by two edges).
    """

    stores_prefixes = True

    def __init__(self, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self._roots: dict[Namespace, RadixNode] = {}
        self._leaves = LeafLRU()
        self._tick = 0
        self._next_uid = 0
        self._evictable = 0
        self._protected = 0
        self._num_nodes = 0
        self._match_calls = 0
        self._query_tokens = 0
        self._hit_tokens = 0
        self._inserted_tokens = 0
        self._evicted_tokens = 0

    # ---------------------------------------------------------------- match / insert

    def match_prefix(self, token_ids: IntArray, namespace: Namespace = None) -> MatchResult:
        """The longest cached prefix of `token_ids` (whole pages only) and the node that ends exactly there.

        Splits the last edge when the match ends inside it; refreshes the LRU tick of the matched path.
        """
        key = as_token_ids(token_ids)
        self._match_calls += 1
        self._query_tokens += len(key)
        self._tick += 1
        root = self._roots.get(namespace)
        if root is None:  # an unknown namespace: a transient root, so matching alone never grows the tree
            return MatchResult(EMPTY_IDS, self._new_node(EMPTY_IDS, EMPTY_IDS, None, namespace), 0)
        usable = len(key) - len(key) % self.page_size
        node, pos, pieces = root, 0, []
        while pos < usable:
            child = node.children.get(self._child_key(key[pos:]))
            if child is None:
                break
            k = self._common_len(child.key, key[pos:usable])
            if k < len(child.key):
                child = self._split(child, k)
            pieces.append(child.value)
            pos += k
            node = child
        self._touch(node)
        self._hit_tokens += pos
        slots = np.concatenate(pieces) if pieces else EMPTY_IDS
        return MatchResult(slots, node, pos)

    def insert(self, token_ids: IntArray, slots: IntArray, namespace: Namespace = None) -> InsertResult:
        """Cache `token_ids[:n]` -> `slots[:n]`, n = the length rounded down to whole pages.

        The tree keeps its existing slots for the already-cached leading tokens and takes the caller's for the
        rest; see `InsertResult` for which slots the caller still owns. Refreshes the LRU tick of the path.
        """
        key = as_token_ids(token_ids)
        value = np.asarray(slots)
        if value.shape != key.shape:
            raise ValueError(f"slots must match token_ids in shape, got {value.shape} vs {key.shape}")
        if value.size and not np.issubdtype(value.dtype, np.integer):
            raise TypeError(f"slots must be an integer array, got dtype {value.dtype}")
        stored = len(key) - len(key) % self.page_size
        if stored == 0:
            return InsertResult(0, 0)
        self._tick += 1
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = self._new_node(EMPTY_IDS, EMPTY_IDS, None, namespace)
        node, pos = root, 0
        while pos < stored:
            child = node.children.get(self._child_key(key[pos:]))
            if child is None:
                node = self._add_leaf(node, key[pos:stored], value[pos:stored])
                break
            k = self._common_len(child.key, key[pos:stored])
            if k < len(child.key) and pos + k < stored:  # diverges inside the edge: split, then branch off
                child = self._split(child, k)
            pos += k
            node = child
        self._touch(node)
        return InsertResult(pos, stored)

    # ---------------------------------------------------------------- locks

    def lock(self, node: RadixNode) -> None:
        """Protect the path from `node` to its root from eviction (counted: each lock needs one unlock)."""
        self._require_live(node)
        while node.parent is not None:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
                self._leaves.discard(node)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        """Undo one `lock(node)`; nodes whose count drops to zero become evictable again."""
        self._require_live(node)
        if not node.is_root and node.lock_ref == 0:
            raise ValueError(f"unlock of {node!r}, which is not locked")
        while node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
                if not node.children:
                    self._leaves.add(node)
            node = node.parent

    def evictable_size(self) -> int:
        """Tokens in the tree that no lock protects (what `evict` could free)."""
        return self._evictable

    def protected_size(self) -> int:
        """Tokens in the tree on some locked path."""
        return self._protected

    # ---------------------------------------------------------------- eviction / reset

    def evict(self, num_tokens: int) -> SlotArray:
        """Free at least `num_tokens` tokens (whole leaves, LRU first, parents as they become leaves), or all
        that is evictable when there is less. Returns the freed slots; the caller returns them to its allocator.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        freed: list[npt.NDArray[np.int64]] = []
        total = 0
        while total < num_tokens:
            leaf = self._leaves.pop()
            if leaf is None:
                break
            freed.append(leaf.value)
            total += len(leaf.value)
            self._remove_leaf(leaf)
        self._evicted_tokens += total
        return np.concatenate(freed) if freed else EMPTY_IDS.copy()

    def reset(self) -> SlotArray:
        """Empty the tree (all namespaces) and return every slot it held. Refused while anything is locked.

        Handles from before the reset are dead; statistics counters are kept.
        """
        if self._protected:
            raise RuntimeError(f"reset with {self._protected} tokens locked; unlock every request first")
        slots = self.all_slots()
        for node in list(self._nodes()):
            node.parent = None  # mark dead: lock/unlock of an old handle raises
            node.children = {}
        self._roots.clear()
        self._leaves.clear()
        self._evictable = self._protected = self._num_nodes = 0
        return slots

    # ---------------------------------------------------------------- inspection

    def stats(self) -> CacheStats:
        return CacheStats(
            match_calls=self._match_calls,
            query_tokens=self._query_tokens,
            hit_tokens=self._hit_tokens,
            inserted_tokens=self._inserted_tokens,
            evicted_tokens=self._evicted_tokens,
            num_nodes=self._num_nodes,
            cached_tokens=self._evictable + self._protected,
            evictable_tokens=self._evictable,
            protected_tokens=self._protected,
        )

    def all_slots(self) -> SlotArray:
        """Every slot the tree holds, sorted (for leak checks: these plus the allocator's free list = all)."""
        values = [node.value for node in self._nodes()]
        return np.sort(np.concatenate(values)) if values else EMPTY_IDS.copy()

    def namespaces(self) -> list[Namespace]:
        return list(self._roots)

    def check_integrity(self) -> None:
        """Recompute every invariant from scratch; raises AssertionError naming the first one broken."""
        from .integrity import check_integrity

        check_integrity(self)

    def pretty(self, max_tokens: int = 8) -> str:
        """The tree as indented text, one line per node, for debugging small trees."""
        from .render import render_tree

        return render_tree(self, max_tokens)

    # ---------------------------------------------------------------- internals

    def _nodes(self) -> Iterator[RadixNode]:
        """Every non-root node, depth first."""
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _child_key(self, key: npt.NDArray[np.int64]) -> ChildKey:
        return int(key[0]) if self.page_size == 1 else key[: self.page_size].tobytes()

    def _common_len(self, edge: npt.NDArray[np.int64], query: npt.NDArray[np.int64]) -> int:
        k = first_mismatch(edge, query)
        return k - k % self.page_size

    def _new_node(
        self,
        key: npt.NDArray[np.int64],
        value: npt.NDArray[np.int64],
        parent: RadixNode | None,
        namespace: Namespace,
    ) -> RadixNode:
        self._next_uid += 1
        return RadixNode(key, value, parent, namespace, self._next_uid, self._tick)

    def _add_leaf(self, parent: RadixNode, key: npt.NDArray[np.int64], value: IntArray) -> RadixNode:
        """Attach a new unlocked leaf holding copies of `key`/`value` (the caller may reuse its arrays)."""
        leaf = self._new_node(key.copy(), value.astype(np.int64, copy=True), parent, parent.namespace)
        if not parent.children:
            self._leaves.discard(parent)  # no longer a leaf
        parent.children[self._child_key(leaf.key)] = leaf
        self._leaves.add(leaf)
        self._evictable += len(key)
        self._num_nodes += 1
        self._inserted_tokens += len(key)
        return leaf

    def _split(self, node: RadixNode, k: int) -> RadixNode:
        """Cut `node`'s edge after `k` tokens; returns the new upper node. `node` keeps its identity (handles
        stay valid) and becomes the lower part; the upper part inherits its lock count and access tick."""
        assert node.parent is not None and 0 < k < len(node.key)
        upper = self._new_node(node.key[:k], node.value[:k], node.parent, node.namespace)
        upper.lock_ref = node.lock_ref
        upper.last_access = node.last_access
        node.parent.children[self._child_key(upper.key)] = upper
        node.key, node.value, node.parent = node.key[k:], node.value[k:], upper
        upper.children[self._child_key(node.key)] = node
        self._num_nodes += 1
        return upper

    def _touch(self, node: RadixNode) -> None:
        """Stamp `node` and its ancestors with the current tick (of this match/insert call).

        Only `node` itself can be a leaf, so only it may need a fresh LRU heap entry."""
        moved = node.last_access != self._tick
        walk: RadixNode | None = node
        while walk is not None:
            walk.last_access = self._tick
            walk = walk.parent
        if moved:
            self._leaves.touched(node)

    def _remove_leaf(self, leaf: RadixNode) -> None:
        """Detach an evicted leaf; its parent may become an evictable leaf, or an empty root is dropped."""
        parent = leaf.parent
        assert parent is not None
        del parent.children[self._child_key(leaf.key)]
        leaf.parent = None
        self._evictable -= len(leaf.key)
        self._num_nodes -= 1
        if parent.children:
            return
        if parent.is_root:
            del self._roots[parent.namespace]
        elif parent.lock_ref == 0:
            self._leaves.add(parent)

    def _require_live(self, node: RadixNode) -> None:
        """Refuse a handle that was evicted, reset away, or belongs to another cache."""
        if node.is_root:
            return  # a root covers no tokens: locking it protects nothing, so any root handle is harmless
        top = node
        while top.parent is not None:
            top = top.parent
        if not top.is_root or self._roots.get(top.namespace) is not top:
            raise ValueError(f"{node!r} is not a live node of this cache (evicted, reset, or foreign)")
