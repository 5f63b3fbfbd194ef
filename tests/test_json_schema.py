"""JSON Schema -> GBNF: hand-written schemas with valid and invalid instances, checked three ways.

* the Lark oracle (`json_schema_oracle`) parses the emitted grammar independently of radixgen's matcher;
* radixgen's own matcher walks the same instances byte by byte (a byte-level vocabulary, so it is fast);
* `jsonschema` confirms each table row is labelled right, so a wrong expectation cannot hide a bug.
Instances are serialised the way the compact policy emits them: `json.dumps(value, ensure_ascii=False)`.
"""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
from json_schema_oracle import accepts

from radixgen.grammars.json_schema import SchemaError, compile_json_schema, json_schema_to_ebnf
from radixgen.grammars.json_schema_formats import integer_range, number_range
from radixgen.grammars.json_schema_regex import pattern_to_regex
from radixgen.grammars.vocabulary import Vocabulary

FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
DRAFT4 = "http://json-schema.org/draft-04/schema#"


def dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


@pytest.fixture(scope="module")
def byte_vocab() -> Vocabulary:
    """256 one-byte tokens, a few multi-byte ones (so tokens cross grammar boundaries), and EOS."""
    tokens = [bytes([b]) for b in range(256)] + [b'": ', b'", "', b"true", b"null", b'{"', b"<eos>"]
    return Vocabulary(tokens, eos_token_ids=[len(tokens) - 1], special_ids=[len(tokens) - 1])


def matcher_accepts(grammar, text: str) -> bool:
    m = grammar.matcher()
    return all(m.advance(b) for b in text.encode("utf-8")) and m.is_accepting()


