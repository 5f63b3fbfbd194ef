"""llguidance behind radixgen's grammar protocols: its `LLTokenizer` built from the vocabulary's exact bytes
(special tokens marked with llguidance's 0xFF prefix, so never allowed inside text) and the model tokenizer's
`encode` (llguidance tokenizes the text a grammar forces with it), one per vocabulary; a compiled grammar is a
validated prototype `LLMatcher` that each request's matcher copies.

Kinds: regex, JSON Schema (radixgen's compact `", "` / `": "` layout), EBNF/GBNF (converted to Lark by
llguidance), Lark; each source is read in llguidance's own dialect (its regexes are Rust's: `\\d` is any
Unicode digit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import llguidance as llg
import llguidance.numpy as llg_numpy
import numpy as np

from radixgen.grammars.backend import Encode, GrammarBackendName
from radixgen.grammars.backends.common import NoReports, PerVocabulary, get_or_build, mask_view, peer_source
from radixgen.grammars.constraint import Constraint
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.lru import ByteLru
from radixgen.grammars.vocabulary import Vocabulary

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # declared in llguidance's stub only

COMPILED_GRAMMARS = 256  # prototype matchers kept per backend, used most recently
SPECIAL_PREFIX = b"\xff"  # llguidance's mark of a special token's bytes
JSON_LAYOUT: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class _Tokens:
    """The tokenizer view `llg.TokenizerWrapper` reads: every token's bytes, EOS, specials, and text -> ids.

    The wrapper probes whether the callable takes bytes; this one refuses them, so it is always given text."""

    def __init__(self, vocab: Vocabulary, encode: Encode) -> None:
        self.eos_token_id = vocab.eos_token_ids[0]
        self.bos_token_id = None
        self.tokens = [SPECIAL_PREFIX + data if v in vocab.special_ids else data
                       for v, data in enumerate(vocab.token_bytes)]
        self.special_token_ids = sorted(vocab.special_ids)
        self._encode = encode

    def __call__(self, text: str | bytes) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("give text, not bytes")
        return self._encode(text)


def _tokenizer(vocab: Vocabulary, encode: Encode | None) -> llg.LLTokenizer:
    if encode is None:
        raise ValueError("the llguidance grammar backend needs the model tokenizer's encode")
    if not vocab.eos_token_ids:
        raise ValueError("the llguidance grammar backend needs a vocabulary with an EOS id")
    return llg.LLTokenizer(llg.TokenizerWrapper(_Tokens(vocab, encode)), n_vocab=vocab.size,
                           eos_token=list(vocab.eos_token_ids))


_TOKENIZERS: PerVocabulary[llg.LLTokenizer] = PerVocabulary(_tokenizer)


def _grammar_text(constraint: Constraint) -> str:
    """The llguidance grammar (its JSON text) of a constraint; ValueError for a source it cannot read."""
    kind, source = constraint.kind, constraint.source
    if kind == "regex":
        return str(llg.LLMatcher.grammar_from_regex(source))
    if kind == "json_schema":
        return str(llg.LLMatcher.grammar_from_json_schema(source, defaults=JSON_LAYOUT))
    if kind == "ebnf":
        return str(llg.grammar_from("gbnf", peer_source("llguidance", source, "ebnf")))
    return str(llg.LLMatcher.grammar_from_lark(peer_source("llguidance", source, "lark", reads_refs=True)))


class LLGuidanceBackend:
    """Compiles constraints with llguidance for one vocabulary; compiled grammars are kept (bounded) here."""

    def __init__(self, vocab: Vocabulary, encode: Encode | None = None) -> None:
        self.vocab = vocab
        self._tokenizer = _TOKENIZERS.get(vocab, encode)
        self._compiled: ByteLru[LLGuidanceGrammar] = ByteLru(COMPILED_GRAMMARS)  # counted by entries

    @property
    def name(self) -> GrammarBackendName:
        return "llguidance"

    def compile(self, constraint: Constraint) -> LLGuidanceGrammar:
        return get_or_build(self._compiled, constraint, lambda: self._build(constraint))

    def _build(self, constraint: Constraint) -> LLGuidanceGrammar:
        try:
            text = _grammar_text(constraint)
        except ValueError as exc:
            raise GrammarError(f"llguidance: {exc}") from exc
        prototype = llg.LLMatcher(self._tokenizer, text, log_level=0)
        if prototype.is_error():
            raise GrammarError(f"llguidance: {prototype.get_error()}")
        return LLGuidanceGrammar(prototype, self.vocab)


class LLGuidanceGrammar(NoReports):
    """A validated prototype matcher; each request's matcher is a copy. Reports no relaxations or narrowings."""

    def __init__(self, prototype: llg.LLMatcher, vocab: Vocabulary) -> None:
        self.prototype = prototype
        self.vocab = vocab

    def matcher(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self.prototype.deep_copy(), self.vocab)


class LLGuidanceMatcher:
    """An `llg.LLMatcher` with radixgen's matcher contract. A token is taken with `try_consume_tokens`, which
    leaves the matcher as it was when it refuses (its `consume_token` would put it in a lasting error state);
    rollback is checked against the tokens taken for the same reason. Where the text is complete and nothing
    can follow, llguidance has stopped and takes no EOS; EOS is accepted here then, as one more token."""

    def __init__(self, matcher: llg.LLMatcher, vocab: Vocabulary) -> None:
        self._matcher = matcher
        self._vocab = vocab
        self._accepted = 0  # tokens taken, `eos_after_stop` included
        self._eos_after_stop = False

    def fill_mask(self, row: np.ndarray) -> None:
        words = self._vocab.mask_words
        llg_numpy.fill_next_token_bitmask(self._matcher, mask_view(row, words))
        row[words:] = 0
        if self._matcher.is_error():
            raise RuntimeError(f"llguidance: {self._matcher.get_error()}")

    def advance(self, token_id: int) -> bool:
        if self._eos_after_stop or not 0 <= token_id < self._vocab.size:
            return False
        if self._matcher.try_consume_tokens([token_id]) == 1:
            self._accepted += 1
            return True
        if token_id in self._vocab.eos_token_ids and self._matcher.is_stopped() and self._matcher.is_accepting():
            self._eos_after_stop = True
            self._accepted += 1
            return True
        return False

    def forced_suffix(self) -> bytes:
        return b"" if self._eos_after_stop else bytes(self._matcher.compute_ff_bytes())

    def forced_token(self) -> int | None:
        return None  # the peer's forced text is all it reports

    def rollback(self, n_tokens: int) -> None:
        if not 0 <= n_tokens <= self._accepted:
            raise ValueError(f"cannot roll back {n_tokens} tokens; {self._accepted} were accepted")
        self._accepted -= n_tokens
        if n_tokens and self._eos_after_stop:
            self._eos_after_stop = False
            n_tokens -= 1
        if n_tokens and not self._matcher.rollback(n_tokens):
            raise RuntimeError(f"llguidance: {self._matcher.get_error()}")

    def fork(self) -> LLGuidanceMatcher:
        """llguidance's own deep copy of the matcher (its parse state and token history)."""
        twin = LLGuidanceMatcher(self._matcher.deep_copy(), self._vocab)
        twin._accepted, twin._eos_after_stop = self._accepted, self._eos_after_stop
        return twin

    def is_terminated(self) -> bool:
        return bool(self._matcher.is_stopped())
