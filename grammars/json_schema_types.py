"""Type-level facts about (normalised) schemas: declared and inferred types, bounds, and a cheap disjointness
test for `oneOf`. Pure functions over dicts."""

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
    Schema,
    constrains,
)
from .json_schema_values import type_of

# (value, schema) -> whether the value satisfies the schema (None: cannot tell); see json_schema_values.
Check = Callable[[Any, Schema], "bool | None"]


class UnknownType(ValueError):
    """A `type` value that is not one of the seven JSON types."""


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


def declared_types(s: dict[str, Any]) -> set[str] | None:
    """The types `type` names (None without `type`); "number" includes "integer"."""
    t = s.get("type")
    if t is None:
        return None
    types = {t} if isinstance(t, str) else set(t)
    unknown = types - set(JSON_TYPES)
    if unknown:
        raise UnknownType(f"unknown type(s) {sorted(unknown)}")
    return types | {"integer"} if "number" in types else types


def exact_types(s: dict[str, Any]) -> set[str]:
    """The types instances of `s` may have, by `type` and `enum` alone (every type when neither is given)."""
    declared = declared_types(s)
    types = set(JSON_TYPES) if declared is None else declared
    if "enum" in s:
        types &= {type_of(v) for v in s["enum"]} | ({"number"} if "integer" in types else set())
    return types | {"integer"} if "number" in types else types


def inferred_types(s: dict[str, Any]) -> set[str]:
    """The types whose keywords `s` uses (every type when it uses none): what `infer_types` narrows to."""
    keys = {k for k, v in s.items() if constrains(k, v)}
    types = set()
    if keys & OBJECT_KEYWORDS:
        types.add("object")
    if keys & ARRAY_KEYWORDS:
        types.add("array")
    if keys & STRING_KEYWORDS:
        types.add("string")
    if keys & NUMBER_KEYWORDS:
        types |= {"number", "integer"}
    return types or set(JSON_TYPES)


def generated_types(s: dict[str, Any], infer: bool) -> set[str]:
    """The types the grammar generates for `s`: declared, else inferred (with `infer`) or all."""
    if "type" in s or "enum" in s or not infer:
        return exact_types(s)
    return inferred_types(s)


def disjoint(generated: dict[str, Any], other: dict[str, Any], infer: bool, check: Check) -> bool:
    """Whether no instance the grammar generates for `generated` satisfies `other` (both flattened), by
    types, by enum values the other side rejects, or by a required property whose schemas are disjoint.
    Incomplete: False means "maybe not"."""
    common = generated_types(generated, infer) & exact_types(other)
    if not common:
        return True
    for values, against in ((generated.get("enum"), other), (other.get("enum"), generated)):
        if values is not None and all(check(v, against) is False for v in values):
            return True
    if common != {"object"}:
        return False
    props_g, props_o = generated.get("properties", {}), other.get("properties", {})
    for name in set(generated.get("required", [])) & set(other.get("required", [])):
        pg, po = props_g.get(name, True), props_o.get(name, True)
        for values, against in ((_enum_values(pg), po), (_enum_values(po), pg)):
            if values is not None and all(check(v, against) is False for v in values):
                return True
    return False


def _enum_values(schema: Schema) -> list[Any] | None:
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return [schema["const"]]
    values = schema.get("enum")
    return values if isinstance(values, list) else None


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
