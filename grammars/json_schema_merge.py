"""Schema algebra for the JSON Schema compiler: normalising drafts, `$ref` lookup, and merging `allOf`.

Pure functions over plain dicts; the converter (`json_schema.py`) decides what becomes grammar. A merge
returns a schema accepting exactly the instances both inputs accept wherever it can (types intersect, bounds
tighten, properties combine with each side's `additionalProperties`); where it cannot (two different
`pattern`s), it keeps one side and says so through `relax`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
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


class Unsatisfiable(ValueError):
    """No instance can satisfy the (sub)schema; anyOf branches raising it are dropped."""


def canonical(value: Any) -> str:
    """A key that identifies a JSON value (object key order ignored)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


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


_KNOWN = (OBJECT_KEYWORDS | ARRAY_KEYWORDS | STRING_KEYWORDS | NUMBER_KEYWORDS | APPLICATORS
          | {"type", "enum", "const", "nullable", "not", "if", "then", "else", "$dynamicRef", "$recursiveRef"})


def normalize(schema: dict[str, Any]) -> dict[str, Any]:
    """Draft-4..2020-12 and OpenAPI spellings -> one form: `const` -> `enum`, boolean exclusive bounds ->
    numbers, tuple `items` -> `prefixItems`, `type` -> list, `nullable` -> "null" type."""
    s = dict(schema)
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
    for key in ("pattern", "format", "multipleOf"):
        values = [x[key] for x in (a, b) if key in x]
        if values:
            out[key] = values[0]
            if len(values) == 2 and values[0] != values[1]:
                if key == "multipleOf" and all(isinstance(v, int) for v in values):
                    out[key] = math.lcm(*values)
                else:
                    relax(f"allOf with two different `{key}`s: only {values[0]!r} is enforced")
    if "required" in a or "required" in b:
        out["required"] = list(dict.fromkeys([*a.get("required", []), *b.get("required", [])]))
    _merge_properties(a, b, out)
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
})


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
    """What `s` demands of the value under `name` (None: nothing), by properties / additionalProperties."""
    props: dict[str, Schema] = s.get("properties", {})
    if name in props:
        return props[name]
    additional: Schema | None = s.get("additionalProperties")  # patternProperties are combined by the converter
    return additional


def _all_of(parts: list[Schema]) -> Schema:
    parts = list({id(p): p for p in parts if p is not True and p != {}}.values())
    if any(p is False for p in parts):
        return False
    if not parts:
        return True
    return parts[0] if len(parts) == 1 else {"allOf": parts}


def _merge_properties(a: dict[str, Any], b: dict[str, Any], out: dict[str, Any]) -> None:
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
    for x in (a, b):
        for pat, sub in x.get("patternProperties", {}).items():
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