# (name, schema, valid instances, invalid instances)
CASES = [
    ("types", {"type": ["integer", "null"]}, [0, -7, 12, None], [1.5, "1", True, []]),
    ("boolean-const", {"const": True}, [True], [False, 1]),
    ("enum-mixed", {"enum": ["a", 1, None, {"k": [1, 2]}]}, ["a", 1, None, {"k": [1, 2]}], ["b", 2, {"k": []}]),
    ("enum-filtered-by-type", {"type": "string", "enum": ["x", 3]}, ["x"], [3]),
    ("object", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                "required": ["a"], "additionalProperties": False},
     [{"a": 1}, {"a": 1, "b": "x"}], [{}, {"b": "x"}, {"a": 1, "c": 2}, {"a": "1"}]),
    ("optional-only", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                                        "c": {"type": "integer"}},
                       "additionalProperties": False},
     [{}, {"a": 1}, {"b": 2}, {"c": 3}, {"a": 1, "c": 3}, {"a": 1, "b": 2, "c": 3}], [{"d": 1}, {"a": "x"}]),
    ("additional-schema", {"type": "object", "properties": {"a": {"type": "integer"}},
                           "additionalProperties": {"type": "boolean"}},
     [{"a": 1, "x": True}, {"y": False}, {}], [{"x": 1}, {"a": True}]),
    ("additional-default", {"type": "object", "properties": {"a": {"type": "integer"}}},
     [{"a": 1, "zz": [1, {"q": None}]}, {"ab": 1}, {"": 2}], [{"a": "no"}]),
    ("pattern-properties", {"type": "object", "patternProperties": {"^x-": {"type": "integer"}},
                            "additionalProperties": False},
     [{}, {"x-a": 1, "x-b": 2}], [{"y": 1}, {"x-a": "s"}]),
    ("array", {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
     [[1], [1, 2, 3]], [[], [1, 2, 3, 4], ["a"]]),
    ("prefix-items", {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
                      "items": False},
     [[], ["a"], ["a", 1]], [[1], ["a", 1, 2]]),
    ("draft4-tuple", {"$schema": DRAFT4, "type": "array", "items": [{"type": "string"}],
                      "additionalItems": {"type": "integer"}, "minItems": 2},
     [["a", 1], ["a", 1, 2]], [["a"], ["a", "b"]]),
    ("string-length", {"type": "string", "minLength": 2, "maxLength": 3},
     ["ab", "abc", "é\n", 'a"'], ["a", "abcd", ""]),
    ("string-length-long", {"type": "string", "minLength": 17, "maxLength": 20},
     ["a" * 17, "é" * 20, "\n" * 18], ["a" * 16, "a" * 21]),
    ("pattern-anchored", {"type": "string", "pattern": "^[a-z]+-[0-9]{2}$"}, ["ab-12"], ["ab-1", "Ab-12", "x ab-12"]),
    ("pattern-search", {"type": "string", "pattern": "ab?c"}, ["ac", "xxabcxx", "ac\n"], ["ab", ""]),
    ("pattern-alternation", {"type": "string", "pattern": "^a|b$"}, ["ax", "xb", "ab"], ["xa", "bx"]),
    ("pattern-escapes", {"type": "string", "pattern": '^[\\s"\\\\]+$'}, [' "\\\t'], ["a"]),
    ("integer-range", {"type": "integer", "minimum": -15, "exclusiveMaximum": 120},
     [-15, 0, 7, 119], [-16, 120, 1000, 1.5]),
    ("number-range", {"type": "number", "minimum": 0, "maximum": 10}, [0, 0.5, 10, 10.0, 3], [-1, 10.5, -0.5]),
    ("draft4-exclusive", {"$schema": DRAFT4, "type": "number", "minimum": 0, "exclusiveMinimum": True},
     [0.001, 3], [0, -2]),
    ("format-date", {"type": "string", "format": "date"}, ["2024-02-29", "2023-12-31"],
     ["2023-02-29", "2023-13-01", "2023-1-01"]),
    ("format-date-time", {"type": "string", "format": "date-time"}, ["2024-01-01T10:20:30Z",
                                                                      "2024-01-01T10:20:30.5+01:00"],
     ["2024-01-01 10:20", "2024-01-01T25:00:00Z"]),
    ("format-uuid", {"type": "string", "format": "uuid"}, ["123e4567-e89b-12d3-a456-426614174000"],
     ["123e4567e89b12d3a456426614174000"]),
    ("format-ipv4", {"type": "string", "format": "ipv4"}, ["192.168.0.1", "0.0.0.0"], ["256.1.1.1", "1.2.3"]),
    ("format-ipv6", {"type": "string", "format": "ipv6"}, ["::1", "2001:db8::8a2e:370:7334", "::ffff:1.2.3.4"],
     ["1::2::3", "12345::"]),
    ("format-email", {"type": "string", "format": "email"}, ["a.b@example.com"], ["no-at-sign"]),
    ("format-hostname", {"type": "string", "format": "hostname"}, ["example.com", "a-b.c"], ["-a.com", "a..b"]),
    ("format-uri", {"type": "string", "format": "uri"}, ["https://example.com/a?b=c#d", "urn:isbn:123"],
     ["not a uri", "http://%zz"]),
    ("anyOf", {"anyOf": [{"type": "string", "maxLength": 1}, {"type": "integer", "minimum": 5}]},
     ["a", 5, 99], ["ab", 4, None]),
    ("oneOf-disjoint", {"oneOf": [{"type": "string"}, {"type": "boolean"}]}, ["x", False], [1]),
    ("allOf-merge", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                               {"properties": {"a": {"minimum": 3}, "b": {"type": "string"}}}]},
     [{"a": 3}, {"a": 4, "b": "x"}], [{"a": 2}, {"b": "x"}, {"a": 3, "b": 1}]),
    ("allOf-with-anyOf", {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"],
                          "anyOf": [{"properties": {"kind": {"const": "a"}}},
                                    {"properties": {"kind": {"const": "b"}}}]},
     [{"kind": "a"}, {"kind": "b"}], [{"kind": "c"}]),
    ("refs-recursive", {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
     [{"v": 1}, {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}], [{"v": 1, "kids": [{}]}, {"kids": []}]),
    ("ref-root", {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"$ref": "#"}]}},
     [[], [1, [2, [3]]]], [[1, "x"]]),
    ("definitions-pointer-escapes", {"definitions": {"a/b": {"type": "integer"}},
                                     "properties": {"x": {"$ref": "#/definitions/a~1b"}}},
     [{"x": 1}], [{"x": "1"}]),
    ("nullable", {"type": "string", "nullable": True}, ["s", None], [1]),
    ("boolean-schemas", {"type": "object", "properties": {"a": True, "b": False}, "additionalProperties": False},
     [{}, {"a": [1]}], [{"b": 1}]),
    ("not-type", {"not": {"type": ["string", "object"]}}, [1, None, [], True], ["s", {}]),
    ("any", {}, [1, "x", None, {"a": [1, {"b": []}]}, [], {}], []),
    ("string-escapes", {"type": "string"}, ['q"q', "back\\slash", "tab\tnew\nline", "\u0001", "é日本"], []),
    ("min-max-properties", {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1,
                            "maxProperties": 2},
     [{"a": 1}, {"a": 1, "b": 2}], [{}, {"a": 1, "b": 2, "c": 3}]),
]


