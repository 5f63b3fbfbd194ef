"""The engine's bridge to the grammars package: the `Vocabulary` of a tokenizer, and a request's constraint
compiled (through `grammars.compile_constraint`, which caches) with any failure reported as the request's field."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from radixgen.grammars import Constraint, Grammar, Vocabulary, compile_constraint

if TYPE_CHECKING:
    from radixgen.tokenizer import Tokenizer


def build_vocabulary(tokenizer: Tokenizer, eos_token_ids: Iterable[int] | None = None) -> Vocabulary:
    """The grammars' `Vocabulary` of a tokenizer: every id's exact bytes, its EOS ids (or `eos_token_ids`),
    and its special ids (never allowed inside constrained text)."""
    eos = sorted(tokenizer.eos_token_ids if eos_token_ids is None else eos_token_ids)
    special = sorted(tokenizer.special_token_ids)
    return Vocabulary(tokenizer.all_token_bytes(), eos_token_ids=eos, special_ids=special)


def compile_request_constraint(constraint: Constraint, vocab: Vocabulary | None) -> Grammar:
    """The compiled `Grammar` of a request's constraint; a ValueError whose message starts with the
    constraint's field (`regex: ...`) when it cannot be compiled."""
    if vocab is None:
        raise ValueError(f"{constraint.kind}: constrained decoding needs a vocabulary")
    try:
        return compile_constraint(constraint, vocab)
    except ValueError as exc:
        raise ValueError(f"{constraint.kind}: {exc}") from exc
    except Exception as exc:  # a compiler bug must still surface as a clear request error
        raise ValueError(f"{constraint.kind}: could not compile: {type(exc).__name__}: {exc}") from exc
