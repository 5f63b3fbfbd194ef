"""The complement of a flattened schema as another schema, for `not` and for the `else` side of `if`.

An instance fails `s` when it fails one of its keywords, and a keyword fails only on the instances of the type
it governs: `not {"maxLength": 3}` is every non-string plus the strings of 4 or more characters. So the
complement is an `anyOf` with one branch per keyword, each typed: `minLength n` -> strings of at most n - 1,
`required [a, b]` -> objects without `a` or without `b`, `properties {p: S}` -> objects whose `p` fails `S`
(that `not` is taken lazily, when the branch is converted), `enum` -> the other values of each type
(`NOT_ENUM`), `pattern` -> strings it does not match (`NOT_PATTERNS`), `type: integer` -> non-integral
numbers (`NOT_INTEGER`), `anyOf` -> the `allOf` of the negated branches.

Keywords with no such complement here (`additionalProperties`, `patternProperties`, `propertyNames`,
`uniqueItems`, `multipleOf`, `format`, `contains` with counts, the `unevaluated*`) make `negate` return None;
the caller relaxes.
"""

from __future__ import annotations

from typing import Any

from .json_schema_merge import (
    ANNOTATIONS,
    INTERNAL,
    JSON_TYPES,
    NOT_ENUM,
    NOT_INTEGER,
    NOT_PATTERNS,
    Schema,
    constrains,
)
from .json_schema_values import type_of

_BOUND_COMPLEMENT = {"minimum": "exclusiveMaximum", "exclusiveMinimum": "maximum", "maximum": "exclusiveMinimum",
                     "exclusiveMaximum": "minimum"}
# Keywords read together with another one (their pieces are built there).
_COMPANIONS = frozenset({"items", "minContains", "maxContains", "additionalItems"})


def negate(s: dict[str, Any], draft: int) -> Schema | None:
    """A schema accepting exactly the instances `s` (flattened: no `$ref`, `allOf`, `not`, `if` at the top)
    rejects; None when a keyword of `s` has no complement here."""
    pieces: list[Schema] = []
    for key, value in s.items():
        if key in ANNOTATIONS or (key not in INTERNAL and not constrains(key, value)) or key in _COMPANIONS:
            continue
        piece = _keyword(key, value, s, draft)
        if piece is None:
            return None
        pieces.extend(piece)
    if "items" in s and "prefixItems" not in s and constrains("items", s["items"]):
        if draft < 6:  # no `contains` to say "some item fails"
            return None
        pieces.append({"type": ["array"], "contains": {"not": s["items"]}})
    if not pieces:
        return False
    return pieces[0] if len(pieces) == 1 else {"anyOf": pieces}


def _keyword(key: str, value: Any, s: dict[str, Any], draft: int) -> list[Schema] | None:
    """The instances failing one keyword (a list of schemas to join with anyOf), or None."""
    if key == "type":
        return _other_types(set(value))
    if key == "enum":
        return _other_values(value)
    if key == NOT_ENUM:
        return [{"enum": list(value)}]
    if key == NOT_PATTERNS:
        return [{"type": ["string"], "pattern": (p,)} for p in value]
    if key == NOT_INTEGER:
        return [{"type": ["integer"]}]
    if key == "pattern":
        return [{"type": ["string"], NOT_PATTERNS: [p]} for p in value]
    if key in _BOUND_COMPLEMENT:
        return [{"type": ["number"], _BOUND_COMPLEMENT[key]: value}]
    counted = {"minLength": ("string", "maxLength"), "maxLength": ("string", "minLength"),
               "minItems": ("array", "maxItems"), "maxItems": ("array", "minItems"),
               "minProperties": ("object", "maxProperties"), "maxProperties": ("object", "minProperties")}
    if key in counted:
        t, opposite = counted[key]
        if key.startswith("min"):
            return [{"type": [t], opposite: value - 1}] if value > 0 else []
        return [{"type": [t], opposite: value + 1}]
    if key == "required":
        return [{"type": ["object"], "properties": {name: False}} for name in value]
    if key == "properties":
        return [{"type": ["object"], "required": [name], "properties": {name: {"not": sub}}}
                for name, sub in value.items() if sub is not True and sub != {}]
    if key == "prefixItems":  # tuple form: normalize reads `items` lists in every draft
        out: list[Schema] = [{"type": ["array"], "minItems": i + 1, "items": [True] * i + [{"not": sub}]}
                             for i, sub in enumerate(value) if sub is not True and sub != {}]
        if constrains("items", s.get("items", True)):
            return None  # the items after the tuple would need a `contains` that skips the tuple
        return out
    if key == "contains":
        if "minContains" in s or "maxContains" in s:
            return None
        return [{"type": ["array"], "items": {"not": value}}]
    if key == "anyOf":
        return [{"allOf": [{"not": branch} for branch in value]}]
    return None


def _other_types(types: set[str]) -> list[Schema]:
    covered = types | ({"integer"} if "number" in types else set())
    rest = [t for t in JSON_TYPES if t not in covered and t not in ("number", "integer")]
    out: list[Schema] = [{"type": rest}] if rest else []
    if "number" not in covered:
        out.append({"type": ["number"], NOT_INTEGER: True} if "integer" in covered else {"type": ["number"]})
    return out


def _other_values(values: list[Any]) -> list[Schema] | None:
    by_type: dict[str, list[Any]] = {}
    for v in values:
        t = type_of(v)
        by_type.setdefault("number" if t == "integer" else t, []).append(v)
    if "object" in by_type or "array" in by_type:
        return None
    out: list[Schema] = []
    rest = [t for t in JSON_TYPES if t not in by_type and t != "integer"]
    if rest:
        out.append({"type": rest})
    if "string" in by_type:
        out.append({"type": ["string"], NOT_ENUM: by_type["string"]})
    if "number" in by_type:
        out.append({"type": ["number"], NOT_ENUM: by_type["number"]})
    if "boolean" in by_type and len({bool(v) for v in by_type["boolean"]}) == 1:
        out.append({"enum": [not by_type["boolean"][0]]})
    return out
