"""JSON Schema conformance, keyword by keyword (draft 2020-12; draft-07 and draft-04 where they differ), checked
against `jsonschema` (the reference) in both directions:

* what the reference accepts, the grammar accepts (in some spelling its narrowings allow: keys in another
  order, `1` for `1.0`), unless a narrowing of the value is reported (an inferred type, an asserted format,
  ...);
* what the reference rejects, the grammar rejects, unless a relaxation is reported.

Every schema is tried on values of every JSON type (`PROBES`) and on its own boundary cases, once with
`infer_types=False` (the exact language) and once with the default inference. Acceptance is decided by the
grammar's own automaton. Property tests do the same for random schemas and values (hypothesis, fixed seed).
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from json_schema_respell import accepts_respelled, accepts_text, dumps

from radixgen.grammars import Vocabulary
from radixgen.grammars.json_schema import SchemaError, compile_json_schema, json_schema_to_ebnf

DRAFT7 = "http://json-schema.org/draft-07/schema#"
DRAFT4 = "http://json-schema.org/draft-04/schema#"
PROBES: list[Any] = [None, True, False, 0, -1, 7, 1.5, -0.5, "", "a", "ab", "é", [], [1], ["a", 1], {}, {"a": 1},
                     {"b": "x"}]
# Narrowings that change only the spelling of a value (undone by `accepts_respelled`), not which values pass.
SPELLING = ("whitespace as json.dumps writes it", "at most", "properties in declared order",
            "object constants are written")


@pytest.fixture(scope="module")
def vocab() -> Vocabulary:
    """256 one-byte tokens and EOS: compiling for it is cheap, and acceptance is byte-exact."""
    tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]
    return Vocabulary(tokens, eos_token_ids=[256], special_ids=[256])


def value_narrowings(narrowings: tuple[str, ...]) -> list[str]:
    return [n for n in narrowings if not n.startswith(SPELLING)]


def disagreement(schema: Any, value: Any, grammar: Any) -> str | None:
    """Why the grammar's verdict on `value` breaks the contract, or None when it keeps it."""
    validator = jsonschema.validators.validator_for(schema)(schema)
    valid = validator.is_valid(value)
    draft4 = isinstance(validator, jsonschema.Draft4Validator)
    accepted = accepts_text(grammar, dumps(value)) or accepts_respelled(grammar, value, integral=not draft4)
    if accepted and not valid and not grammar.relaxations:
        return f"accepts invalid {dumps(value)} without a relaxation"
    if valid and not accepted and not value_narrowings(grammar.narrowings):
        return f"rejects valid {dumps(value)} without a narrowing ({grammar.narrowings})"
    return None


def check(schema: Any, values: list[Any], vocab: Vocabulary, infer_types: bool) -> list[str]:
    grammar = compile_json_schema(schema, vocab, infer_types=infer_types)
    return [why for v in [*PROBES, *values] if (why := disagreement(schema, v, grammar)) is not None]


