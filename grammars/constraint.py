"""The constraint vocabulary every layer shares: the kinds of output constraint, a `Constraint` (kind, source
text), and the one dispatch from a constraint to its compiler.

The language, the engine and the server name constraints only through these, so a new kind is added here, to
`ConstraintKind` and `compile_constraint`, and nowhere else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast, get_args

from radixgen.grammars.errors import GrammarError
from radixgen.grammars.grammar import Grammar, compile_grammar, compile_regex
from radixgen.grammars.json_schema import compile_json_schema
from radixgen.grammars.vocabulary import Vocabulary

# `grammar` is Lark text; `ebnf` is GBNF text (ebnf.py); `json_schema` is a JSON Schema as JSON text.
ConstraintKind = Literal["regex", "json_schema", "ebnf", "grammar"]
CONSTRAINT_KINDS: tuple[ConstraintKind, ...] = get_args(ConstraintKind)
# Other names `compile` takes for a kind.
KIND_ALIASES: dict[str, ConstraintKind] = {"lark": "grammar"}


@dataclass(frozen=True)
class Constraint:
    """One output constraint: its kind and its source text (a JSON Schema as JSON text, keys in their given
    order since property order is generation order)."""

    kind: ConstraintKind
    source: str
    # JSON Schema only: a schema without `type` is narrowed to the types its keywords govern (reported as a
    # narrowing); False keeps every JSON type, each with the keywords that govern it (the exact language).
    infer_types: bool = True

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS:
            raise GrammarError(f"constraint kind must be one of {CONSTRAINT_KINDS}, got {self.kind!r}")
        if not self.infer_types and self.kind != "json_schema":
            raise GrammarError(f"infer_types applies to a JSON Schema only, not to a {self.kind} constraint")


def json_schema_constraint(schema: str | Mapping[str, object] | bool, infer_types: bool = True) -> Constraint:
    """A JSON Schema constraint from the schema's JSON text, or its dict or boolean (written as compact JSON, keys
    in order)."""
    source = schema if isinstance(schema, str) else json.dumps(schema, separators=(",", ":"))
    return Constraint("json_schema", source, infer_types)


def compile_constraint(constraint: Constraint, vocab: Vocabulary) -> Grammar:
    """The cached `Grammar` of `constraint` for `vocab`; raises what the kind's compiler raises (a `ValueError`:
    `GrammarError`, or `json.JSONDecodeError` for a JSON Schema that is not JSON)."""
    if constraint.kind == "regex":
        return compile_regex(constraint.source, vocab)
    if constraint.kind == "json_schema":
        return compile_json_schema(json.loads(constraint.source), vocab, infer_types=constraint.infer_types)
    if constraint.kind == "ebnf":
        return compile_grammar(constraint.source, vocab, syntax="ebnf")
    return compile_grammar(constraint.source, vocab, syntax="lark")


def compile(constraint: Mapping[str, object] | tuple[str, object], vocab: Vocabulary) -> Grammar:
    """`compile_constraint` for a constraint given loosely: `{"regex": ...}` (exactly one key not None) or a
    `(kind, source)` pair; kinds are `CONSTRAINT_KINDS` and `lark` (= `grammar`); a JSON Schema may be a dict."""
    items: list[tuple[str, object]] = list(constraint.items()) if isinstance(constraint, Mapping) else [constraint]
    given = [(k, v) for k, v in items if v is not None]
    names = (*CONSTRAINT_KINDS, *KIND_ALIASES)
    if len(given) != 1:
        raise GrammarError(f"expected exactly one constraint of {names}, got {[k for k, _ in given]}")
    name, source = given[0]
    kind = next((k for k in CONSTRAINT_KINDS if k == KIND_ALIASES.get(name, name)), None)
    if kind is None:
        raise GrammarError(f"unknown constraint kind {name!r}; expected one of {names}")
    if kind == "json_schema" and isinstance(source, (Mapping, bool)):
        return compile_constraint(json_schema_constraint(source), vocab)
    # A source that is not text fails in the kind's compiler, as it always has.
    return compile_constraint(Constraint(kind, cast(str, source)), vocab)
