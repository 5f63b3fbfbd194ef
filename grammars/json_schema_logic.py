"""Schema logic rewritten as branches the grammar can take, for the JSON Schema compiler: dependencies become
"absent" or "present with its dependants", `if`/`then`/`else` becomes `if` and `then`, or the complement of `if`
(json_schema_negate.py) and `else`; `not` becomes the complement. And `unevaluated*`, settled once a schema's
applicators are merged. Each rewrite is exact, or relaxed and reported."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .json_schema_merge import Schema, constrains, is_trivial, merge
from .json_schema_report import SchemaError

if TYPE_CHECKING:
    from .json_schema import Converter

MAX_ANY_OF_PRODUCT = 256


def rewrite_logic(conv: Converter, own: dict[str, Any], ptr: str) -> dict[str, Any]:
    """Dependencies, conditionals and `not` as `anyOf` branches merged into `own` (each exact or relaxed)."""
    rewrites: list[tuple[str, list[Schema] | None]] = []  # (what, anyOf branches; None: relaxed)
    required = set(own.get("required", []))
    for name, deps in own.pop("dependentRequired", {}).items():
        deps = [d for d in deps if isinstance(d, str) and d not in required]
        if deps and name in required:
            own = conv.merge(own, {"required": deps}, ptr)
        elif deps:
            rewrites.append((f"dependentRequired {name!r}",
                             [{"properties": {name: False}}, {"required": [name, *deps]}]))
    for name, dep in own.pop("dependentSchemas", {}).items():
        if is_trivial(dep):
            continue
        if name in required:
            rewrites.append((f"dependentSchemas {name!r}", [dep]))
        else:
            rewrites.append((f"dependentSchemas {name!r}",
                             [{"properties": {name: False}}, {"required": [name], "allOf": [dep]}]))
    then, otherwise = own.pop("then", True), own.pop("else", True)
    if "if" in own:
        cond = own.pop("if")
        if not (is_trivial(then) and is_trivial(otherwise)):
            negated = conv.negation(cond, f"{ptr}/if")
            rewrites.append(("`if`/`then`/`else`", None if negated is None else
                             [{"allOf": [cond, then]}, {"allOf": [negated, otherwise]}]))
    if "not" in own:
        negated = conv.negation(own.pop("not"), f"{ptr}/not")
        rewrites.append(("`not`", None if negated is None else [negated]))
    for what, branches in rewrites:
        if branches is None:
            conv.relax(ptr, f"{what} is not enforced")
            continue
        try:
            flat = conv.flatten({"anyOf": branches} if len(branches) > 1 else {"allOf": branches}, ptr)
            merged = merge(own, flat, lambda m: conv.relax(ptr, m))
        except SchemaError:
            merged = None
        if merged is None or len(merged.get("anyOf", ())) > MAX_ANY_OF_PRODUCT:
            conv.relax(ptr, f"{what} is not enforced (too many alternatives)")
            continue
        own = merged
    return own


def settle_unevaluated(conv: Converter, own: dict[str, Any], ptr: str, logic: bool) -> dict[str, Any]:
    """`unevaluatedProperties` / `unevaluatedItems` of a flattened schema: moot next to
    `additionalProperties` / `items`; the same as them with no applicator left; next to `anyOf` they are
    left for each branch (a property then counts as evaluated only by the branch taken: narrowed); next
    to a conditional, `not` or `contains`, relaxed."""
    for keyword, plain, blockers in (("unevaluatedProperties", "additionalProperties", ()),
                                     ("unevaluatedItems", "items", ("contains",))):
        if keyword not in own:
            continue
        value = own.pop(keyword)
        if plain in own or not constrains(keyword, value):
            continue
        if logic or any(b in own for b in blockers):
            conv.relax(ptr, f"{keyword} next to a conditional, `not` or `contains` is not enforced")
        elif "anyOf" in own:
            conv.narrow(ptr, f"{keyword} next to anyOf: a property or item counts as evaluated only by the "
                             f"branch taken")
            own[keyword] = value
        else:
            own[plain] = value
    return own
