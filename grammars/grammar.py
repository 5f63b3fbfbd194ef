"""Compiled grammars: an immutable automaton + per-state mask cache, shared by all matchers; the compile API.

`compile_regex` and `compile_grammar` return a `Grammar` cached by (kind, source text, relaxations, vocabulary
identity) in a process-wide LRU, so the engine compiles each constraint once however many requests use it.
A `Grammar` is logically immutable: the per-state caches it fills (automaton rows, masks) are derived data,
guarded for threads. (constraint.py dispatches a request's constraint to these.)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from radixgen.grammars.automaton import ByteAutomaton, DfaAutomaton, PdaAutomaton
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.ir import normalize
from radixgen.grammars.masks import MaskCache
from radixgen.grammars.matcher import Matcher
from radixgen.grammars.pda import build_pda
from radixgen.grammars.regex import regex_to_dfa
from radixgen.grammars.vocabulary import Vocabulary

CACHE_SIZE = 256


class Grammar:
    """A constraint compiled against one vocabulary. Create matchers with `matcher()`.

    `relaxations` names, one message each, what the constraint asked that the grammar enforces more loosely
    (a JSON Schema's keywords with no exact grammar; empty for every other source).
    """

    def __init__(self, kind: str, source: str, vocab: Vocabulary, automaton: ByteAutomaton,
                 relaxations: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.source = source
        self.vocab = vocab
        self.automaton = automaton
        self._relaxations = relaxations
        self._masks = MaskCache(vocab, automaton)

    @property
    def relaxations(self) -> tuple[str, ...]:
        return self._relaxations

    def precompute(self) -> None:
        """Compute the context-independent part of every position's mask now (done by the compile API)."""
        self._masks.precompute()

    def matcher(self) -> Matcher:
        return Matcher(self)

    def mask(self, state: int) -> np.ndarray:
        """Packed allowed-token row for `state` (EOS set iff accepting). Read-only; shared."""
        return self._masks.mask(state)

    def _row(self, state: int) -> np.ndarray:
        self.automaton.ensure_rows(np.array([state], dtype=np.int64))
        row: np.ndarray = self.automaton.table[state]  # one int index of a 2-d table: a row (numpy types it Any)
        return row

    def has_continuation(self, state: int) -> bool:
        return bool((self._row(state) >= 0).any())

    def forced_bytes(self, state: int, limit: int) -> bytes:
        """Bytes every continuation from `state` starts with (stops where EOS or a choice is possible)."""
        out = bytearray()
        while len(out) < limit and not self.automaton.accepting(state):
            live = np.flatnonzero(self._row(state) >= 0)
            if live.size != 1:
                break
            byte = int(live[0])
            out.append(byte)
            state = int(self._row(state)[byte])
        return bytes(out)

    def __repr__(self) -> str:
        src = self.source if len(self.source) < 40 else self.source[:37] + "..."
        return f"Grammar(kind={self.kind!r}, source={src!r}, vocab={self.vocab!r})"


_cache: OrderedDict[tuple[str, str, tuple[str, ...], int], Grammar] = OrderedDict()
_cache_lock = threading.Lock()


def _cached(kind: str, source: str, vocab: Vocabulary, build: Callable[[], ByteAutomaton],
            relaxations: tuple[str, ...] = ()) -> Grammar:
    key = (kind, source, relaxations, id(vocab))
    with _cache_lock:
        found = _cache.get(key)
        if found is not None and found.vocab is vocab:
            _cache.move_to_end(key)
            return found
    grammar = Grammar(kind, source, vocab, build(), relaxations)
    grammar.precompute()
    with _cache_lock:
        _cache[key] = grammar
        _cache.move_to_end(key)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return grammar


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


def compile_regex(pattern: str, vocab: Vocabulary) -> Grammar:
    """A grammar accepting exactly the texts `re.fullmatch(pattern, text)` accepts."""
    def build() -> DfaAutomaton:
        dfa = regex_to_dfa(pattern)
        if not dfa.accepting.any():
            raise GrammarError(f"regex {pattern!r} matches no text")
        return DfaAutomaton(dfa)

    return _cached("regex", pattern, vocab, build)


def compile_grammar(text: str, vocab: Vocabulary, syntax: str = "lark", start: str | None = None,
                    relaxations: tuple[str, ...] = ()) -> Grammar:
    """A Lark (`syntax="lark"`) or EBNF/GBNF (`syntax="ebnf"`) grammar; see `ebnf.py` for the dialect.

    `relaxations` is the result's report, for a grammar written by a front end that could not enforce its
    source exactly (json_schema.py)."""
    if syntax == "ebnf":
        from radixgen.grammars.ebnf import parse_ebnf

        return _cached(f"ebnf:{start or 'root'}", text, vocab,
                       lambda: PdaAutomaton(build_pda(normalize(parse_ebnf(text, start or "root")))), relaxations)
    if syntax == "lark":
        from radixgen.grammars.lark_frontend import parse_lark

        return _cached(f"lark:{start or 'start'}", text, vocab,
                       lambda: PdaAutomaton(build_pda(normalize(parse_lark(text, start or "start")))), relaxations)
    raise GrammarError(f"unknown grammar syntax {syntax!r}; use 'lark' or 'ebnf'")