@pytest.mark.parametrize("name,schema,valid,invalid", CASES, ids=[c[0] for c in CASES])
def test_table(name, schema, valid, invalid, byte_vocab):
    validator = jsonschema.validators.validator_for(schema)(schema, format_checker=FORMAT_CHECKER)
    # jsonschema cannot judge OpenAPI's `nullable`, nor formats whose optional checker is not installed.
    reference = name != "nullable" and schema.get("format", "date") in FORMAT_CHECKER.checkers
    conv = json_schema_to_ebnf(schema)
    assert conv.relaxations == (), conv.relaxations
    grammar = compile_json_schema(schema, byte_vocab)
    for value in valid:
        assert not reference or validator.is_valid(value), f"table error: {value!r} is not valid"
        assert accepts(conv.ebnf, dumps(value)), f"oracle rejects valid {dumps(value)}\n{conv.ebnf}"
        assert matcher_accepts(grammar, dumps(value)), f"matcher rejects valid {dumps(value)}"
    for value in invalid:
        assert not reference or not validator.is_valid(value), f"table error: {value!r} is valid"
        assert not accepts(conv.ebnf, dumps(value)), f"oracle accepts invalid {dumps(value)}\n{conv.ebnf}"
        assert not matcher_accepts(grammar, dumps(value)), f"matcher accepts invalid {dumps(value)}"


def test_compact_separators_are_json_dumps_defaults():
    conv = json_schema_to_ebnf({"type": "object", "properties": {"a": {"type": "array"}}})
    assert accepts(conv.ebnf, '{"a": [1, 2]}')
    assert not accepts(conv.ebnf, '{"a":[1,2]}')
    assert not accepts(conv.ebnf, '{ "a": [1, 2] }')


def test_flexible_whitespace_accepts_pretty_printing(byte_vocab):
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object"}}},
              "required": ["a"]}
    value = {"a": [{"x": 1}, {}]}
    conv = json_schema_to_ebnf(schema, whitespace="flexible", max_whitespace=8)
    grammar = compile_json_schema(schema, byte_vocab, whitespace="flexible", max_whitespace=8)
    for text in (json.dumps(value, indent=2), json.dumps(value, separators=(",", ":")), dumps(value)):
        assert accepts(conv.ebnf, text), text
        assert matcher_accepts(grammar, text), text
    too_long = '{"a":' + " " * 9 + "[]}"  # whitespace runs are bounded
    assert not accepts(conv.ebnf, too_long) and not matcher_accepts(grammar, too_long)


def test_strict_forbids_unmentioned_properties():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert accepts(json_schema_to_ebnf(schema).ebnf, '{"a": 1, "b": 2}')
    assert not accepts(json_schema_to_ebnf(schema, strict=True).ebnf, '{"a": 1, "b": 2}')


def test_extra_keys_never_repeat_declared_names():
    """An extra property spelled like a declared one would escape the declared schema: refused."""
    conv = json_schema_to_ebnf({"type": "object", "properties": {"ab": {"type": "integer"}}})
    assert not accepts(conv.ebnf, '{"ab": 1, "ab": "x"}')
    assert not accepts(conv.ebnf, '{"ab": "x"}')
    for key in ("a", "abc", "b", "aB"):
        assert accepts(conv.ebnf, f'{{"ab": 1, "{key}": "x"}}'), key


