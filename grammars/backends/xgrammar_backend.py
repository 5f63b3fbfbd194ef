"""XGrammar behind radixgen's grammar protocols: its `TokenizerInfo` built from the vocabulary's exact bytes
(special ids as empty tokens, so never allowed inside text), one `GrammarCompiler` (and its bounded cache of
compiled grammars) per vocabulary, and a matcher adapter.

Kinds: regex (`compile_regex`), JSON Schema (`compile_json_schema` with radixgen's compact `", "` / `": "`
layout and JSON Schema's defaults for unlisted properties), EBNF/GBNF (`compile_grammar`), Lark
(`Grammar.from_lark`, where the installed XGrammar has it). Each source is read in XGrammar's own dialect.
"""

from __future__ import annotations

import re
from importlib.metadata import version

import numpy as np
import xgrammar as xgr

from radixgen.grammars.backend import Encode, GrammarBackendName
from radixgen.grammars.backends.common import NoReports, PerVocabulary, mask_view, peer_source, unsupported_kind
from radixgen.grammars.constraint import Constraint
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.matcher import copy_mask
from radixgen.grammars.vocabulary import Vocabulary

COMPILE_CACHE_BYTES = 512 << 20  # the compiler's cache of compiled grammars, per vocabulary
_LOCATION = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")  # "[12:00:00] /project/cpp/x.cc:12: " before C++ messages


def _compiler(vocab: Vocabulary, encode: Encode | None) -> xgr.GrammarCompiler:
    encoded = [b"" if v in vocab.special_ids else data for v, data in enumerate(vocab.token_bytes)]
    info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=vocab.size,
                             stop_token_ids=list(vocab.eos_token_ids))
    return xgr.GrammarCompiler(info, cache_enabled=True, cache_limit_bytes=COMPILE_CACHE_BYTES)


_COMPILERS: PerVocabulary[xgr.GrammarCompiler] = PerVocabulary(_compiler)


class XGrammarBackend:
    """Compiles constraints with XGrammar for one vocabulary."""

    def __init__(self, vocab: Vocabulary, encode: Encode | None = None) -> None:
        self.vocab = vocab
        self._compiler = _COMPILERS.get(vocab)

    @property
    def name(self) -> GrammarBackendName:
        return "xgrammar"

    def compile(self, constraint: Constraint) -> XGrammarGrammar:
        kind, source = constraint.kind, constraint.source
        if kind == "grammar" and not hasattr(xgr.Grammar, "from_lark"):
            raise unsupported_kind("xgrammar", kind, f"xgrammar {version('xgrammar')} reads no Lark")
        try:
            if kind == "regex":
                compiled = self._compiler.compile_regex(source)
            elif kind == "json_schema":
                compiled = self._compiler.compile_json_schema(source, any_whitespace=False, separators=(", ", ": "),
                                                              strict_mode=False)
            elif kind == "ebnf":
                compiled = self._compiler.compile_grammar(peer_source("xgrammar", source, "ebnf"),
                                                          root_rule_name="root")
            else:
                compiled = self._compiler.compile_grammar(xgr.Grammar.from_lark(peer_source("xgrammar", source,
                                                                                            "lark")))
        except RuntimeError as exc:  # XGrammar reports every syntax and schema error as a RuntimeError
            raise GrammarError(f"xgrammar: {_LOCATION.sub('', str(exc)).strip()}") from exc
        return XGrammarGrammar(compiled, self.vocab)


class XGrammarGrammar(NoReports):
    """One compiled XGrammar grammar; it reports no relaxations or narrowings (XGrammar lists none)."""

    def __init__(self, compiled: xgr.CompiledGrammar, vocab: Vocabulary) -> None:
        self.compiled = compiled
        self.vocab = vocab

    def matcher(self) -> XGrammarMatcher:
        return XGrammarMatcher(self)


class XGrammarMatcher:
    """An `xgr.GrammarMatcher` with radixgen's matcher contract: `is_terminated` also where the text is complete
    and only EOS may follow (XGrammar terminates only on the stop token), found from the mask, which is kept
    for the next `fill_mask` at the same position."""

    def __init__(self, grammar: XGrammarGrammar, matcher: xgr.GrammarMatcher | None = None, accepted: int = 0,
                 mask: np.ndarray | None = None) -> None:
        self._grammar = grammar
        self._vocab = grammar.vocab
        self._matcher = xgr.GrammarMatcher(grammar.compiled) if matcher is None else matcher
        self._accepted = accepted
        self._mask = mask  # this position's mask, once computed (never written after: forks share it)

    def _position_mask(self) -> np.ndarray:
        if self._mask is None:
            mask = self._vocab.new_mask()
            if self._matcher.is_terminated():  # EOS accepted: only EOS again, as radixgen's matcher answers
                mask[:] = self._vocab.eos_mask
            else:
                self._matcher.fill_next_token_bitmask(mask_view(mask, mask.shape[0]))
            self._mask = mask
        return self._mask

    def fill_mask(self, row: np.ndarray) -> None:
        if self._mask is not None or self._matcher.is_terminated():
            copy_mask(self._position_mask(), row)
            return
        words = self._vocab.mask_words
        self._matcher.fill_next_token_bitmask(mask_view(row, words))
        row[words:] = 0

    def advance(self, token_id: int) -> bool:
        if not 0 <= token_id < self._vocab.size or not self._matcher.accept_token(token_id):
            return False
        self._accepted += 1
        self._mask = None
        return True

    def forced_suffix(self) -> bytes:
        if self._matcher.is_terminated():
            return b""
        return str(self._matcher.find_jump_forward_string()).encode("utf-8")

    def forced_token(self) -> int | None:
        return None  # the peer's forced text is all it reports

    def rollback(self, n_tokens: int) -> None:
        if not 0 <= n_tokens <= self._accepted:
            raise ValueError(f"cannot roll back {n_tokens} tokens; {self._accepted} were accepted")
        if n_tokens:
            self._matcher.rollback(n_tokens)
            self._accepted -= n_tokens
            self._mask = None

    def fork(self) -> XGrammarMatcher:
        """XGrammar's own fork (a deep copy of the parse state and token history)."""
        return XGrammarMatcher(self._grammar, self._matcher.fork(), self._accepted, self._mask)

    def is_terminated(self) -> bool:
        if self._matcher.is_terminated():
            return True
        if not self._matcher.is_completed():
            return False
        others = self._position_mask() & ~self._vocab.eos_mask
        return not bool(others.any())
