"""Type-level facts about (normalised) schemas: declared and inferred types, enum checks, bounds, and a cheap
disjointness test for `oneOf`. Pure functions over dicts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .json_schema_merge import (
    ANNOTATIONS,
    ARRAY_KEYWORDS,
    JSON_TYPES,
    NUMBER_KEYWORDS,
    OBJECT_KEYWORDS,
    STRING_KEYWORDS,
    canonical,
    constrains,
    normalize,
)


class UnknownType(ValueError):
    """A `type` value that is not one of the seven JSON types."""


def is_trivial_keyword(key: str, value: Any) -> bool:
    """Keywords whose value constrains nothing (`not: false`, empty dependencies, ...)."""
    if key == "not":
        return value is False
    if key in ("dependencies", "dependentRequired", "dependentSchemas"):
        return not value
    return False


def ref_set(schema: Any) -> frozenset[str] | None:
    """The references of a schema that is only `$ref`s combined by (nested) `allOf`, else None."""
    if not isinstance(schema, dict):
        return None
    keys = set(schema) - ANNOTATIONS
    if keys == {"$ref"} and isinstance(schema["$ref"], str):
        return frozenset([schema["$ref"]])
    if keys == {"allOf"} and isinstance(schema["allOf"], list) and schema["allOf"]:
        out: frozenset[str] = frozenset()
        for sub in schema["allOf"]:
            sub_refs = ref_set(sub)
            if sub_refs is None:
                return None
            out |= sub_refs
        return out
    return None


def negated_types(negated: Any) -> set[str] | None:
    """The types a `not` excludes when it is exactly `{"type": ...}` (annotations aside), else None."""
    if not isinstance(negated, dict) or {k for k in negated if constrains(k, negated[k])} != {"type"}:
        return None
    types = declared_types(normalize(negated)) or set()
    return types | {"integer"} if "number" in types else types


def type_matches(value: Any, types: set[str]) -> bool:
    t = type_of(value)
    return t in types or (t == "integer" and "number" in types)


def disjoint(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two normalised schemas provably share no instance (a cheap, incomplete test)."""
    ta, tb = _generated_types(a), _generated_types(b)
    if not ta & tb:
        return True
    if not ta & tb <= {"object"}:
        return False
    if "enum" in a and "enum" in b and not {canonical(v) for v in a["enum"]} & {canonical(v) for v in b["enum"]}:
        return True
    props_a, props_b = a.get("properties", {}), b.get("properties", {})
    for name in set(a.get("required", [])) & set(b.get("required", [])):
        pa, pb = props_a.get(name), props_b.get(name)
        if isinstance(pa, dict) and isinstance(pb, dict) and disjoint(normalize(pa), normalize(pb)):
            return True
    return False


def _generated_types(s: dict[str, Any]) -> set[str]:
    """The types the grammar generates for `s`: declared, else inferred from its keywords; "number" adds "integer"."""
    declared = declared_types(s)
    types = inferred_types(s) if declared is None else declared
    return types | {"integer"} if "number" in types else types


def declared_types(s: dict[str, Any]) -> set[str] | None:
    t = s.get("type")
    if t is None:
        if "enum" in s:
            return {type_of(v) for v in s["enum"]}
        return None
    types = {t} if isinstance(t, str) else set(t)
    unknown = types - set(JSON_TYPES)
    if unknown:
        raise UnknownType(f"unknown type(s) {sorted(unknown)}")
    return types


def inferred_types(s: dict[str, Any]) -> set[str]:
    keys = {k for k, v in s.items() if constrains(k, v)}
    types = set()
    if keys & OBJECT_KEYWORDS:
        types.add("object")
    if keys & ARRAY_KEYWORDS:
        types.add("array")
    if keys & STRING_KEYWORDS:
        types.add("string")
    if keys & NUMBER_KEYWORDS:
        types.add("number")
    return types or set(JSON_TYPES)


def type_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def value_allowed(v: Any, s: dict[str, Any]) -> bool:
    """Whether an enum value meets the scalar keywords beside it (type, bounds, lengths)."""
    if "type" in s:
        t = type_of(v)
        allowed = set(s["type"])
        if not (t in allowed or (t == "integer" and "number" in allowed)):
            return False
    if isinstance(v, str) and (len(v) < s.get("minLength", 0) or len(v) > s.get("maxLength", len(v))):
        return False
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        lo, lo_excl = bound(s, "minimum", "exclusiveMinimum", max)
        hi, hi_excl = bound(s, "maximum", "exclusiveMaximum", min)
        if lo is not None and (v < lo or (lo_excl and v == lo)):
            return False
        if hi is not None and (v > hi or (hi_excl and v == hi)):
            return False
    return not (isinstance(v, list) and (len(v) < s.get("minItems", 0) or len(v) > s.get("maxItems", len(v))))


def bound(
    s: dict[str, Any], inclusive: str, exclusive: str, tighter: Callable[[float, float], float]
) -> tuple[float | None, bool]:
    """The tighter of an inclusive and an exclusive bound: (value, is_exclusive)."""
    inc, exc = s.get(inclusive), s.get(exclusive)
    if inc is None and exc is None:
        return None, False
    if inc is None:
        return exc, True
    if exc is None:
        return inc, False
    return (exc, True) if tighter(inc, exc) == exc else (inc, False)


def ceil_int(x: float) -> int:
    return int(x) if float(x).is_integer() else int(x // 1) + 1


def floor_int(x: float) -> int:
    return int(x // 1)