# (name, schema, boundary values). Object values list their keys in declared order where the test is not
# about order.
CASES: list[tuple[str, Any, list[Any]]] = [
    # ---- any type ----
    ("type-single", {"type": "string"}, []),
    ("type-list", {"type": ["integer", "null"]}, [2, 2.0, 2.5]),
    ("type-integer-spellings", {"type": "integer"}, [1.0, -0.0, 10**30, -(10**30), 2**63]),
    ("type-number", {"type": "number"}, [1e300, -1e-300, 10**30, 0.1]),
    ("type-boolean-null", {"type": ["boolean", "null"]}, []),
    ("enum-scalars", {"enum": ["a", 1, None, True]}, [1.0, False, "A"]),
    ("enum-containers", {"enum": [{"k": [1, 2]}, [1, {"a": None}], {}]}, [{"k": [1, 2.0]}, {"k": [2, 1]},
                                                                          [1, {"a": None}], [1], {"k": []}]),
    ("enum-object-key-order", {"enum": [{"a": 1, "b": 2}]}, [{"b": 2, "a": 1}, {"a": 1}]),
    ("const-null", {"const": None}, []),
    ("const-object", {"const": {"x": "é\n", "y": [True]}}, [{"x": "é\n", "y": [True]}, {"x": "é"}]),
    ("const-number", {"const": 2.5}, [2.5, 2.50, 25e-1, 2]),
    ("const-zero", {"const": 0}, [0, 0.0, -0.0, False]),
    ("boolean-true", True, []),
    ("boolean-false-in-properties", {"properties": {"a": False}}, [{"a": 1}, {"b": 1}]),
    # ---- numbers ----
    ("minimum", {"minimum": 3}, [2, 3, 3.0, 2.999, 3.5, 100]),
    ("exclusiveMinimum", {"exclusiveMinimum": 3}, [3, 3.0001, 4]),
    ("maximum-negative", {"maximum": -2}, [-2, -1.5, -2.5, -3]),
    ("exclusiveMaximum", {"exclusiveMaximum": 0}, [0, -0.0001, 0.5]),
    ("integer-range", {"type": "integer", "minimum": -15, "exclusiveMaximum": 120}, [-15, -16, 119, 120]),
    ("number-range", {"type": "number", "minimum": 0, "maximum": 10}, [0, 10, 10.0, 10.5, -0.5, 9.99]),
    ("bounds-near-int64", {"type": "integer", "maximum": 9223372036854775807},
     [9223372036854775807, 9223372036854775808]),
    ("bounds-huge", {"type": "number", "maximum": 1.7976931348623157e308}, [1e300, 1e30, -1e30]),
    ("multipleOf-integer", {"multipleOf": 5}, [0, 5, -5, 10.0, 7, 2.5]),
    ("multipleOf-half", {"type": "number", "multipleOf": 0.5}, [0.5, 1, 1.5, 0.25, -2.5]),
    ("multipleOf-quarter-bounded", {"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 1},
     [0, 0.25, 0.75, 1, 1.25, 0.3]),
    ("multipleOf-three", {"type": "integer", "multipleOf": 3}, [3, 9, 10, -6, 300, 301]),
    ("draft4-exclusive", {"$schema": DRAFT4, "type": "number", "minimum": 0, "exclusiveMinimum": True},
     [0, 0.001, -1]),
    ("draft4-integer", {"$schema": DRAFT4, "type": "integer"}, [1, 1.0]),
    # ---- strings ----
    ("minLength", {"minLength": 2}, ["", "a", "ab", "é\n", "😀", "😀😀"]),
    ("maxLength", {"maxLength": 2}, ["abc", "ab", "\n\t", "日本語"]),
    ("length-range-long", {"type": "string", "minLength": 17, "maxLength": 20}, ["a" * 16, "a" * 17, "é" * 20,
                                                                                 "a" * 21]),
    ("pattern-unanchored", {"pattern": "ab?c"}, ["ac", "xxabcxx", "ab", "AC"]),
    ("pattern-anchored", {"pattern": "^[a-z]+-[0-9]{2}$"}, ["ab-12", "ab-1", "x ab-12"]),
    ("pattern-non-ascii", {"pattern": "^é+$"}, ["é", "éé", "e"]),
    ("pattern-and-length", {"type": "string", "pattern": "^a", "maxLength": 3}, ["a", "abc", "abcd", "b"]),
    ("two-patterns", {"allOf": [{"pattern": "^a"}, {"pattern": "z$"}]}, ["az", "a", "z", "abz"]),
    ("format-date", {"format": "date"}, ["2024-02-29", "2023-02-29", "x"]),
    ("format-email-with-pattern", {"type": "string", "format": "email", "pattern": "^[a-z@.]+$"},
     ["a@b.c", "A@b.c", "abc"]),
    ("format-unknown", {"type": "string", "format": "color"}, ["red"]),
    # ---- arrays ----
    ("items", {"items": {"type": "integer"}}, [[1, 2], [1, "a"], [1.0]]),
    ("prefixItems", {"prefixItems": [{"type": "string"}, {"type": "integer"}]}, [["a"], ["a", 1], ["a", 1, None],
                                                                              [1]]),
    ("prefixItems-closed", {"prefixItems": [{"type": "string"}], "items": False}, [["a"], ["a", 1]]),
    ("draft7-tuple-items", {"$schema": DRAFT7, "items": [{"type": "string"}], "additionalItems": {"type": "integer"}},
     [["a", 1], ["a", "b"], [1]]),
    ("minItems-maxItems", {"minItems": 1, "maxItems": 2}, [[], [1], [1, 2], [1, 2, 3]]),
    ("contains", {"contains": {"type": "string"}}, [[], [1], ["a"], [1, "a", 2], [1, 2, "b"]]),
    ("minContains", {"contains": {"type": "integer"}, "minContains": 2}, [[1], [1, "a", 2], ["a", 1]]),
    ("minContains-zero", {"type": "array", "contains": {"type": "integer"}, "minContains": 0}, [[], ["a"]]),
    ("maxContains", {"contains": {"type": "integer"}, "maxContains": 1}, [[1], [1, 2], ["a"]]),
    ("uniqueItems", {"uniqueItems": True}, [[1, 1], [1, 2], [[1], [1]]]),
    ("uniqueItems-single", {"uniqueItems": True, "maxItems": 1}, [[1], [1, 1]]),
    ("unevaluatedItems", {"prefixItems": [{"type": "integer"}], "unevaluatedItems": False}, [[1], [1, 2]]),
    ("unevaluatedItems-allOf", {"allOf": [{"prefixItems": [True, True]}], "unevaluatedItems": {"type": "string"}},
     [[1, 2], [1, 2, "a"], [1, 2, 3]]),
    # ---- objects ----
    ("required", {"required": ["a"]}, [{"a": 1}, {"b": 1}, {"a": None, "b": 1}]),
    ("minProperties", {"minProperties": 1}, [{}, {"x": 1}]),
    ("maxProperties", {"maxProperties": 1}, [{"x": 1, "y": 2}]),
    ("properties", {"properties": {"a": {"type": "integer"}, "b": {"type": "string"}}},
     [{"a": 1, "b": "x"}, {"a": "1"}, {"b": 2}, {"c": [1]}]),
    ("additionalProperties-false", {"properties": {"a": {}}, "additionalProperties": False},
     [{"a": 1}, {"a": 1, "b": 2}]),
    ("additionalProperties-schema", {"properties": {"a": {"type": "integer"}},
                                     "additionalProperties": {"type": "boolean"}},
     [{"a": 1, "x": True}, {"y": 1}, {"a": True}]),
    ("patternProperties", {"patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False},
     [{"x-a": 1}, {"x-a": "s"}, {"y": 1}]),
    ("patternProperties-with-additional", {"patternProperties": {"^x-": {"type": "integer"}},
                                           "additionalProperties": {"type": "string"}},
     [{"x-a": 1}, {"x-a": "s"}, {"b": "s"}, {"b": 1}]),
    ("patternProperties-overlapping", {"patternProperties": {"^a": {"minimum": 1}, "b$": {"maximum": 5}},
                                       "additionalProperties": False},
     [{"ab": 3}, {"ab": 0}, {"ab": 6}, {"a": 0.5}, {"b": 9}, {"c": 1}]),
    ("patternProperties-declared", {"properties": {"ab": {"type": "string"}},
                                    "patternProperties": {"^a": {"type": "string", "maxLength": 1}}},
     [{"ab": "x"}, {"ab": "xy"}, {"ac": "x"}, {"ac": "xy"}]),
    ("propertyNames", {"propertyNames": {"maxLength": 2}}, [{"ab": 1}, {"abc": 1}]),
    ("propertyNames-pattern-declared", {"properties": {"ab": {}, "Ab": {}}, "propertyNames": {"pattern": "^[a-z]+$"}},
     [{"ab": 1}, {"Ab": 1}, {"cd": 1}, {"C": 1}]),
    ("propertyNames-enum", {"propertyNames": {"enum": ["a", "b"]}}, [{"a": 1, "b": 2}, {"c": 1}]),
    ("dependentRequired", {"dependentRequired": {"a": ["b"]}}, [{"a": 1}, {"a": 1, "b": 2}, {"b": 1}]),
    ("dependentSchemas", {"properties": {"a": {}}, "dependentSchemas": {"a": {"required": ["b"]}}},
     [{"a": 1}, {"a": 1, "b": 2}, {"b": 1}]),
    ("draft7-dependencies", {"$schema": DRAFT7,
                             "dependencies": {"a": ["b"], "c": {"properties": {"d": {"type": "null"}}}}},
     [{"a": 1}, {"a": 1, "b": 2}, {"c": 1, "d": None}, {"c": 1, "d": 1}]),
    ("unevaluatedProperties", {"properties": {"a": {}}, "unevaluatedProperties": False}, [{"a": 1}, {"b": 1}]),
    ("unevaluatedProperties-allOf", {"allOf": [{"properties": {"a": {}}}], "unevaluatedProperties": False},
     [{"a": 1}, {"b": 1}]),
    ("unevaluatedProperties-inside-allOf", {"allOf": [{"properties": {"a": {}}}, {"unevaluatedProperties": False}]},
     [{"a": 1}, {}]),
    ("unevaluatedProperties-anyOf", {"anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                               {"properties": {"b": {"type": "integer"}}, "required": ["b"]}],
                                     "unevaluatedProperties": False},
     [{"a": 1}, {"b": 1}, {"a": 1, "b": 2}, {"a": 1, "c": 2}]),
    ("unevaluatedProperties-if", {"if": {"properties": {"k": {"const": 1}}}, "then": {"properties": {"x": {}}},
                                  "unevaluatedProperties": False},
     [{"k": 1, "x": 2}, {"k": 2, "x": 2}, {"k": 1}]),
    ("allOf-additional-vs-pattern", {"allOf": [{"additionalProperties": False}, {"patternProperties": {"^x": {}}}]},
     [{"x1": 1}, {}]),
    ("allOf-pattern-in-other", {"allOf": [{"patternProperties": {"^b": {"type": "integer"}},
                                           "additionalProperties": False},
                                          {"properties": {"b": {"minimum": 1}}}]},
     [{"b": 1}, {"b": 0}, {"b": "x"}]),
    # ---- property names that need escapes ----
    ("escaped-names", {"properties": {"a\"b": {"type": "string"}, "é": {"type": "integer"}, "\n": {"type": "null"},
                                      "a/b": {}, "~1": {}, "日本": {}}, "additionalProperties": False},
     [{"a\"b": "x"}, {"é": 1}, {"\n": None}, {"a/b": 1, "~1": 2, "日本": 3}, {"e": 1}, {"é": "x"}]),
    ("escaped-names-extra", {"properties": {"a\"b": {"type": "string"}, "\n": {"type": "null"}}},
     [{"a\"b": 1}, {"\u0001": 1}, {"\n": 1}, {"a'b": 1}, {"\\": 1}]),
    # ---- applicators ----
    ("allOf", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                         {"properties": {"a": {"minimum": 3}, "b": {"type": "string"}}}]},
     [{"a": 3}, {"a": 2}, {"a": 4, "b": "x"}, {"a": 3, "b": 1}]),
    ("anyOf", {"anyOf": [{"type": "string", "maxLength": 1}, {"type": "integer", "minimum": 5}]}, [5, 4, "ab"]),
    ("oneOf-disjoint", {"oneOf": [{"type": "string"}, {"type": "boolean"}]}, []),
    ("oneOf-overlapping", {"oneOf": [{"type": "integer"}, {"minimum": 3}]}, [2, 3, 2.5, 4.5]),
    ("oneOf-discriminator", {"oneOf": [{"properties": {"k": {"const": "a"}}, "required": ["k"]},
                                       {"properties": {"k": {"const": "b"}}, "required": ["k"]}]},
     [{"k": "a"}, {"k": "b"}, {"k": "c"}]),
    ("not-type", {"not": {"type": ["string", "object"]}}, []),
    ("not-minimum", {"not": {"minimum": 3}}, [2, 3]),
    ("not-enum", {"not": {"enum": ["a", 1, None]}}, [1.0, 2]),
    ("not-required", {"not": {"required": ["a", "b"]}}, [{"a": 1, "b": 2}, {"a": 1}]),
    ("not-properties", {"not": {"properties": {"a": {"type": "string"}}}}, [{"a": "x"}, {"a": 1}]),
    ("not-pattern", {"not": {"pattern": "^a"}}, ["a", "ba"]),
    ("not-not", {"not": {"not": {"type": "integer"}}}, [1.0]),
    ("not-integer", {"type": "number", "not": {"type": "integer"}}, [1, 1.5, 2.0]),
    ("not-multipleOf", {"not": {"multipleOf": 3}}, [3, 4]),
    ("if-then-else", {"if": {"properties": {"k": {"const": "a"}}, "required": ["k"]},
                      "then": {"required": ["x"]}, "else": {"required": ["y"]}},
     [{"k": "a", "x": 1}, {"k": "a"}, {"k": "b", "y": 1}, {"k": "b"}, {"y": 1}]),
    ("if-then", {"if": {"type": "integer"}, "then": {"minimum": 0}}, [-1, 1, -1.5]),
    ("if-without-then", {"if": {"minimum": 3}, "else": {"type": "string"}}, [4, 2]),
    # ---- references ----
    ("ref-defs", {"$defs": {"pos": {"type": "integer", "minimum": 1}}, "items": {"$ref": "#/$defs/pos"}},
     [[1], [0], ["a"]]),
    ("ref-recursive", {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
     [{"v": 1, "kids": [{"v": 2, "kids": []}]}, {"v": 1, "kids": [{}]}]),
    ("ref-siblings-2020", {"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "maxLength": 1}, ["a", "ab"]),
    ("ref-siblings-draft7", {"$schema": DRAFT7, "definitions": {"s": {"type": "string"}}, "$ref": "#/definitions/s",
                             "maxLength": 1}, ["a", "ab"]),
    ("anchor", {"$defs": {"x": {"$anchor": "int", "type": "integer"}}, "items": {"$ref": "#int"}}, [[1], ["a"]]),
    ("dynamicRef", {"$defs": {"x": {"$dynamicAnchor": "node", "type": "object",
                                    "properties": {"c": {"$dynamicRef": "#node"}}}}, "$ref": "#/$defs/x"},
     [{"c": {}}, {"c": 1}]),
]


@pytest.mark.parametrize("infer_types", [False, True], ids=["exact", "inferred"])
@pytest.mark.parametrize("name,schema,values", CASES, ids=[c[0] for c in CASES])
def test_keyword(name: str, schema: Any, values: list[Any], infer_types: bool, vocab: Vocabulary) -> None:
    assert check(schema, values, vocab, infer_types) == []


@pytest.mark.parametrize("schema,fragment", [
    ({"uniqueItems": True}, "uniqueItems not enforced"),
    ({"contains": {"type": "integer"}, "maxContains": 1}, "maxContains not enforced"),
    ({"not": {"multipleOf": 3}}, "`not` is not enforced"),
    ({"type": "integer", "multipleOf": 7}, "multipleOf 7 not enforced"),
    ({"if": {"multipleOf": 3}, "then": {"minimum": 1}}, "`if`/`then`/`else` is not enforced"),
    ({"type": "string", "format": "color"}, "format 'color' not enforced"),
    ({"type": "number", "minimum": 0.5}, "widened"),
    ({"if": {"properties": {"k": {"const": 1}}}, "then": {"properties": {"x": {}}}, "unevaluatedProperties": False},
     "unevaluatedProperties next to a conditional"),
])
def test_relaxations_are_reported(schema: Any, fragment: str) -> None:
    relaxations = json_schema_to_ebnf(schema).relaxations
    assert any(fragment in r for r in relaxations), relaxations


@pytest.mark.parametrize("schema,fragment,pointer", [
    ({"properties": {"a": {"required": ["b"]}}}, "type inferred as object", "/properties/a"),
    ({"type": "string", "format": "date"}, "format 'date' asserted", "/"),
    ({"type": "object", "properties": {"a": {}, "b": {}}}, "properties in declared order", "/"),
    ({"type": "number", "maximum": 1e300}, "numbers above 10**40 excluded", "/"),
    ({"dependencies": {"a": ["b"]}, "type": "object"}, "`dependencies` (a draft-07 keyword) enforced", "/"),
    ({"type": "object", "properties": {"a": {}}}, "whitespace as json.dumps writes it", "/"),
])
def test_narrowings_are_reported_with_their_pointer(schema: Any, fragment: str, pointer: str) -> None:
    narrowings = json_schema_to_ebnf(schema).narrowings
    assert any(fragment in n and n.endswith(f" at {pointer}") for n in narrowings), narrowings


def test_infer_types_false_reports_no_inferred_type() -> None:
    assert not any("inferred" in n for n in json_schema_to_ebnf({"required": ["a"]}, infer_types=False).narrowings)


@pytest.mark.parametrize("schema,fragment", [
    ({"$id": "https://x/root", "$defs": {"a": {"$id": "https://x/a", "$dynamicAnchor": "n"}},
      "$dynamicRef": "#n"}, "embeds other schema resources"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "disjoint types"),
    ({"type": "string", "pattern": "^a", "not": {"pattern": "^a"}}, "no string satisfies"),
    ({"const": 3, "type": "string"}, "no enum value satisfies"),
])
def test_refusals_say_why(schema: Any, fragment: str) -> None:
    with pytest.raises(SchemaError, match=re.escape(fragment)):
        json_schema_to_ebnf(schema)


def test_grammar_and_engine_carry_the_report(vocab: Vocabulary) -> None:
    from radixgen.runtime.outputs import MetaInfo, StopFinish

    grammar = compile_json_schema({"required": ["a"], "uniqueItems": True}, vocab)
    assert any("inferred" in n for n in grammar.narrowings) and grammar.relaxations
    exact = compile_json_schema({"required": ["a"], "uniqueItems": True}, vocab, infer_types=False)
    assert exact is not grammar and not any("inferred" in n for n in exact.narrowings)
    meta = MetaInfo(id="r", prompt_tokens=1, completion_tokens=1, cached_tokens=0,
                    finish_reason=StopFinish(None), e2e_latency=0.0, decode_steps_saved=0,
                    constraint_relaxations=grammar.relaxations, constraint_narrowings=grammar.narrowings)
    info = meta.to_dict()
    assert info["constraint_narrowings"] == list(grammar.narrowings)
    assert info["constraint_relaxations"] == list(grammar.relaxations)


@pytest.mark.parametrize("vocab_name", ["gpt2", "qwen3"])
def test_real_tokens_across_key_separators(vocab_name: str) -> None:
    """Token by token with a real tokenizer, full mask before each token: the json.dumps spelling walks through
    merged tokens like `": {"`; the `separators=(",", ":")` spelling, tokenized `":{"`, `":["`, `":"`, is refused
    at its first such token by the compact policy (a reported narrowing) and walks with `whitespace="flexible"`."""
    from grammar_vocabs import VOCABS, is_allowed

    vocab, encode = VOCABS[vocab_name]()
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "array"}}},
                                               "c": {"type": "string"}}}
    value = {"a": {"b": [1]}, "c": "x"}

    def walk(grammar: Any, text: str) -> int | None:
        """The index of the first token refused (len(tokens) for a refused EOS), or None."""
        m, row = grammar.matcher(), vocab.new_mask()
        tokens = encode(text)
        for i, tok in enumerate(tokens):
            m.fill_mask(row)
            if not is_allowed(row, tok) or not m.advance(tok):
                return i
        m.fill_mask(row)
        return None if any(is_allowed(row, e) for e in vocab.eos_token_ids) else len(tokens)

    compact = compile_json_schema(schema, vocab)
    flexible = compile_json_schema(schema, vocab, whitespace="flexible")
    tight = json.dumps(value, separators=(",", ":"))
    assert walk(compact, dumps(value)) is None
    assert walk(flexible, dumps(value)) is None and walk(flexible, tight) is None
    refused = walk(compact, tight)
    assert refused is not None and vocab.token_bytes[encode(tight)[refused]].startswith(b'":')
    assert any(n.startswith("whitespace as json.dumps writes it") for n in compact.narrowings)