def test_many_optional_properties_stay_linear():
    names = [f"p{i}" for i in range(40)]
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in names},
              "required": names[20:21], "additionalProperties": False}
    conv = json_schema_to_ebnf(schema)
    assert len(conv.ebnf) < 12_000
    rng = random.Random(0)
    for _ in range(10):
        chosen = sorted(set(rng.sample(names, 8)) | {"p20"}, key=names.index)
        assert accepts(conv.ebnf, dumps({n: 1 for n in chosen}))
    assert not accepts(conv.ebnf, dumps({"p1": 1}))
    assert not accepts(conv.ebnf, dumps({"p21": 1, "p20": 1}))  # declared order


@pytest.mark.parametrize("schema,fragment", [
    ({"type": "string", "pattern": "(?=a)b"}, "(lookaround) relaxed to any string at /"),
    ({"properties": {"x": {"type": "string", "pattern": "(a)\\1"}}},
     "(backreference) relaxed to any string at /properties/x"),
    ({"type": "string", "format": "color"}, "format 'color' not enforced"),
    ({"type": "number", "minimum": 0.5}, "widened"),
    ({"not": {"multipleOf": 3}}, "`not`"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"oneOf": [{"type": "integer"}, {"minimum": 3}]}, "oneOf enforced as anyOf"),
    ({"type": "integer", "multipleOf": 7919}, "multipleOf"),
    ({"type": "string", "maxLength": 1_000_000}, "maximum 1000000 above 4096 not enforced"),
    ({"type": "array", "minItems": 5000}, "minimum 5000 enforced as 4096"),
    ({"type": "string", "pattern": "^a{1,1000}$"}, "repetition bound above 256"),
])
def test_relaxations_are_reported(schema, fragment):
    relaxations = json_schema_to_ebnf(schema).relaxations
    assert any(fragment in r for r in relaxations), relaxations


@pytest.mark.parametrize("schema,fragment", [
    ({"type": []}, "empty type"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "empty integer range"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "disjoint types"),
    ({"properties": {"a": {"$ref": "other.json#/x"}}}, "/properties/a: $ref"),
    ({"$ref": "#/definitions/missing"}, "does not resolve"),
    ({"type": "object", "required": ["a"], "additionalProperties": False}, "required property 'a'"),
    (False, "false schema"),
    ("{not json", "not valid JSON"),
    ({"type": "object", "properties": {"x": {"type": "int"}}}, "/properties/x: unknown type(s) ['int']"),
])
def test_schema_errors(schema, fragment):
    with pytest.raises(SchemaError, match=re.escape(fragment)):
        json_schema_to_ebnf(schema)


def test_schema_error_is_a_value_error():
    assert issubclass(SchemaError, ValueError)


@pytest.mark.parametrize("lo,hi", [(0, 0), (5, 123), (-17, 3), (-250, -3), (None, -5), (7, None), (None, None),
                                   (199, 2001)])
def test_integer_range_regex_is_exact(lo, hi):
    r = re.compile(integer_range(lo, hi))
    for x in range(-3000, 3000):
        expected = (lo is None or x >= lo) and (hi is None or x <= hi)
        assert bool(r.fullmatch(str(x))) == expected, x
    assert not r.fullmatch("007") and not r.fullmatch("-0")


@pytest.mark.parametrize("bounds", [(0, False, None, False), (0, True, None, False), (-3, False, 5, True),
                                    (None, False, 0, True), (-10, True, -2, False), (2, False, 2, False)])
def test_number_range_regex_is_exact_for_integer_bounds(bounds):
    lo, lo_excl, hi, hi_excl = bounds
    regex, exact = number_range(lo, lo_excl, hi, hi_excl)
    assert exact
    r = re.compile(regex)
    for whole in range(13):
        for frac in ("", ".0", ".5", ".00", ".25", ".0001"):
            for sign in ("", "-"):
                text = f"{sign}{whole}{frac}"
                x = float(text)
                ok = ((lo is None or (x > lo if lo_excl else x >= lo))
                      and (hi is None or (x < hi if hi_excl else x <= hi)))
                if r.fullmatch(text):
                    assert ok, text
                elif ok:
                    assert text.startswith("-0"), text  # -0 spellings are the one thing left out


