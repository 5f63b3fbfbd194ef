"""The model vocabulary as byte strings, its token trie, and the packed bitmask layout.

A mask row is `ceil(V / 32)` int32 words; token v is allowed when bit `v % 32` of word `v // 32` is set — the
layout `kernels.apply_token_bitmask_reference` applies to the logits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from radixgen.grammars.lru import ByteLru

if TYPE_CHECKING:
    from radixgen.grammars.disk_cache import GrammarDiskCache

WALK_CACHE_BYTES = 1 << 30  # default budget of the per-vocabulary terminal walk cache (lru.py); the
# 400 sample schemas of benchmarks/grammar_bench.py fill about 570 MiB with Qwen3, 160 MiB with GPT-2
PRECOMPUTE_S = 0.15  # default CPU seconds one compile spends walking grammar positions ahead of use (masks.py)
MARKER_BYTE = 0xFF  # starts the bytes a token reference reads (token_refs.py); never in UTF-8 text
LONG_TOKENS = 16  # at most this many longest tokens are checked one by one where masks are shared (masks.py)


def bitmask_words(vocab_size: int) -> int:
    """Number of int32 words in one mask row."""
    return (vocab_size + 31) // 32


def pack_bitmask(allowed: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """bool[V] -> int32[ceil(V/32)] (bit v of word v // 32); writes into `out` when given."""
    words = bitmask_words(allowed.shape[0])
    padded = np.zeros(words * 32, dtype=bool)
    padded[: allowed.shape[0]] = allowed
    packed = np.packbits(padded, bitorder="little").view("<i4")
    if out is None:
        return packed.astype(np.int32, copy=True)
    out[:words] = packed
    return out


def unpack_bitmask(row: np.ndarray, vocab_size: int) -> np.ndarray:
    """int32[ceil(V/32)] -> bool[V]; the inverse of `pack_bitmask`."""
    bits = np.unpackbits(np.ascontiguousarray(row, dtype="<i4").view(np.uint8), bitorder="little")
    return bits[:vocab_size].astype(bool)


@dataclass(frozen=True, eq=False)
class TokenTrie:
    """Every prefix of every text token, numbered in breadth-first, lexicographic order.

    Node 0 is the empty prefix. The children of a node are contiguous: `child_start[n] .. + child_count[n]`,
    and the nodes of depth d are `level_start[d] .. level_start[d+1]`. `token_node[v]` is the node spelling
    token v, or -1 for tokens that are never read as text (`Vocabulary.text_excluded`, empty byte strings).
    """

    node_byte: np.ndarray  # uint8[N]: the last byte of the node's prefix (0 for the root)
    node_parent: np.ndarray  # int64[N] (0 for the root)
    child_start: np.ndarray  # int64[N]
    child_count: np.ndarray  # int64[N]
    level_start: np.ndarray  # int64[depth + 2]
    token_node: np.ndarray  # int64[V]

    @property
    def num_nodes(self) -> int:
        return int(self.node_byte.shape[0])

    def lists(self) -> tuple[list[int], list[int], list[int]]:
        """child_start, child_count, node_byte as Python lists (for per-node loops; built once)."""
        cached = self.__dict__.get("_lists")
        if cached is None:
            cached = (self.child_start.tolist(), self.child_count.tolist(), self.node_byte.tolist())
            object.__setattr__(self, "_lists", cached)
        return cached

    def _node_order(self) -> tuple[np.ndarray, np.ndarray]:
        """(node of each token id spelling a node, sorted; those token ids in the same order), built once."""
        order: tuple[np.ndarray, np.ndarray] | None = self.__dict__.get("_node_order_arrays")
        if order is None:
            ids = np.flatnonzero(self.token_node >= 0)
            by_node = ids[np.argsort(self.token_node[ids], kind="stable")]
            order = (self.token_node[by_node], by_node)
            object.__setattr__(self, "_node_order_arrays", order)
        return order

    def token_ids(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(a token id spelled by each node, -1 for inner nodes; whether the node spells more ids than that one;
        the nodes that do, once per further id; those further ids), built once: a node set's tokens by one
        gather (byte strings repeat only for a few added tokens)."""
        found: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = self.__dict__.get("_token_ids")
        if found is None:
            keys, by_node = self._node_order()
            repeated = np.concatenate(([False], keys[1:] == keys[:-1]))  # ids ascend within a node
            first = np.full(self.num_nodes, -1, dtype=np.int64)
            first[keys[~repeated]] = by_node[~repeated]
            more = np.zeros(self.num_nodes, dtype=bool)
            more[keys[repeated]] = True
            found = (first, more, keys[repeated], by_node[repeated])
            object.__setattr__(self, "_token_ids", found)
        return found

    def subtree(self, node: int) -> np.ndarray:
        """The nodes of `node`'s subtree, itself included. Children are contiguous and ordered like their
        parents, so the descendants on each level form one run: from the first child of the run above to the
        last child of its last node."""
        child_start, child_count, _ = self.lists()
        runs = []
        lo, hi = node, node + 1
        while lo < hi:
            runs.append(np.arange(lo, hi, dtype=np.int64))
            lo, hi = child_start[lo], child_start[hi - 1] + child_count[hi - 1]
        return np.concatenate(runs)

    def node_tokens(self, nodes: np.ndarray) -> np.ndarray:
        """Token ids spelled by `nodes` (several ids when byte strings repeat; none for inner nodes)."""
        keys, by_node = self._node_order()
        lo = np.searchsorted(keys, nodes, side="left")
        hi = np.searchsorted(keys, nodes, side="right")
        counts = hi - lo
        if counts.max(initial=0) <= 1:
            single: np.ndarray = by_node[lo[counts == 1]]
            return single
        total = int(counts.sum())
        starts = np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(total)
        return by_node[starts]

    def node_token_counts(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(token ids spelled by `nodes`, grouped in the order of `nodes`; how many each node spells)."""
        keys, by_node = self._node_order()
        lo = np.searchsorted(keys, nodes, side="left")
        counts = np.searchsorted(keys, nodes, side="right") - lo
        total = int(counts.sum())
        starts = np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(total)
        return by_node[starts], counts

    def path(self, ancestor: int, node: int) -> bytes:
        """The bytes leading from `ancestor` down to its descendant `node`."""
        out = bytearray()
        while node != ancestor:
            out.append(int(self.node_byte[node]))
            node = int(self.node_parent[node])
        return bytes(reversed(out))

    @staticmethod
    def build(token_bytes: Sequence[bytes], excluded: Iterable[int]) -> TokenTrie:
        excluded_set = set(excluded)
        prefixes: set[bytes] = {b""}
        for v, tok in enumerate(token_bytes):
            if v in excluded_set or not tok:
                continue
            for i in range(1, len(tok) + 1):
                prefixes.add(tok[:i])
        # Sorting by (length, bytes) gives BFS order in which each level is lexicographic, so the children of
        # a node form one contiguous run and parents appear in the same order as their child runs.
        ordered = sorted(prefixes, key=lambda p: (len(p), p))
        index = {p: i for i, p in enumerate(ordered)}
        n = len(ordered)
        node_byte = np.zeros(n, dtype=np.uint8)
        parent = np.zeros(n, dtype=np.int64)
        depth = np.zeros(n, dtype=np.int64)
        for i, p in enumerate(ordered[1:], start=1):
            node_byte[i] = p[-1]
            parent[i] = index[p[:-1]]
            depth[i] = len(p)
        child_count = np.bincount(parent[1:], minlength=n).astype(np.int64)
        child_start = np.zeros(n, dtype=np.int64)
        # First child of each parent: children are sorted by parent index, starting at node 1.
        firsts = np.searchsorted(parent[1:], np.arange(n), side="left") + 1
        child_start[:] = firsts
        level_start = np.searchsorted(depth, np.arange(int(depth.max()) + 2), side="left").astype(np.int64)
        token_node = np.full(len(token_bytes), -1, dtype=np.int64)
        for v, tok in enumerate(token_bytes):
            if v not in excluded_set and tok:
                token_node[v] = index[tok]
        return TokenTrie(node_byte, parent, child_start, child_count, level_start, token_node)


Run = tuple[bytes, bytes, int]  # (head, unit, count): the bytes head + unit * count


def as_run(data: bytes, max_unit: int = 8) -> Run:
    """`data` as head + unit * count with the shortest head, then the shortest unit (of at most `max_unit`
    bytes) repeated at least twice; (data, b"", 0) when there is none."""
    for start in range(len(data)):
        rest = data[start:]
        for size in range(1, min(max_unit, len(rest) // 2) + 1):
            if len(rest) % size == 0 and rest == rest[:size] * (len(rest) // size):
                return data[:start], rest[:size], len(rest) // size
    return data, b"", 0


class Vocabulary:
    """The byte string of every token id, plus which ids are EOS and which are special.

    Special tokens (EOS included) are never read as text: they are allowed only where a grammar names them as
    tokens (token_refs.py), and EOS also where the constraint accepts. Tokens holding byte 0xFF (never in
    UTF-8 text) are not read as text either, so no token can spell the marker bytes a token reference reads.
    The trie and a padded byte matrix are built once, lazily, and cached here, so every grammar compiled
    against this object shares them.
    """

    def __init__(self, token_bytes: Sequence[bytes], eos_token_ids: Iterable[int],
                 special_ids: Iterable[int] = (), *, walk_cache_bytes: int = WALK_CACHE_BYTES,
                 precompute_s: float = PRECOMPUTE_S, grammar_cache: GrammarDiskCache | None = None) -> None:
        self.token_bytes: tuple[bytes, ...] = tuple(bytes(t) for t in token_bytes)
        self.eos_token_ids: tuple[int, ...] = tuple(sorted({int(e) for e in eos_token_ids}))
        specials = frozenset(int(s) for s in special_ids)
        self.special_ids: frozenset[int] = specials | frozenset(self.eos_token_ids)
        # Trie walks over shared terminal DFAs, reused by every grammar compiled against this vocabulary
        # (terminal_walks.py), least recently used ones evicted beyond `walk_cache_bytes`.
        self.terminal_walks: ByteLru[Any] = ByteLru(walk_cache_bytes)
        # CPU time each grammar compiled against this vocabulary spends computing masks of its positions at
        # compile time (`MaskCache.precompute`): more makes compiles of large grammars slower and their first
        # masks faster (a mask's latency is on the decode path, a compile is paid once per schema).
        if precompute_s < 0:
            raise ValueError(f"precompute_s must be >= 0, got {precompute_s}")
        self.precompute_s = float(precompute_s)
        # Grammars compiled against this vocabulary are kept on disk there too (disk_cache.py), or only in
        # the process (None).
        self.grammar_cache = grammar_cache
        for tid in self.special_ids:
            if not 0 <= tid < len(self.token_bytes):
                raise ValueError(f"special/eos token id {tid} outside the vocabulary of {self.size}")
        self.text_excluded: frozenset[int] = self.special_ids | frozenset(
            v for v, t in enumerate(self.token_bytes) if MARKER_BYTE in t)

    @property
    def size(self) -> int:
        return len(self.token_bytes)

    def __len__(self) -> int:
        return len(self.token_bytes)

    @property
    def mask_words(self) -> int:
        return bitmask_words(self.size)

    @cached_property
    def digest(self) -> bytes:
        """16-byte hash of every token's bytes, the EOS ids and the special ids: what a compiled grammar
        depends on (the disk cache's key, disk_cache.py)."""
        h = hashlib.blake2b(digest_size=16)
        h.update(np.array([len(t) for t in self.token_bytes], dtype=np.int64).tobytes())
        h.update(b"".join(self.token_bytes))
        h.update(np.array(self.eos_token_ids, dtype=np.int64).tobytes())
        h.update(np.array(sorted(self.special_ids), dtype=np.int64).tobytes())
        return h.digest()

    @cached_property
    def trie(self) -> TokenTrie:
        return TokenTrie.build(self.token_bytes, self.text_excluded)

    @cached_property
    def _id_by_bytes(self) -> dict[bytes, int]:
        """Per spelling, the lowest special id of it, else the lowest id."""
        found = dict(zip(reversed(self.token_bytes), range(self.size - 1, -1, -1)))
        found.update((self.token_bytes[v], v) for v in sorted(self.special_ids, reverse=True))
        found.pop(b"", None)
        return found

    def token_id_of(self, text: str) -> int | None:
        """The one token spelling exactly `text`: a special token first, else the lowest id of that spelling
        (an added token, such as Qwen's `<tool_call>`); None when no single token spells it."""
        return self._id_by_bytes.get(text.encode("utf-8"))

    @cached_property
    def subtree_sizes(self) -> np.ndarray:
        """int64 per trie node: the nodes of its subtree, itself included."""
        trie = self.trie
        sizes = np.ones(trie.num_nodes, dtype=np.int64)
        levels = trie.level_start
        for depth in range(len(levels) - 2, 0, -1):  # children before parents, a level at a time
            lo, hi = int(levels[depth]), int(levels[depth + 1])
            np.add.at(sizes, trie.node_parent[lo:hi], sizes[lo:hi])
        return sizes

    def subtree_mask(self, node: int) -> np.ndarray:
        """Packed row (read-only) of the tokens spelled in trie `node`'s subtree (those starting with its
        bytes), cached in `terminal_walks`: what removing that node from a walk's start nodes removes."""
        key = ("subtree", node)
        found: np.ndarray | None = self.terminal_walks.get(key)
        if found is None:
            allowed = np.zeros(self.mask_words * 32, dtype=bool)
            first, more, more_nodes, more_ids = self.trie.token_ids()
            nodes = self.trie.subtree(node)
            ids = first[nodes]
            allowed[ids[ids >= 0]] = True
            if more[nodes].any():
                allowed[more_ids[np.isin(more_nodes, nodes)]] = True
            found = np.packbits(allowed, bitorder="little").view("<i4")
            found.flags.writeable = False
            found = self.terminal_walks.put(key, found, found.nbytes)
        return found

    @cached_property
    def eos_mask(self) -> np.ndarray:
        """Packed row with only the EOS ids set."""
        allowed = np.zeros(self.size, dtype=bool)
        allowed[list(self.eos_token_ids)] = True
        return pack_bitmask(allowed)

    @cached_property
    def long_tokens(self) -> tuple[int, tuple[tuple[int, bytes, int], ...], np.ndarray]:
        """(split, long tokens, their packed bits): the non-special tokens longer than `split` bytes, where
        `split` is the shortest length leaving at most LONG_TOKENS of them. Masks of states that only agree
        for `split` bytes are shared for the short tokens and checked token by token for these few.
        Each long token is (id, bytes, index of an earlier long token that is a prefix of it, or -1)."""
        lengths = np.array([0 if i in self.text_excluded else len(t) for i, t in enumerate(self.token_bytes)],
                           dtype=np.int64)
        by_length = np.sort(lengths)[::-1]
        split = int(by_length[LONG_TOKENS]) if by_length.size > LONG_TOKENS else 0
        ids = np.flatnonzero(lengths > split)
        allowed = np.zeros(self.size, dtype=bool)
        allowed[ids] = True
        ordered = sorted(ids.tolist(), key=lambda i: self.token_bytes[i])  # a prefix sorts before
        entries: list[tuple[int, bytes, int]] = []
        for tid in ordered:
            data = self.token_bytes[tid]
            prefix = max((k for k, (_, other, _) in enumerate(entries) if data.startswith(other)),
                         key=lambda k: len(entries[k][1]), default=-1)
            entries.append((tid, data, prefix))
        return split, tuple(entries), pack_bitmask(allowed)

    @cached_property
    def long_token_runs(self) -> tuple[Run, ...]:
        """Per long token (in `long_tokens` order), its bytes as a `Run`: most long tokens repeat a short unit
        ('-' * 64), and an automaton that returns to the same state after a unit need not read the remaining
        units (long_tokens.py)."""
        return tuple(as_run(data) for _, data, _ in self.long_tokens[1])

    @cached_property
    def long_token_paths(self) -> np.ndarray:
        """bool per trie node: a prefix (itself included) of one of the `long_tokens`."""
        trie = self.trie
        out = np.zeros(trie.num_nodes, dtype=bool)
        for tid, _, _ in self.long_tokens[1]:
            node = int(trie.token_node[tid])
            while node > 0 and not out[node]:
                out[node] = True
                node = int(trie.node_parent[node])
        return out

    @cached_property
    def long_token_witnesses(self) -> tuple[int | None, ...]:
        """Per long token (in `long_tokens` order), a token that is a prefix of it of at most `split` bytes
        (the longest one), or None. A string can only be read if its prefixes can, so where a mask that is
        exact up to `split` bytes refuses the witness, it refuses the long token too (masks.py)."""
        split, entries, _ = self.long_tokens
        by_bytes = {tok: i for i, tok in enumerate(self.token_bytes) if tok and i not in self.text_excluded}
        return tuple(next((by_bytes[data[:k]] for k in range(min(split, len(data)), 0, -1)
                           if data[:k] in by_bytes), None) for _, data, _ in entries)

    def new_mask(self, rows: int | None = None) -> np.ndarray:
        """A zeroed int32 bitmask: one row, or `rows` rows."""
        shape = (self.mask_words,) if rows is None else (rows, self.mask_words)
        return np.zeros(shape, dtype=np.int32)

    def __repr__(self) -> str:
        eos = list(self.eos_token_ids)
        return f"Vocabulary(size={self.size}, eos={eos}, specials={len(self.special_ids)})"
