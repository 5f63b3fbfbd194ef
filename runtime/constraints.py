"""Compile a request's constraint (regex / JSON Schema / EBNF / Lark) for the engine's vocabulary, and build that
vocabulary from a tokenizer (the one bridge between the tokenizer and the grammars package)."""

from __future__ import annotations

import json
from collections.abc import Iterable


def build_vocabulary(tokenizer, eos_token_ids: Iterable[int] | None = None):
    """The grammars' `Vocabulary` of a `radixgen.tokenizer.Tokenizer`: every id's exact bytes, its EOS
    ids (or `eos_token_ids`), and its special ids (never allowed inside constrained text)."""
    from radixgen.grammars import Vocabulary

    eos = sorted(tokenizer.eos_token_ids if eos_token_ids is None else eos_token_ids)
    special = sorted(getattr(tokenizer, "special_token_ids", None) or [])
    return Vocabulary(tokenizer.all_token_bytes(), eos_token_ids=eos, special_ids=special)


def compile_constraint(constraint, vocab):
    """Return a compiled, cached `radixgen.grammars.Grammar`; raise ValueError naming the field on failure."""
    from radixgen import grammars

    if vocab is None:
        raise ValueError(f"{constraint.kind}: constrained decoding needs a vocabulary")
    try:
        if constraint.kind == "regex":
            return grammars.compile_regex(constraint.source, vocab)
        if constraint.kind == "json_schema":
            return grammars.compile_json_schema(json.loads(constraint.source), vocab)
        if constraint.kind == "ebnf":
            return grammars.compile_grammar(constraint.source, vocab, syntax="ebnf")
        return grammars.compile_grammar(constraint.source, vocab, syntax="lark")
    except ValueError as exc:
        raise ValueError(f"{constraint.kind}: {exc}") from exc
    except Exception as exc:  # a compiler bug must still surface as a clear request error
        raise ValueError(f"{constraint.kind}: could not compile: {type(exc).__name__}: {exc}") from exc
