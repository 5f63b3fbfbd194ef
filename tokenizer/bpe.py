"""The BPE model: a vocabulary and a merge table keyed by id pairs (the piece cache lives in `Tokenizer`).

A word (one pre-token, spelled in the model's alphabet) starts as one symbol per character (or per byte for
byte-level vocabularies); the pair with the lowest merge rank is merged, the leftmost first among equals,
until no listed pair remains. This is the order Hugging Face `tokenizers` and tiktoken use.

Merge table: `pair_table[(left_id, right_id)] = rank << ID_BITS | merged_id`, so one dict lookup yields both
the priority (compare the packed ints) and the result (mask the low bits).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise, repeat

import regex

ID_BITS = 24
ID_MASK = (1 << ID_BITS) - 1
NO_MERGE = 1 << 62
# Words longer than this use the heap-based merge (O(n log n)); shorter ones a C-level scan per merge (O(n^2)).
LONG_WORD = 256


def merge_pair(merge: str | Sequence[str]) -> tuple[str, str]:
    """One merge as tokenizer.json or GGUF writes it ("left right", or ["left", "right"]) -> (left, right)."""
    left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
    return left, right


@dataclass
class BPEModel:
    """Token strings <-> ids and the merge table; `encode_word` turns one alphabet-spelled word into ids."""

    vocab: dict[str, int]
    pair_table: dict[tuple[int, int], int]
    byte_fallback: bool = False
    unk_id: int | None = None
    fuse_unk: bool = False
    ignore_merges: bool = False
    # byte value -> id of its '<0xNN>' token (byte fallback), or None where the vocabulary has none
    byte_token_ids: list[int | None] = field(default_factory=lambda: [None] * 256)

    @classmethod
    def from_merges(
        cls,
        vocab: dict[str, int],
        merges: Sequence[tuple[str, str]],
        **options,
    ) -> BPEModel:
        if vocab and max(vocab.values()) > ID_MASK:
            raise ValueError(f"vocabularies above {ID_MASK + 1} ids are not supported")
        pair_table: dict[tuple[int, int], int] = {}
        for rank, (left, right) in enumerate(merges):
            merged = vocab.get(left + right)
            if merged is None or left not in vocab or right not in vocab:
                raise ValueError(f"merge {left!r} + {right!r} refers to tokens missing from the vocabulary")
            pair_table.setdefault((vocab[left], vocab[right]), rank << ID_BITS | merged)
        model = cls(vocab=vocab, pair_table=pair_table, **options)
        if model.byte_fallback:
            model.byte_token_ids = [vocab.get(f"<0x{b:02X}>") for b in range(256)]
        return model

    @classmethod
    def from_ranks(cls, ranks: dict[bytes, int], spell: Callable[[bytes], str]) -> BPEModel:
        """tiktoken semantics: a pair may merge when their concatenation is a token; its rank is that token's.

        Every split of every token into two tokens is entered, so the same merged token can be reached from
        several pairs (all with the same priority) exactly as tiktoken's rank lookup allows. A piece that is
        itself a token is that token without merging (`ignore_merges`), as tiktoken's encoder does.
        """
        vocab = {spell(token): rank for token, rank in ranks.items()}
        pair_table: dict[tuple[int, int], int] = {}
        for token, rank in ranks.items():
            for cut in range(1, len(token)):
                left = ranks.get(token[:cut])
                right = ranks.get(token[cut:])
                if left is not None and right is not None:
                    pair_table[(left, right)] = rank << ID_BITS | rank
        return cls(vocab=vocab, pair_table=pair_table, ignore_merges=True)

    def boundary_split(self, mark: str) -> regex.Pattern | None:
        """A regex that cuts a word before each run of `mark` where no merge can ever join the two sides.

        SentencePiece-style pre-tokenizers leave whole sentences as one word ('▁Hello▁world'). A cut between
        characters x and y is exact when no merge pair has a left side ending in x and a right side starting
        with y: then no token can span the cut and each side merges on its own. Byte-fallback tokens take part
        in no merge in these vocabularies (checked), so unknown characters never block a cut either. Returns
        None when the vocabulary gives no safe cut before `mark`.
        """
        if mark not in self.vocab:
            return None
        names = {tid: text for text, tid in self.vocab.items()}
        blockers = set()
        for left, right in self.pair_table:
            a, b = names[left], names[right]
            if self.byte_fallback and (a.startswith("<0x") or b.startswith("<0x")):
                return None
            if b.startswith(mark) and not a.endswith(mark):
                blockers.add(a[-1])
        if len(blockers) > 64:
            return None
        excluded = regex.escape(mark + "".join(sorted(blockers)))
        return regex.compile(f"(?<=[^{excluded}])(?={regex.escape(mark)})")

    # ------------------------------------------------------------------ encoding one word
    def initial_symbols(self, word: str) -> list[int]:
        """One id per character; characters missing from the vocabulary go to byte tokens, unk, or are dropped."""
        vocab = self.vocab
        ids: list[int] = []
        for ch in word:
            tid = vocab.get(ch)
            if tid is not None:
                ids.append(tid)
                continue
            if self.byte_fallback:
                data = ch.encode("utf-8")
                byte_ids = [tid for tid in map(self.byte_token_ids.__getitem__, data) if tid is not None]
                if len(byte_ids) == len(data):
                    ids.extend(byte_ids)
                    continue
            if self.unk_id is None:
                continue  # no unknown token: Hugging Face drops the character
            if not (self.fuse_unk and ids and ids[-1] == self.unk_id):
                ids.append(self.unk_id)
        return ids

    def encode_word(self, word: str) -> list[int]:
        if self.ignore_merges:
            whole = self.vocab.get(word)
            if whole is not None:
                return [whole]
        return self.merge(self.initial_symbols(word))

    def merge(self, symbols: list[int]) -> list[int]:
        """Apply merges to a symbol list (in place); see the module docstring for the order.

        Keeps `ranks[j]` = packed rank of the pair (j, j+1); each step finds the leftmost minimum with C-level
        `min` and `index` and refreshes only the two neighbouring pairs.
        """
        n = len(symbols)
        if n < 2:
            return symbols
        if n > LONG_WORD:
            return self._merge_heap(symbols)
        get = self.pair_table.get
        ranks = list(map(get, pairwise(symbols), repeat(NO_MERGE, n - 1)))
        while True:
            best = min(ranks)
            if best == NO_MERGE:
                return symbols
            i = ranks.index(best)
            symbols[i] = merged = best & ID_MASK
            del symbols[i + 1]
            del ranks[i]
            if i < len(ranks):
                ranks[i] = get((merged, symbols[i + 1]), NO_MERGE)
            if i:
                ranks[i - 1] = get((symbols[i - 1], merged), NO_MERGE)
            elif not ranks:
                return symbols

    def _merge_heap(self, symbols: list[int]) -> list[int]:
        """Same result as `merge`, in O(n log n): a heap of (packed rank, left position) over a linked list."""
        get = self.pair_table.get
        n = len(symbols)
        sym = list(symbols)
        nxt = list(range(1, n + 1))
        prv = list(range(-1, n - 1))
        alive = [True] * n
        heap = [(r, i) for i, r in enumerate(map(get, pairwise(sym))) if r is not None]
        heapq.heapify(heap)
        while heap:
            packed, i = heapq.heappop(heap)
            j = nxt[i]
            if not alive[i] or j >= n or get((sym[i], sym[j])) != packed:
                continue  # stale entry
            sym[i] = packed & ID_MASK
            alive[j] = False
            k = nxt[j]
            nxt[i] = k
            if k < n:
                prv[k] = i
                r = get((sym[i], sym[k]))
                if r is not None:
                    heapq.heappush(heap, (r, i))
            p = prv[i]
            if p >= 0:
                r = get((sym[p], sym[i]))
                if r is not None:
                    heapq.heappush(heap, (r, p))
        return [s for s, a in zip(sym, alive) if a]
