"""Schema algebra for the JSON Schema compiler: normalising drafts, `$ref` lookup, and merging `allOf`.

Pure functions over plain dicts; the converter (`json_schema.py`) decides what becomes grammar. A merge
returns a schema accepting exactly the instances both inputs accept wherever it can (types intersect, bounds
tighten, patterns accumulate, properties combine with each side's `additionalProperties` and
`patternProperties`); where it cannot (two different `format`s, two `contains`), it keeps one side and says so
through `relax`.

Normal form (what `normalize` returns, and what the converter's internal keywords extend): `type` a list,
`const` folded into `enum`, `pattern` a tuple of patterns (all must match), tuple `items` as `prefixItems`,
draft-07 `dependencies` split into `dependentRequired` / `dependentSchemas`, keywords the document's draft does
not define dropped. The internal keywords `NOT_ENUM`, `NOT_PATTERNS` and `NOT_INTEGER` carry what a negation
excludes (json_schema_negate.py).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any
from urllib.parse import unquote

Schema = dict[str, Any] | bool

ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "example", "$schema", "$id", "id", "$comment", "$anchor",
    "$dynamicAnchor", "$vocabulary", "readOnly", "writeOnly", "deprecated", "contentMediaType",
    "contentEncoding", "contentSchema", "discriminator", "xml", "externalDocs", "$defs", "definitions",
})
OBJECT_KEYWORDS = frozenset({
    "properties", "required", "additionalProperties", "patternProperties", "minProperties", "maxProperties",
    "propertyNames", "dependencies", "dependentRequired", "dependentSchemas", "unevaluatedProperties",
})
ARRAY_KEYWORDS = frozenset({
    "items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains",
    "minContains", "maxContains", "unevaluatedItems",
})
STRING_KEYWORDS = frozenset({"minLength", "maxLength", "pattern", "format"})
NUMBER_KEYWORDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
APPLICATORS = frozenset({"$ref", "allOf", "anyOf", "oneOf"})
JSON_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")

# Internal keywords (never in a user's schema): values a negation excludes, patterns a string must not match,
# numbers that must not be integers.
NOT_ENUM = "$$notEnum"
NOT_PATTERNS = "$$notPatterns"
NOT_INTEGER = "$$notInteger"
INTERNAL = frozenset({NOT_ENUM, NOT_PATTERNS, NOT_INTEGER})

# Keywords a draft does not define (so its validators ignore them), by the last draft without them.
_NOT_IN_DRAFT: dict[str, int] = {
    "const": 4, "contains": 4, "propertyNames": 4, "examples": 4, "if": 6, "then": 6, "else": 6,
    "dependentRequired": 7, "dependentSchemas": 7, "unevaluatedProperties": 7, "unevaluatedItems": 7,
    "minContains": 7, "maxContains": 7, "$recursiveRef": 7, "prefixItems": 2019, "$dynamicRef": 2019,
}


class Unsatisfiable(ValueError):
    """No instance can satisfy the (sub)schema; anyOf branches raising it are dropped."""


def canonical(value: Any) -> str:
    """A key that identifies a JSON value as JSON Schema compares them (object key order ignored, 1.0 == 1)."""
    return json.dumps(_integral(value), sort_keys=True, ensure_ascii=False, default=str)


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_integral(v) for v in value]
    return value


def is_trivial(schema: Schema) -> bool:
    """True when the schema accepts every JSON value."""
    if schema is True:
        return True
    return isinstance(schema, dict) and all(not constrains(k, v) for k, v in schema.items())


def constrains(key: str, value: Any) -> bool:
    """Whether keyword `key` with `value` restricts instances at all (also: whether it implies a type).

    `additionalProperties: true`, `items: {}`, `required: []` and unknown keys constrain nothing.
    """
    if key in ANNOTATIONS or key not in _KNOWN:
        return False
    if key in _SCHEMA_VALUED:
        return not (value is True or value == {})
    if key in ("properties", "patternProperties", "required", "dependencies", "dependentRequired",
               "dependentSchemas"):
        return bool(value)
    return True


_SCHEMA_VALUED = frozenset({"additionalProperties", "items", "additionalItems", "unevaluatedProperties",
                            "unevaluatedItems", "propertyNames"})


_KNOWN = (OBJECT_KEYWORDS | ARRAY_KEYWORDS | STRING_KEYWORDS | NUMBER_KEYWORDS | APPLICATORS | INTERNAL
          | {"type", "enum", "const", "nullable", "not", "if", "then", "else", "$dynamicRef", "$recursiveRef"})


def normalize(schema: dict[str, Any], draft: int = 2020) -> dict[str, Any]:
    """Draft-4..2020-12 and OpenAPI spellings -> the normal form (module docstring): `const` -> `enum`, boolean
    exclusive bounds -> numbers, tuple `items` -> `prefixItems`, `type` -> list, `nullable` -> "null" type,
    `dependencies` -> `dependentRequired` / `dependentSchemas`, keywords `draft` does not define dropped."""
    s = {k: v for k, v in schema.items() if _NOT_IN_DRAFT.get(k, 0) < draft}
    if isinstance(s.get("pattern"), str):
        s["pattern"] = (s["pattern"],)
    if "dependencies" in s:
        deps = s.pop("dependencies")
        if isinstance(deps, dict):
            for name, dep in deps.items():
                key = "dependentRequired" if isinstance(dep, list) else "dependentSchemas"
                s[key] = {**s.get(key, {}), name: dep}
    if "const" in s:
        const = s.pop("const")
        if "enum" in s:
            s["enum"] = [v for v in s["enum"] if canonical(v) == canonical(const)]
        else:
            s["enum"] = [const]
    for bound, excl in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(s.get(excl), bool) and s.pop(excl) and bound in s:
            s[excl] = s.pop(bound)
    if isinstance(s.get("items"), list):
        s["prefixItems"] = s.pop("items")
        if "additionalItems" in s:
            s["items"] = s.pop("additionalItems")
    else:
        s.pop("additionalItems", None)  # ignored unless items is a tuple
    if isinstance(s.get("type"), str):
        s["type"] = [s["type"]]
    if s.pop("nullable", False) is True:
        if "type" in s and "null" not in s["type"]:
            s["type"] = [*s["type"], "null"]
        if "enum" in s and None not in s["enum"]:
            s["enum"] = [*s["enum"], None]
    return s


def json_pointer_get(root: Any, pointer: str) -> Any:
    """Follow an RFC 6901 pointer ("/a/b~1c/0") from `root`; KeyError when it leads nowhere."""
    node = root
    if not pointer:
        return node
    for raw in pointer.lstrip("/").split("/"):
        token = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, list):
            node = node[int(token)]
        elif isinstance(node, dict):
            node = node[token]
        else:
            raise KeyError(pointer)
    return node


def merge(a: dict[str, Any], b: dict[str, Any], relax: Callable[[str], None]) -> dict[str, Any]:
    """allOf of two normalised schemas without `$ref`/`allOf` at the top, as one schema."""
    out: dict[str, Any] = {k: v for k, v in a.items() if k not in _MERGED}
    for k, v in b.items():
        if k not in _MERGED and k not in out:
            out[k] = v
    _merge_types(a, b, out)
    _merge_enums(a, b, out)
    for key, pick in (("minimum", max), ("exclusiveMinimum", max), ("maximum", min),
                      ("exclusiveMaximum", min), ("minLength", max), ("maxLength", min), ("minItems", max),
                      ("maxItems", min), ("minProperties", max), ("maxProperties", min)):
        values = [x[key] for x in (a, b) if key in x]
        if values:
            out[key] = pick(values)
    for key in ("format", "multipleOf"):
        values = [x[key] for x in (a, b) if key in x]
        if values:
            out[key] = values[0]
            if len(values) == 2 and values[0] != values[1]:
                if key == "multipleOf":
                    out[key] = _lcm(values[0], values[1])
                else:
                    relax(f"allOf with two different `{key}`s: only {values[0]!r} is enforced")
    for key in ("pattern", NOT_PATTERNS, NOT_ENUM):
        if key in a or key in b:
            out[key] = list({canonical(v): v for x in (a, b) for v in x.get(key, ())}.values())
            if key == "pattern":
                out[key] = tuple(out[key])
    for key in set(a) & set(b) - _MERGED:
        if canonical(a[key]) != canonical(b[key]):
            out[key] = _merge_other(key, a[key], b[key], relax)
    if "required" in a or "required" in b:
        out["required"] = list(dict.fromkeys([*a.get("required", []), *b.get("required", [])]))
    _merge_properties(a, b, out, relax)
    _merge_arrays(a, b, out)
    for key in ("anyOf", "oneOf"):
        if key in a and key in b:
            out["anyOf" if key == "oneOf" else key] = [{"allOf": [x, y]} for x in a[key] for y in b[key]]
        elif key in a or key in b:
            out[key] = (a if key in a else b)[key]
    return out


_MERGED = frozenset({
    "type", "enum", "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "minLength", "maxLength",
    "minItems", "maxItems", "minProperties", "maxProperties", "pattern", "format", "multipleOf", "required",
    "properties", "additionalProperties", "patternProperties", "prefixItems", "items", "anyOf", "oneOf",
    NOT_PATTERNS, NOT_ENUM,
})


def _merge_other(key: str, x: Any, y: Any, relax: Callable[[str], None]) -> Any:
    """Two different values of a keyword `merge` has no rule above for."""
    if key == "propertyNames":
        return _all_of([x, y])
    if key == "uniqueItems":
        return bool(x) or bool(y)
    if key == "not":
        return {"anyOf": [x, y]}
    if key == "dependentRequired":
        return {n: list(dict.fromkeys([*x.get(n, []), *y.get(n, [])])) for n in dict.fromkeys([*x, *y])}
    if key == "dependentSchemas":
        return {n: _all_of([s for s in (x.get(n), y.get(n)) if s is not None]) for n in dict.fromkeys([*x, *y])}
    if key == NOT_INTEGER:
        return True
    relax(f"allOf with two different `{key}`s: only the first is enforced")
    return x


def _lcm(x: Any, y: Any) -> Any:
    """The least common multiple of two positive decimals (an int when both are ints)."""
    if isinstance(x, int) and isinstance(y, int):
        return math.lcm(x, y)
    fx, fy = Fraction(str(x)), Fraction(str(y))
    value = Fraction(math.lcm(fx.numerator, fy.numerator), math.gcd(fx.denominator, fy.denominator))
    return int(value) if value.denominator == 1 else Decimal(value.numerator) / Decimal(value.denominator)


def _merge_types(a: dict[str, Any], b: dict[str, Any], out: dict[str, Any]) -> None:
    if "type" not in a and "type" not in b:
        return
    ta = set(a.get("type", JSON_TYPES))
    tb = set(b.get("type", JSON_TYPES))
    both = ta & tb
    if ("number" in ta and "integer" in tb) or ("integer" in ta and "number" in tb):
        both.add("integer")
    if not both:
        raise Unsatisfiable(f"allOf of disjoint types {sorted(ta)} and {sorted(tb)}")
    out["type"] = [t for t in JSON_TYPES if t in both]


def _merge_enums(a: dict[str, Any], b: dict[str, Any], out: dict[str, Any]) -> None:
    if "enum" in a and "enum" in b:
        keys = {canonical(v) for v in b["enum"]}
        out["enum"] = [v for v in a["enum"] if canonical(v) in keys]
        if not out["enum"]:
            raise Unsatisfiable("allOf of disjoint enums")
    elif "enum" in a or "enum" in b:
        out["enum"] = (a if "enum" in a else b)["enum"]


def _schema_for_key(s: dict[str, Any], name: str) -> Schema | None:
    """What `s` demands of the value under `name` (None: nothing) by `properties`, else by
    `additionalProperties` when none of its `patternProperties` matches (patterns are combined by the
    converter)."""
    props: dict[str, Schema] = s.get("properties", {})
    if name in props:
        return props[name]
    if any(_searches(pat, name) for pat in s.get("patternProperties", {})):
        return None
    additional: Schema | None = s.get("additionalProperties")
    return additional


def _searches(pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return False


def _all_of(parts: list[Schema]) -> Schema:
    parts = list({id(p): p for p in parts if p is not True and p != {}}.values())
    if any(p is False for p in parts):
        return False
    if not parts:
        return True
    return parts[0] if len(parts) == 1 else {"allOf": parts}


def _merge_properties(a: dict[str, Any], b: dict[str, Any], out: dict[str, Any], relax: Callable[[str], None]) -> None:
    names = list(dict.fromkeys([*a.get("properties", {}), *b.get("properties", {})]))
    if names:
        props = {}
        for name in names:
            parts = [_schema_for_key(x, name) for x in (a, b)]
            props[name] = _all_of([p for p in parts if p is not None])
        out["properties"] = props
    extras = [x["additionalProperties"] for x in (a, b) if "additionalProperties" in x]
    if extras:
        out["additionalProperties"] = _all_of(extras)
    pattern_props: dict[str, Any] = {}
    for x, other in ((a, b), (b, a)):
        other_patterns = other.get("patternProperties", {})
        other_extra = other.get("additionalProperties")
        for pat, sub in x.get("patternProperties", {}).items():
            if pat not in other_patterns and other_extra is not None and not is_trivial(other_extra):
                # a key matching only this side's pattern gets the other side's additionalProperties too, unless
                # it matches one of the other side's patterns
                if other_patterns:
                    relax(f"allOf of patternProperties {pat!r} and another part's additionalProperties and "
                          f"patterns: keys matching {pat!r} are not checked against that additionalProperties")
                else:
                    sub = _all_of([sub, other_extra])
            pattern_props[pat] = _all_of([pattern_props[pat], sub]) if pat in pattern_props else sub
    if pattern_props:
        out["patternProperties"] = pattern_props


def _merge_arrays(a: dict[str, Any], b: dict[str, Any], out: dict[str, Any]) -> None:
    la, lb = len(a.get("prefixItems", [])), len(b.get("prefixItems", []))
    if la or lb:
        def item_at(x: dict[str, Any], i: int) -> Schema:
            prefix: list[Schema] = x.get("prefixItems", [])
            item: Schema = prefix[i] if i < len(prefix) else x.get("items", True)
            return item

        out["prefixItems"] = [_all_of([item_at(a, i), item_at(b, i)]) for i in range(max(la, lb))]
    items = [x["items"] for x in (a, b) if "items" in x]
    if items:
        out["items"] = _all_of(items)