@pytest.mark.parametrize("pattern", ["^\\d{2,3}$", "[^a-c]x", "^(ab|cd)*$", "a.c", "^\\w+@\\w+$", "^[^\\s]+$",
                                     "colou?r", "^$", "(?s)^a.b$", "^[\\-\\]]$", ".*", ".*b.*", "^.*x$"])
def test_pattern_translation_matches_re_search(pattern):
    body = re.compile(pattern_to_regex(pattern))
    probes = ["", "12", "123", "1234", "ax", "dx", "abab", "abcd", "abc", "a\nc", "a_1@b2", "a b", "color",
              "colour", "x", "a\nb", "-", "]", 'q"', "\\"]
    for text in probes:
        encoded = json.dumps(text, ensure_ascii=False)[1:-1]
        assert bool(body.fullmatch(encoded)) == bool(re.search(pattern, text)), (pattern, text)


def test_compile_json_schema_attaches_relaxations(byte_vocab):
    strict = compile_json_schema({"type": "integer"}, byte_vocab)
    relaxed = compile_json_schema({"type": "integer", "not": {"multipleOf": 3}}, byte_vocab)
    assert strict.relaxations == ()
    assert relaxed.relaxations and "`not`" in relaxed.relaxations[0]
    assert strict.relaxations == ()  # the shared compiled grammar is not mutated


RANDOM_WALK_SCHEMAS = [c[1] for c in CASES if c[0] in (
    "object", "optional-only", "additional-schema", "array", "prefix-items", "string-length", "integer-range",
    "number-range", "format-date", "format-ipv4", "anyOf", "allOf-merge", "refs-recursive", "enum-mixed",
    "pattern-anchored", "min-max-properties")]


@pytest.mark.parametrize("schema", RANDOM_WALK_SCHEMAS)
def test_random_walks_produce_valid_json(schema, byte_vocab):
    """Sample tokens from the mask until EOS: the text always parses and validates (never a dead end)."""
    import numpy as np

    from radixgen.grammars import unpack_bitmask

    grammar = compile_json_schema(schema, byte_vocab)
    validator = jsonschema.validators.validator_for(schema)(schema, format_checker=FORMAT_CHECKER)
    eos = byte_vocab.size - 1
    rng = np.random.default_rng(0)
    weights = np.ones(byte_vocab.size)
    weights[[ord(c) for c in '"]}']] = 30.0  # favour closing so walks end
    row = np.zeros(byte_vocab.mask_words, dtype=np.int32)
    done = 0
    for _ in range(25):
        m = grammar.matcher()
        out = bytearray()
        for _step in range(400):
            m.fill_mask(row)
            allowed = np.flatnonzero(unpack_bitmask(row, byte_vocab.size))
            assert allowed.size, f"empty mask after {bytes(out)!r}"
            if eos in allowed and (rng.random() < 0.5 or allowed.size == 1):
                break
            p = weights[allowed] / weights[allowed].sum()
            tok = int(rng.choice(allowed, p=p))
            if tok == eos:
                break
            assert m.advance(tok)
            out += byte_vocab.token_bytes[tok]
        else:
            continue  # too long: not an error, just not finished
        value = json.loads(out.decode("utf-8"))
        assert validator.is_valid(value), out
        done += 1
    assert done >= 5


def test_compile_constraint_reports_relaxations_on_the_result(byte_vocab):
    from radixgen.grammars import Constraint, GrammarError, compile_constraint

    relaxed = compile_constraint(Constraint("json_schema", '{"type":"integer","not":{"multipleOf":3}}'), byte_vocab)
    plain = compile_constraint(Constraint("json_schema", '{"type":"integer"}'), byte_vocab)
    assert relaxed.relaxations and "`not`" in relaxed.relaxations[0] and plain.relaxations == ()
    assert compile_json_schema({"type": "integer"}, byte_vocab) is plain  # one cache for both entry points
    with pytest.raises(GrammarError, match="constraint kind"):
        Constraint("sql", "select 1")  # type: ignore[arg-type]
