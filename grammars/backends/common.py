"""What the peer backends' adapters share: bounded caches (grammars/lru.py), their tokenizer object per
vocabulary, the mask row view their fills write into, their empty reports, the refusal of a constraint kind
a peer lacks, and grammar sources without radixgen's token references (token_refs.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import numpy as np

from radixgen.grammars.backend import Encode
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.ir import TokenRef
from radixgen.grammars.json_schema_text import literal
from radixgen.grammars.lru import ByteLru
from radixgen.grammars.token_refs import Syntax, replace_token_refs
from radixgen.grammars.vocabulary import Vocabulary


def unsupported_kind(backend: str, kind: str, why: str) -> ValueError:
    """The error of a constraint kind a backend cannot compile (it becomes the request's 400)."""
    return ValueError(f"the {backend} grammar backend does not support {kind!r} constraints ({why}); "
                      f"use grammar_backend='radixgen'")


def peer_source(backend: str, source: str, syntax: Syntax, reads_refs: bool = False) -> str:
    """A grammar source as a peer reads it: a fallback token reference (`<~"[TOOL_CALLS]">`, what tool-call
    and structural-tag grammars write) becomes its text, as before token references (a peer's vocabulary
    holds special tokens as nothing it could write); any other reference is kept where the peer reads it
    itself (`reads_refs`: llguidance's Lark) and refused otherwise."""

    def replace(ref: TokenRef) -> str:
        if ref.fallback and ref.name is not None:
            return literal(ref.name) if syntax == "ebnf" else json.dumps(ref.name, ensure_ascii=False)
        if reads_refs:
            return ref.written
        raise GrammarError(f"the {backend} grammar backend cannot read the token reference {ref.written} "
                           f"(use grammar_backend='radixgen')")

    return replace_token_refs(source, syntax, replace)


V = TypeVar("V")


def get_or_build(cache: ByteLru[V], key: Hashable, build: Callable[[], V]) -> V:
    """`cache`'s value for `key`, built (outside its lock) and stored when missing; the cache counts entries
    (each stored with size 1), so its bound is a number of entries."""
    found = cache.get(key)
    return found if found is not None else cache.put(key, build(), 1)


class NoReports:
    """A peer's compiled grammar: peers list no relaxations or narrowings."""

    @property
    def relaxations(self) -> tuple[str, ...]:
        return ()

    @property
    def narrowings(self) -> tuple[str, ...]:
        return ()


class PerVocabulary(Generic[V]):
    """A backend's tokenizer object per vocabulary, the few used most recently kept. Keyed by identity: an
    entry holds its vocabulary, so the id stays that vocabulary's while the entry lives."""

    def __init__(self, build: Callable[[Vocabulary, Encode | None], V], size: int = 4) -> None:
        self._build = build
        self._cache: ByteLru[tuple[Vocabulary, V]] = ByteLru(size)

    def get(self, vocab: Vocabulary, encode: Encode | None = None) -> V:
        """The object built for `vocab` (with the first call's `encode`: the tokenizer `vocab` was read from)."""
        return get_or_build(self._cache, id(vocab), lambda: (vocab, self._build(vocab, encode)))[1]


def mask_view(row: np.ndarray, words: int) -> np.ndarray:
    """The first `words` of `row` as a (1, words) view a peer's fill writes into (a C-contiguous int32 row)."""
    if row.dtype != np.int32 or row.shape[0] < words or not row[:words].flags.c_contiguous:
        raise ValueError(f"a mask row must be C-contiguous int32 with at least {words} words, "
                         f"got {row.dtype} {row.shape}")
    return row[np.newaxis, :words]