# ---- property tests ---------------------------------------------------------------------------------------
NAMES = ["a", "b", "x1"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 12), st.sampled_from([0.5, -1.5, 2.0, 1e20]),
                    st.sampled_from(["", "a", "b", "ab", "x1", "abc", "2024-01-31", "a@b.c", "1.2.3.4", "é"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(NAMES + ["c", "xy"]), inner, max_size=3)),
    max_leaves=6)


def _leaf_schemas() -> st.SearchStrategy[Any]:
    types = st.sampled_from(["object", "array", "string", "number", "integer", "boolean", "null"])
    return st.one_of(
        st.just({}), st.booleans(),
        st.builds(lambda t: {"type": t}, st.one_of(types, st.lists(types, min_size=1, max_size=3, unique=True))),
        st.builds(lambda v: {"enum": v}, st.lists(SCALARS, min_size=1, max_size=3)),
        st.builds(lambda v: {"const": v}, SCALARS),
        st.fixed_dictionaries({}, optional={"minimum": st.integers(-2, 5), "exclusiveMaximum": st.integers(0, 10),
                                            "multipleOf": st.sampled_from([2, 0.5, 3])}),
        st.fixed_dictionaries({}, optional={"minLength": st.integers(0, 2), "maxLength": st.integers(1, 3),
                                            "pattern": st.sampled_from(["^a", "b$", "^[a-c]*$", "x"]),
                                            "format": st.sampled_from(["date", "email", "ipv4"])}),
    )


