"""What the engine needs of a grammar engine: a compiled grammar, its per-request matcher, and the backend that
compiles a request's `Constraint` for the engine's vocabulary; radixgen's own engine and the optional peers
(XGrammar, llguidance: grammars/backends/) behind the same three protocols.

    make = grammar_backend_factory("xgrammar")   # GrammarBackendUnavailable when its package is missing
    backend = make(vocab, encode)                # built once per engine
    grammar = backend.compile(constraint)        # a ValueError naming the kind (and backend) when it cannot
    matcher = grammar.matcher()                  # one per request

A peer's package is imported only when its factory is asked for, never by the default path.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Protocol, get_args

import numpy as np

from radixgen.grammars.constraint import Constraint, compile_constraint
from radixgen.grammars.vocabulary import Vocabulary

if TYPE_CHECKING:
    from radixgen.grammars.grammar import Grammar

GrammarBackendName = Literal["radixgen", "xgrammar", "llguidance"]
GRAMMAR_BACKENDS: tuple[GrammarBackendName, ...] = get_args(GrammarBackendName)
# backend -> (the module it imports, the extra that installs it)
PEER_PACKAGES: dict[str, tuple[str, str]] = {"xgrammar": ("xgrammar", "radixgen[xgrammar]"),
                                              "llguidance": ("llguidance", "radixgen[llguidance]")}

# The model tokenizer's ids for a text, no special tokens added (llguidance tokenizes forced text with it).
Encode = Callable[[str], list[int]]


class GrammarMatcher(Protocol):
    """One request's position in its grammar. Not thread-safe: one per request, used by the engine loop."""

    def fill_mask(self, row: np.ndarray) -> None:
        """Write the packed int32 bitmask of allowed next tokens into `row` (ceil(V/32) words or more; words
        past the vocabulary's are zeroed)."""
        ...

    def advance(self, token_id: int) -> bool:
        """Accept `token_id` if allowed; False (state unchanged) otherwise."""
        ...

    def forced_suffix(self) -> bytes:
        """Bytes every valid continuation starts with (b"" when none, or when the backend cannot say)."""
        ...

    def forced_token(self) -> int | None:
        """The one token every valid continuation starts with, where the grammar names a token rather than text
        (a special token: `forced_suffix` stops before it); None otherwise, or when the backend cannot say."""
        ...

    def rollback(self, n_tokens: int) -> None:
        """Undo the last `n_tokens` accepted tokens; ValueError beyond those accepted."""
        ...

    def fork(self) -> GrammarMatcher:
        """An independent matcher at this one's position (what a fresh matcher fed the same tokens would be;
        rollback reaches as far back), made without replaying them: a beam continuing another beam."""
        ...

    def is_terminated(self) -> bool:
        """EOS was accepted, or the text is complete and nothing can follow it."""
        ...


class CompiledGrammar(Protocol):
    """A constraint compiled against one vocabulary; immutable, shared by the matchers it makes."""

    @property
    def relaxations(self) -> tuple[str, ...]:
        """What the constraint asked that the grammar enforces more loosely, one message each."""
        ...

    @property
    def narrowings(self) -> tuple[str, ...]:
        """What the grammar enforces more strictly than the constraint asked, one message each."""
        ...

    def matcher(self) -> GrammarMatcher: ...


class GrammarBackend(Protocol):
    """Compiles requests' constraints for one vocabulary (safe to call from several threads)."""

    @property
    def name(self) -> GrammarBackendName: ...

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """The compiled constraint; a ValueError when it cannot be compiled or this backend lacks its kind."""
        ...


GrammarBackendFactory = Callable[[Vocabulary, Encode], GrammarBackend]


class GrammarBackendUnavailable(ValueError):
    """The grammar backend asked for is not installed (or not known); the message names the extra."""


class RadixgenBackend:
    """radixgen's own grammar engine (the default): `compile_constraint`, cached process-wide by grammar.py.
    `encode` is not needed: the automaton reads the vocabulary's bytes."""

    def __init__(self, vocab: Vocabulary, encode: Encode | None = None) -> None:
        self.vocab = vocab

    @property
    def name(self) -> GrammarBackendName:
        return "radixgen"

    def compile(self, constraint: Constraint) -> Grammar:
        return compile_constraint(constraint, self.vocab)


def installed_grammar_backends() -> tuple[GrammarBackendName, ...]:
    """The backends whose package is importable here, radixgen first."""
    return tuple(b for b in GRAMMAR_BACKENDS
                 if b not in PEER_PACKAGES or importlib.util.find_spec(PEER_PACKAGES[b][0]) is not None)


def grammar_backend_factory(name: str) -> GrammarBackendFactory:
    """The constructor of backend `name`, its package imported now, so a missing one fails before a model
    loads; GrammarBackendUnavailable names the extra that installs it."""
    if name == "radixgen":
        return RadixgenBackend
    if name not in PEER_PACKAGES:
        raise GrammarBackendUnavailable(f"grammar_backend must be one of {'|'.join(GRAMMAR_BACKENDS)}, got {name!r}")
    package, extra = PEER_PACKAGES[name]
    try:
        if name == "xgrammar":
            from radixgen.grammars.backends.xgrammar_backend import XGrammarBackend

            return XGrammarBackend
        from radixgen.grammars.backends.llguidance_backend import LLGuidanceBackend

        return LLGuidanceBackend
    except ImportError as exc:
        raise GrammarBackendUnavailable(
            f"grammar_backend={name!r} needs the {package} package: pip install '{extra}' ({exc})") from exc
