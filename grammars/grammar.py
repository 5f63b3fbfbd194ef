"""Compiled grammars: an immutable automaton + per-state mask cache, shared by all matchers; the compile API.

`compile_regex` and `compile_grammar` return a `Grammar` cached by (kind, source text, relaxations, narrowings,
vocabulary identity) in a process-wide LRU, so the engine compiles each constraint once however many requests
use it; given the vocabulary's `grammar_cache`, on disk too (disk_cache.py), so another process or a restart
loads it instead. A `Grammar` is logically immutable: the per-state caches it fills (automaton rows, masks) are
derived data, guarded for threads. (constraint.py dispatches a request's constraint to these.)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from radixgen.grammars.automaton import ByteAutomaton, DfaAutomaton, PdaAutomaton
from radixgen.grammars.bytedfa import ByteDFA
from radixgen.grammars.disk_cache import CompiledParts, GrammarKey
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.ir import GrammarIR, normalize
from radixgen.grammars.masks import MaskCache
from radixgen.grammars.matcher import Matcher
from radixgen.grammars.pda import build_pda
from radixgen.grammars.regex import regex_to_dfa
from radixgen.grammars.token_refs import has_token_refs, reads_token_ref, resolve_token_refs, token_ref_targets
from radixgen.grammars.vocabulary import MARKER_BYTE, Vocabulary

CACHE_SIZE = 256


class Grammar:
    """A constraint compiled against one vocabulary. Create matchers with `matcher()`.

    `relaxations` names, one message each, what the constraint asked that the grammar enforces more loosely
    (a JSON Schema's keywords with no exact grammar); `narrowings`, what it enforces more strictly (an inferred
    type, a fixed key order or whitespace). Both empty for every other source.
    """

    def __init__(self, kind: str, source: str, vocab: Vocabulary, automaton: ByteAutomaton,
                 relaxations: tuple[str, ...] = (), narrowings: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.source = source
        self.vocab = vocab
        self.automaton = automaton
        self._relaxations = relaxations
        self._narrowings = narrowings
        self._masks = MaskCache(vocab, automaton)
        # Per state, derived once: whether any byte can follow, the bytes every continuation starts with, and
        # whether a token reference can follow (token_refs.py).
        self._continues: dict[int, bool] = {}
        self._forced: dict[tuple[int, int], bytes] = {}
        self._reads_tokens: dict[int, bool] = {}
        self.has_token_refs = has_token_refs(automaton)

    @property
    def relaxations(self) -> tuple[str, ...]:
        return self._relaxations

    @property
    def narrowings(self) -> tuple[str, ...]:
        return self._narrowings

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
        found = self._continues.get(state)
        if found is None:
            found = self._continues[state] = bool((self._row(state) >= 0).any())
        return found

    def reads_token_ref(self, state: int) -> bool:
        """A token reference may be read next from `state` (a token may be taken by its marker bytes)."""
        if not self.has_token_refs:
            return False
        found = self._reads_tokens.get(state)
        if found is None:
            found = self._reads_tokens[state] = reads_token_ref(self.automaton, state)
        return found

    def forced_token(self, state: int) -> int | None:
        """The token id every continuation from `state` starts with, where that is one token reference (the
        forced bytes stop before it, being no text); None otherwise."""
        if self.automaton.accepting(state) or not self.reads_token_ref(state):
            return None
        if int((self._row(state) >= 0).sum()) != 1:
            return None
        targets = token_ref_targets(self.automaton, state)
        return targets[0][0] if len(targets) == 1 else None

    def forced_bytes(self, state: int, limit: int) -> bytes:
        """Bytes every continuation from `state` starts with (stops where EOS, a choice or a token reference is
        possible: a forced token is `forced_token`'s, not bytes)."""
        found = self._forced.get((state, limit))
        if found is None:
            found = self._forced[(state, limit)] = self._walk_forced(state, limit)
        return found

    def _walk_forced(self, state: int, limit: int) -> bytes:
        out = bytearray()
        while len(out) < limit and not self.automaton.accepting(state):
            live = np.flatnonzero(self._row(state) >= 0)
            if live.size != 1:
                break
            byte = int(live[0])
            if byte == MARKER_BYTE:
                break
            out.append(byte)
            state = int(self._row(state)[byte])
        return bytes(out)

    def __repr__(self) -> str:
        src = self.source if len(self.source) < 40 else self.source[:37] + "..."
        return f"Grammar(kind={self.kind!r}, source={src!r}, vocab={self.vocab!r})"


_cache: OrderedDict[tuple[str, str, tuple[str, ...], tuple[str, ...], int], Grammar] = OrderedDict()
_cache_lock = threading.Lock()


def _cached(kind: str, source: str, vocab: Vocabulary, build: Callable[[], ByteAutomaton],
            relaxations: tuple[str, ...] = (), narrowings: tuple[str, ...] = ()) -> Grammar:
    key = (kind, source, relaxations, narrowings, id(vocab))
    with _cache_lock:
        found = _cache.get(key)
        if found is not None and found.vocab is vocab:
            _cache.move_to_end(key)
            return found
    grammar = _load_or_compile(GrammarKey(kind, source, relaxations, narrowings), vocab, build)
    with _cache_lock:
        _cache[key] = grammar
        _cache.move_to_end(key)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return grammar


def _load_or_compile(key: GrammarKey, vocab: Vocabulary, build: Callable[[], ByteAutomaton]) -> Grammar:
    """A new `Grammar` for `key`: from the vocabulary's disk cache (disk_cache.py) when it holds it, else built
    and precomputed, then stored there."""
    disk = vocab.grammar_cache
    parts = disk.load(key, vocab) if disk is not None else None
    if parts is not None:
        tables = parts.tables
        loaded = DfaAutomaton(tables) if isinstance(tables, ByteDFA) else PdaAutomaton(tables)
        grammar = Grammar(key.kind, key.source, vocab, loaded, key.relaxations, key.narrowings)
        grammar._masks.restore(parts.masks)
        return grammar
    grammar = Grammar(key.kind, key.source, vocab, build(), key.relaxations, key.narrowings)
    grammar.precompute()
    built = grammar.automaton
    if disk is not None and isinstance(built, (DfaAutomaton, PdaAutomaton)):
        stored = built.dfa if isinstance(built, DfaAutomaton) else built.pda
        disk.store(key, vocab, CompiledParts(stored, grammar._masks.precomputed()))
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


def _pda(ir: GrammarIR, vocab: Vocabulary) -> PdaAutomaton:
    """The automaton of a front end's IR, its token references resolved against `vocab`."""
    return PdaAutomaton(build_pda(normalize(resolve_token_refs(ir, vocab))))


def compile_grammar(text: str, vocab: Vocabulary, syntax: str = "lark", start: str | None = None,
                    relaxations: tuple[str, ...] = (), narrowings: tuple[str, ...] = (),
                    prebuilt: Callable[[str], ByteDFA | None] | None = None) -> Grammar:
    """A Lark (`syntax="lark"`) or EBNF/GBNF (`syntax="ebnf"`) grammar; see `ebnf.py` for the dialect.

    `relaxations` and `narrowings` are the result's report, for a grammar written by a front end that could not
    enforce its source exactly (json_schema.py); `prebuilt` (EBNF) the byte DFA of a `/regex/` terminal the front
    end can build itself, by the terminal's text (each the language of its text, so the text stays the cache
    key); called only when the grammar is compiled, not when it is found cached."""
    if syntax == "ebnf":
        from radixgen.grammars.ebnf import parse_ebnf

        return _cached(f"ebnf:{start or 'root'}", text, vocab,
                       lambda: _pda(parse_ebnf(text, start or "root", prebuilt), vocab), relaxations, narrowings)
    if syntax == "lark":
        from radixgen.grammars.lark_frontend import parse_lark

        return _cached(f"lark:{start or 'start'}", text, vocab,
                       lambda: _pda(parse_lark(text, start or "start"), vocab), relaxations, narrowings)
    raise GrammarError(f"unknown grammar syntax {syntax!r}; use 'lark' or 'ebnf'")
