"""Compiled grammars: an immutable automaton + per-state mask cache, shared by all matchers; the compile API.

`compile_regex`, `compile_grammar` and `compile` return a `Grammar` cached by (kind, source text, vocabulary
identity) in a process-wide LRU, so the engine compiles each constraint once however many requests use it.
A `Grammar` is logically immutable: the per-state caches it fills (automaton rows, masks) are derived data,
guarded for threads.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from radixgen.grammars.automaton import ByteAutomaton, DfaAutomaton, PdaAutomaton
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.ir import GrammarIR, normalize
from radixgen.grammars.masks import MaskCache
from radixgen.grammars.matcher import Matcher
from radixgen.grammars.pda import build_pda
from radixgen.grammars.regex import regex_to_dfa
from radixgen.grammars.vocabulary import Vocabulary

CACHE_SIZE = 256


class Grammar:
    """A constraint compiled against one vocabulary. Create matchers with `matcher()`."""

    def __init__(self, kind: str, source: str, vocab: Vocabulary, automaton: ByteAutomaton) -> None:
        self.kind = kind
        self.source = source
        self.vocab = vocab
        self.automaton = automaton
        self._masks = MaskCache(vocab, automaton)

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
        return self.automaton.table[state]

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


_cache: OrderedDict[tuple[str, str, int], Grammar] = OrderedDict()
_cache_lock = threading.Lock()


def _cached(kind: str, source: str, vocab: Vocabulary, build: Callable[[], ByteAutomaton]) -> Grammar:
    key = (kind, source, id(vocab))
    with _cache_lock:
        found = _cache.get(key)
        if found is not None and found.vocab is vocab:
            _cache.move_to_end(key)
            return found
    grammar = Grammar(kind, source, vocab, build())
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


def compile_ir(ir: GrammarIR, vocab: Vocabulary, kind: str, source: str) -> Grammar:
    """Compile a front end's IR (cached under `kind` and `source`)."""
    return _cached(kind, source, vocab, lambda: PdaAutomaton(build_pda(normalize(ir))))


def compile_grammar(text: str, vocab: Vocabulary, syntax: str = "lark", start: str | None = None) -> Grammar:
    """A Lark (`syntax="lark"`) or EBNF/GBNF (`syntax="ebnf"`) grammar; see `ebnf.py` for the dialect."""
    if syntax == "ebnf":
        from radixgen.grammars.ebnf import parse_ebnf

        return _cached(f"ebnf:{start or 'root'}", text, vocab,
                       lambda: PdaAutomaton(build_pda(normalize(parse_ebnf(text, start or "root")))))
    if syntax == "lark":
        from radixgen.grammars.lark_frontend import parse_lark

        return _cached(f"lark:{start or 'start'}", text, vocab,
                       lambda: PdaAutomaton(build_pda(normalize(parse_lark(text, start or "start")))))
    raise GrammarError(f"unknown grammar syntax {syntax!r}; use 'lark' or 'ebnf'")


CONSTRAINT_KINDS = ("regex", "json_schema", "ebnf", "grammar", "lark")


def compile(constraint: Mapping[str, Any] | tuple[str, Any], vocab: Vocabulary) -> Grammar:
    """Dispatch one constraint, given as `{"regex": ...}` (or a `(kind, source)` pair), kinds:
    `regex`, `json_schema` (str or dict), `ebnf`, `grammar` / `lark` (Lark text)."""
    items = list(constraint.items()) if isinstance(constraint, Mapping) else [tuple(constraint)]
    items = [(k, v) for k, v in items if v is not None]
    if len(items) != 1:
        given = [k for k, _ in items]
        raise GrammarError(f"expected exactly one constraint of {CONSTRAINT_KINDS}, got {given}")
    kind, source = items[0]
    if kind == "regex":
        return compile_regex(source, vocab)
    if kind == "ebnf":
        return compile_grammar(source, vocab, syntax="ebnf")
    if kind in ("grammar", "lark"):
        return compile_grammar(source, vocab, syntax="lark")
    if kind == "json_schema":
        from radixgen.grammars import json_schema

        schema = json.loads(source) if isinstance(source, str) else source
        return json_schema.compile_json_schema(schema, vocab)
    raise GrammarError(f"unknown constraint kind {kind!r}; expected one of {CONSTRAINT_KINDS}")