def _extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    names = st.sampled_from(NAMES)
    return st.one_of(
        st.fixed_dictionaries({}, optional={
            "properties": st.dictionaries(names, inner, max_size=2),
            "required": st.lists(names, max_size=2, unique=True),
            "additionalProperties": inner,
            "patternProperties": st.dictionaries(st.sampled_from(["^x", "b"]), inner, max_size=2),
            "propertyNames": st.sampled_from([{"maxLength": 1}, {"pattern": "^[ab]"}]),
            "minProperties": st.integers(0, 2), "maxProperties": st.integers(1, 3),
            "dependentRequired": st.dictionaries(names, st.lists(names, max_size=1), max_size=1)}),
        st.fixed_dictionaries({}, optional={
            "items": inner, "prefixItems": st.lists(inner, max_size=2), "minItems": st.integers(0, 2),
            "maxItems": st.integers(1, 3), "contains": inner}),
        st.builds(lambda k, xs: {k: xs}, st.sampled_from(["allOf", "anyOf", "oneOf"]),
                  st.lists(inner, min_size=1, max_size=2)),
        st.builds(lambda x: {"not": x}, inner),
        st.builds(lambda c, t, e: {"if": c, "then": t, "else": e}, inner, inner, inner),
    )


SCHEMAS = st.recursive(_leaf_schemas(), _extend, max_leaves=4)


