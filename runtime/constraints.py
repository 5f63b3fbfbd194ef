"""The engine's bridge to the grammars package: the `Vocabulary` of a tokenizer, and a request's constraint
compiled by the engine's grammar backend (grammars/backend.py; radixgen's own caches compiled grammars) with
any failure reported as the request's field."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from radixgen.grammars import Constraint, Vocabulary

if TYPE_CHECKING:
    from radixgen.grammars.backend import CompiledGrammar, GrammarBackend
    from radixgen.grammars.disk_cache import GrammarDiskCache
    from radixgen.tokenizer import Tokenizer


def build_vocabulary(tokenizer: Tokenizer, eos_token_ids: Iterable[int] | None = None,
                     grammar_cache: GrammarDiskCache | None = None) -> Vocabulary:
    """The grammars' `Vocabulary` of a tokenizer: every id's exact bytes, its EOS ids (or `eos_token_ids`),
    and its special ids (never allowed inside constrained text); grammars compiled against it are kept in
    `grammar_cache` too when given."""
    eos = sorted(tokenizer.eos_token_ids if eos_token_ids is None else eos_token_ids)
    special = sorted(tokenizer.special_token_ids)
    return Vocabulary(tokenizer.all_token_bytes(), eos_token_ids=eos, special_ids=special,
                      grammar_cache=grammar_cache)


GRAMMAR_CACHE_ENV = "RADIXGEN_GRAMMAR_CACHE"  # 0 / off / false / no: compiled grammars are not kept on disk


def grammar_disk_cache(disabled: bool = False) -> GrammarDiskCache | None:
    """The on-disk cache of compiled grammars, `<cache dir>/grammars` (runtime/download.py), unless `disabled`
    (the engine's `disable_grammar_disk_cache`) or turned off by $RADIXGEN_GRAMMAR_CACHE."""
    from radixgen.grammars.disk_cache import GrammarDiskCache
    from radixgen.runtime.download import cache_dir

    if disabled or os.environ.get(GRAMMAR_CACHE_ENV, "").strip().lower() in ("0", "off", "false", "no"):
        return None
    return GrammarDiskCache(cache_dir() / "grammars")


def compile_request_constraint(constraint: Constraint, backend: GrammarBackend | None) -> CompiledGrammar:
    """The compiled grammar of a request's constraint; a ValueError whose message starts with the constraint's
    field (`regex: ...`) when it cannot be compiled (or the backend lacks its kind)."""
    if backend is None:
        raise ValueError(f"{constraint.kind}: constrained decoding needs a vocabulary")
    try:
        return backend.compile(constraint)
    except ValueError as exc:
        raise ValueError(f"{constraint.kind}: {exc}") from exc
    except Exception as exc:  # a compiler bug must still surface as a clear request error
        raise ValueError(f"{constraint.kind}: could not compile: {type(exc).__name__}: {exc}") from exc
