"""Whether one JSON value satisfies a schema, decided at conversion time: which `enum` / `const` values the other
keywords allow, whether a declared property name passes `propertyNames`, whether two `oneOf` branches can
share an instance. Three answers: True, False, or None when a keyword is beyond this checker (the caller then
relaxes, or assumes the worst).

Patterns and formats are checked with the regexes the grammar itself uses, so the answer agrees with the
grammar. Subschemas are flattened by the caller's `Flatten` (it resolves `$ref` and merges `allOf`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from .json_schema_formats import FORMATS
from .json_schema_merge import (
    ANNOTATIONS,
    NOT_ENUM,
    NOT_INTEGER,
    NOT_PATTERNS,
    Schema,
    Unsatisfiable,
    canonical,
)
from .json_schema_regex import UnsupportedPattern, pattern_to_regex

# (schema, pointer) -> the flattened schema, or None when flattening it needed a relaxation (not exact).
Flatten = Callable[[Schema, str], "dict[str, Any] | None"]
Verdict = bool | None


def type_of(v: Any, draft: int = 2020) -> str:
    """The JSON type of a Python JSON value; an integral float is an integer from draft 6 on."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() and draft >= 6 else "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def satisfies(value: Any, schema: Schema, flatten: Flatten, draft: int = 2020, depth: int = 0) -> Verdict:
    """Whether `value` satisfies `schema` (any schema: it is flattened first)."""
    if schema is True:
        return True
    if schema is False:
        return False
    if depth > 32:
        return None
    try:
        flat = flatten(schema, "")
    except Unsatisfiable:
        return False
    if flat is None:
        return None
    return _flat(value, flat, flatten, draft, depth)


def satisfies_flat(value: Any, flat: dict[str, Any], flatten: Flatten, draft: int = 2020) -> Verdict:
    """Whether `value` satisfies an already flattened schema."""
    return _flat(value, flat, flatten, draft, 0)


def _all(verdicts: list[Verdict]) -> Verdict:
    if any(v is False for v in verdicts):
        return False
    return None if any(v is None for v in verdicts) else True


def _flat(v: Any, s: dict[str, Any], flatten: Flatten, draft: int, depth: int) -> Verdict:
    def sub(value: Any, schema: Schema) -> Verdict:
        return satisfies(value, schema, flatten, draft, depth + 1)

    t = type_of(v, draft)
    out: list[Verdict] = []
    if "type" in s:
        out.append(t in s["type"] or (t == "integer" and "number" in s["type"]))
    if "enum" in s:
        out.append(canonical(v) in {canonical(e) for e in s["enum"]})
    if NOT_ENUM in s:
        out.append(canonical(v) not in {canonical(e) for e in s[NOT_ENUM]})
    if "anyOf" in s:
        branches = [sub(v, b) for b in s["anyOf"]]
        out.append(True if True in branches else (None if None in branches else False))
    if "not" in s:
        negated = sub(v, s["not"])
        out.append(None if negated is None else not negated)
    if "if" in s:
        cond = sub(v, s["if"])
        out.append(None if cond is None else sub(v, s.get("then" if cond else "else", True)))
    for key in s:
        if key not in ANNOTATIONS and key.startswith("unevaluated"):
            out.append(None)
    if isinstance(v, str):
        out.append(_string(v, s))
    elif t in ("integer", "number"):
        out.append(_number(v, s, t))
    elif isinstance(v, list):
        out.append(_array(v, s, sub))
    elif isinstance(v, dict):
        out.append(_object(v, s, sub))
    return _all(out)


def _string(v: str, s: dict[str, Any]) -> Verdict:
    if len(v) < s.get("minLength", 0) or ("maxLength" in s and len(v) > s["maxLength"]):
        return False
    body = json.dumps(v, ensure_ascii=False)[1:-1]
    out: list[Verdict] = []
    for pattern in s.get("pattern", ()):
        out.append(_matches(pattern, body))
    for pattern in s.get(NOT_PATTERNS, ()):
        m = _matches(pattern, body)
        out.append(None if m is None else not m)
    fmt = s.get("format")
    if fmt in FORMATS:
        out.append(re.fullmatch(FORMATS[fmt], body) is not None)
    return _all(out)


def _matches(pattern: str, body: str) -> Verdict:
    try:
        return re.fullmatch(pattern_to_regex(pattern), body) is not None
    except (UnsupportedPattern, re.error):
        return None


def _number(v: int | float, s: dict[str, Any], t: str) -> Verdict:
    x = Decimal(v) if isinstance(v, int) else Decimal(repr(v))
    for key, ok in (("minimum", lambda b: x >= b), ("exclusiveMinimum", lambda b: x > b),
                    ("maximum", lambda b: x <= b), ("exclusiveMaximum", lambda b: x < b)):
        if key in s and not ok(Decimal(str(s[key]))):
            return False
    if s.get(NOT_INTEGER) and t == "integer":
        return False
    if "multipleOf" in s:
        try:
            if x % Decimal(str(s["multipleOf"])) != 0:
                return False
        except InvalidOperation:
            return None
    return True


def _array(v: list[Any], s: dict[str, Any], sub: Callable[[Any, Schema], Verdict]) -> Verdict:
    if len(v) < s.get("minItems", 0) or ("maxItems" in s and len(v) > s["maxItems"]):
        return False
    out: list[Verdict] = []
    prefix = s.get("prefixItems", [])
    for i, item in enumerate(v):
        out.append(sub(item, prefix[i] if i < len(prefix) else s.get("items", True)))
    if "contains" in s:
        hits = [sub(item, s["contains"]) for item in v]
        lo, hi = s.get("minContains", 1), s.get("maxContains")
        if None in hits:
            out.append(None)
        else:
            n = sum(bool(h) for h in hits)
            out.append(n >= lo and (hi is None or n <= hi))
    if s.get("uniqueItems") is True:
        out.append(len({canonical(item) for item in v}) == len(v))
    return _all(out)


def _object(v: dict[str, Any], s: dict[str, Any], sub: Callable[[Any, Schema], Verdict]) -> Verdict:
    if any(name not in v for name in s.get("required", [])):
        return False
    if len(v) < s.get("minProperties", 0) or ("maxProperties" in s and len(v) > s["maxProperties"]):
        return False
    out: list[Verdict] = []
    props = s.get("properties", {})
    patterns = s.get("patternProperties", {})
    for name, value in v.items():
        matched = False
        if name in props:
            matched = True
            out.append(sub(value, props[name]))
        for pat, pat_schema in patterns.items():
            try:
                hit = re.search(pat, name) is not None
            except re.error:
                return None
            if hit:
                matched = True
                out.append(sub(value, pat_schema))
        if not matched and "additionalProperties" in s:
            out.append(sub(value, s["additionalProperties"]))
        if "propertyNames" in s:
            out.append(sub(name, s["propertyNames"]))
    for name, deps in s.get("dependentRequired", {}).items():
        if name in v:
            out.append(all(d in v for d in deps))
    for name, dep_schema in s.get("dependentSchemas", {}).items():
        if name in v:
            out.append(sub(v, dep_schema))
    return _all(out)
