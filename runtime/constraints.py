"""Compile a request's constraint (regex / JSON Schema / EBNF / Lark) for the engine's vocabulary."""

from __future__ import annotations

import json


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