@settings(max_examples=800, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(schema=SCHEMAS, values=st.lists(VALUES, min_size=4, max_size=8), infer_types=st.booleans())
def test_random_schemas_agree_with_the_reference(schema: Any, values: list[Any], infer_types: bool,
                                                 vocab: Vocabulary) -> None:
    try:
        grammar = compile_json_schema(schema, vocab, infer_types=infer_types)
    except SchemaError as exc:
        validator = jsonschema.validators.validator_for(schema)(schema, format_checker=jsonschema.FormatChecker())
        if "unsatisfiable" in str(exc):
            valid = [v for v in [*PROBES, *values] if validator.is_valid(v)]
            assert not valid, f"refused as unsatisfiable ({exc}), but {dumps(valid[0])} is valid"
        return
    failures = [why for v in [*PROBES, *values] if (why := disagreement(schema, v, grammar)) is not None]
    assert not failures, (json.dumps(schema), failures)


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(schema=SCHEMAS, seed=st.integers(0, 2**16), infer_types=st.booleans())
def test_random_walks_through_the_grammar_write_valid_values(schema: Any, seed: int, infer_types: bool,
                                                              vocab: Vocabulary) -> None:
    """Texts sampled from the masks (closing brackets favoured so walks end) are JSON the reference accepts,
    unless a relaxation is reported."""
    try:
        grammar = compile_json_schema(schema, vocab, infer_types=infer_types)
    except SchemaError:
        return
    if grammar.relaxations:
        return
    validator = jsonschema.validators.validator_for(schema)(schema)
    rng = np.random.default_rng(seed)
    weights = np.ones(vocab.size)
    weights[[ord(c) for c in '"]}']] = 40.0
    eos = vocab.eos_token_ids[0]
    for _ in range(3):
        m, out = grammar.matcher(), bytearray()
        for _step in range(300):
            allowed = m.allowed_token_ids()
            assert allowed.size, f"dead end after {bytes(out)!r}"
            if eos in allowed and (rng.random() < 0.5 or allowed.size == 1):
                break
            allowed = allowed[allowed != eos]
            tok = int(rng.choice(allowed, p=weights[allowed] / weights[allowed].sum()))
            assert m.advance(tok)
            out += vocab.token_bytes[tok]
        else:
            continue  # too long: not an error, only unfinished
        text = out.decode("utf-8")
        if _loses_precision(text):
            continue  # the reference sees the nearest double, not the number written
        assert validator.is_valid(json.loads(text)), (json.dumps(schema), text)


def _loses_precision(text: str) -> bool:
    exact: list[Decimal] = []
    json.loads(text, parse_float=lambda t: exact.append(Decimal(t)) or 0.0)
    return any(Decimal(repr(float(d))) != d for d in exact)


def test_the_exact_language_is_a_request_option(vocab: Vocabulary) -> None:
    """`SamplingParams(json_schema_infer_types=False)` (native /generate and the OpenAI extension field of the
    same name) compiles the exact language: a schema with only `required` then allows a string, as the
    specification says; by default its type is inferred as object (and reported)."""
    from radixgen.grammars.constraint import Constraint, compile_constraint
    from radixgen.grammars.errors import GrammarError
    from radixgen.runtime.sampling_params import SamplingParams, SamplingParamsError

    schema = {"required": ["a"]}
    inferred = compile_constraint(SamplingParams(json_schema=schema).constraint, vocab)
    exact = compile_constraint(SamplingParams(json_schema=schema, json_schema_infer_types=False).constraint, vocab)
    assert not accepts_text(inferred, '"x"') and accepts_text(exact, '"x"')
    assert accepts_text(inferred, '{"a": 1}') and accepts_text(exact, '{"a": 1}')
    assert not accepts_text(exact, '{"b": 1}')
    assert any("inferred" in n for n in inferred.narrowings)
    assert not any("inferred" in n for n in exact.narrowings)
    with pytest.raises(SamplingParamsError, match="json_schema_infer_types"):
        SamplingParams(json_schema=schema, json_schema_infer_types="no")
    with pytest.raises(GrammarError, match="JSON Schema only"):
        Constraint("regex", "a+", infer_types=False)
