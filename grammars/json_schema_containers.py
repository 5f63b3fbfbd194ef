"""Objects and arrays for the JSON Schema compiler: declared properties in order with optional ones skippable
in linear grammar size, extra properties after them (their keys split by the patterns they match), tuple items,
`contains`, and counted repetitions."""

from __future__ import annotations

import json
import re
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from .json_schema_dfa import Dfa, TooComplex, unite
from .json_schema_formats import FORMATS
from .json_schema_keys import key_regions, string_body
from .json_schema_merge import Schema, Unsatisfiable, constrains, is_trivial, merge
from .json_schema_regex import UnsupportedPattern, pattern_to_regex
from .json_schema_text import alternation, escape_pointer, literal, quantifier, rule_hint, terminal

if TYPE_CHECKING:
    from .json_schema import Converter


def array_rule(conv: Converter, s: dict[str, Any], ptr: str) -> str:
    """A rule for the arrays of `s`: tuple items (`prefixItems`) then `items`, counted by min/maxItems."""
    prefix: list[Schema] = list(s.get("prefixItems", []))
    items: Schema | None = s.get("items", s.get("unevaluatedItems"))
    if items is None and prefix and conv.strict:
        conv.narrow(ptr, "items after the tuple are not allowed (strict)")
        items = False
    if items is None:
        items = True
    min_items, max_items = conv.counts(s.get("minItems"), s.get("maxItems"), ptr, "minItems/maxItems")
    if s.get("uniqueItems") is True and (max_items is None or max_items > 1):
        conv.relax(ptr, "uniqueItems not enforced")
    item_exprs: list[str] = []
    for i, sub in enumerate(prefix):
        if sub is False:  # no array reaches position i
            max_items = i if max_items is None else min(max_items, i)
            break
        try:
            item_exprs.append(conv.expr(sub, f"{ptr}/prefixItems/{i}"))
        except Unsatisfiable:
            max_items = i if max_items is None else min(max_items, i)
            break
    n_prefix = len(item_exprs)
    extra = None
    if items is not False and (max_items is None or max_items > n_prefix) and n_prefix == len(prefix):
        try:
            extra = conv.expr(items, f"{ptr}/items")
        except Unsatisfiable:
            extra = None
    if max_items is not None and max_items < min_items:
        raise Unsatisfiable(f"minItems > maxItems at {ptr or '/'}")
    ws = conv.ws + " " if conv.ws else ""
    contained = _contains(conv, s, ptr, items, extra, n_prefix, (min_items, max_items))
    if contained is not None:
        return conv.new_rule(rule_hint(ptr, "array"), f'"[" {ws}{contained} {ws}"]"')
    alts: list[str] = []
    for k in range(1, n_prefix + 1):  # exactly the first k tuple items
        if min_items <= k and (max_items is None or k <= max_items) and (k < n_prefix or extra is None):
            alts.append(f" {conv.comma} ".join(item_exprs[:k]))
    if extra is not None:
        lo_extra = max(0, min_items - n_prefix)
        hi_extra = None if max_items is None else max_items - n_prefix
        head = f" {conv.comma} ".join(item_exprs)
        if n_prefix == 0:
            if hi_extra is None or hi_extra >= 1:
                rest = quantifier(max(lo_extra - 1, 0), None if hi_extra is None else hi_extra - 1)
                alts.append(f"{extra}" + (f" ( {conv.comma} {extra} ){rest}" if rest != "{0}" else ""))
        else:
            rest = quantifier(lo_extra, hi_extra)
            alts.append(head + (f" ( {conv.comma} {extra} ){rest}" if rest != "{0}" else ""))
    allow_empty = min_items == 0
    if not alts and not allow_empty:
        raise Unsatisfiable(f"no array length satisfies the schema at {ptr or '/'}")
    if not alts:
        return '"[" ' + ws + '"]"'
    inner = alternation(alts)
    body = f'"[" {ws}{inner} {ws}"]"' if not allow_empty else f'"[" {ws}( {inner} {ws})? "]"'
    return conv.new_rule(rule_hint(ptr, "array"), body)


def _contains(conv: Converter, s: dict[str, Any], ptr: str, items: Schema, extra: str | None, n_prefix: int,
              counts: tuple[int, int | None]) -> str | None:
    """The items of an array with at least `minContains` items matching `contains` (None: no such constraint,
    or it is relaxed): `(item ,)* hit ((, item)* , hit){m-1} (, item)*`, the hits chosen nondeterministically."""
    if "contains" not in s or not constrains("contains", s["contains"]):
        return None
    at_least, at_most = s.get("minContains", 1), s.get("maxContains")
    if at_least == 0 and at_most is None:
        return None
    min_items, max_items = counts
    if at_most is not None:
        conv.relax(ptr, "maxContains not enforced")
    if extra is None or n_prefix or max_items is not None or min_items > at_least:
        conv.relax(ptr, "contains not enforced (next to tuple items or item counts)")
        return None
    if at_least == 0:
        return None
    try:
        hit = conv.expr({"allOf": [items, s["contains"]]}, f"{ptr}/contains")
    except Unsatisfiable:
        raise Unsatisfiable(f"no item satisfies contains at {ptr or '/'}") from None
    comma = conv.comma
    more = "" if at_least == 1 else f" ( ( {comma} {extra} )* {comma} {hit} ){quantifier(at_least - 1, at_least - 1)}"
    return f"( {extra} {comma} )* {hit}{more} ( {comma} {extra} )*"


class ObjectBuilder:
    """The members of one object schema: declared properties in order, then extra ones if allowed.

    Linear in the number of properties: `tail-k` matches ", p_k ..." for the properties from k on, each
    optional one wrapped in `( ... )?`; `first-k` picks which property comes first (no leading comma).
    """

    def __init__(self, conv: Converter, s: dict[str, Any], ptr: str) -> None:
        self.conv, self.s, self.ptr = conv, s, ptr

    def body(self) -> str:
        conv, s, ptr = self.conv, self.s, self.ptr
        props: dict[str, Schema] = dict(s.get("properties", {}))
        required = [r for r in dict.fromkeys(s.get("required", [])) if isinstance(r, str)]
        pattern_props: dict[str, Schema] = dict(s.get("patternProperties", {}))
        additional = s.get("additionalProperties", s.get("unevaluatedProperties"))
        if additional is None and conv.strict:
            conv.narrow(ptr, "properties not listed are not allowed (strict)")
            additional = False
        for pat, sub in pattern_props.items():  # a declared name matching a pattern must satisfy both
            try:
                matcher = re.compile(pat)
            except re.error as exc:
                raise conv.error(ptr, f"patternProperties has an invalid regex {pat!r}: {exc}") from exc
            for name, declared in props.items():
                if matcher.search(name):
                    props[name] = {"allOf": [declared, sub]}
        for name in required:
            if name not in props:
                matching = [sub for pat, sub in pattern_props.items() if re.search(pat, name)]
                if matching:
                    props[name] = {"allOf": matching}
                elif additional is False:
                    raise Unsatisfiable(f"required property {name!r} is not allowed at {ptr or '/'}")
                else:
                    props[name] = True if additional is None else additional
        names_dfa = self.property_names(props)
        names = []
        for name, sub in props.items():
            if sub is False:
                if name in required:
                    raise Unsatisfiable(f"required property {name!r} has schema false at {ptr or '/'}")
                continue
            names.append(name)
        members: list[tuple[str, bool]] = []  # (member expression, is required)
        for name in names:
            try:
                value = conv.expr(props[name], f"{ptr}/properties/{escape_pointer(name)}")
            except Unsatisfiable:
                if name in required:
                    raise
                continue
            key = literal(json.dumps(name, ensure_ascii=False))
            members.append((f"{key} {conv.colon} {value}", name in required))
        extra = self.extra_member(props, pattern_props, additional, names_dfa)
        self.check_counts(members, extra)
        hi = s.get("maxProperties")
        if (len(members) >= 2 or (members and extra is not None)) and (hi is None or hi >= 2):
            conv.narrow(ptr, "properties in declared order, other properties after them")
        return self.sequence(members, extra)

    def property_names(self, props: dict[str, Schema]) -> Dfa | None:
        """`propertyNames` as a language of keys (None: no constraint, or relaxed); declared names it rejects
        are set to false in `props`."""
        conv, s, ptr = self.conv, self.s, self.ptr
        names = s.get("propertyNames")
        if names is None or is_trivial(names):
            return None
        for name in props:
            verdict = conv.satisfies(name, names)
            if verdict is False:
                props[name] = False
            elif verdict is None:
                conv.relax(ptr, f"propertyNames not checked for the property {name!r}")
        try:
            return self.string_language(names, f"{ptr}/propertyNames")
        except (TooComplex, UnsupportedPattern):
            conv.relax(ptr, "propertyNames not enforced for the other properties")
            return None

    def string_language(self, schema: Schema, ptr: str) -> Dfa:
        """The bodies of the strings `schema` accepts (its string keywords; `anyOf` as a union)."""
        conv = self.conv
        try:
            flat = conv.flatten(schema, ptr) if isinstance(schema, dict) else {}
        except Unsatisfiable:
            flat = {"type": []}
        if schema is False or ("type" in flat and not {"string"} & set(flat["type"])):
            return string_body({"enum": []}, 0, None)
        branches = flat.get("anyOf")
        base = {k: v for k, v in flat.items() if k != "anyOf"}
        if isinstance(base.get("format"), str) and base["format"] not in FORMATS:
            conv.relax(ptr, f"format {base['format']!r} not enforced")
        lo, hi = conv.counts(base.get("minLength"), base.get("maxLength"), ptr, "minLength/maxLength")
        if not branches:
            return string_body(base, lo, hi)
        machine = None
        for i, branch in enumerate(branches):
            try:
                merged = merge(base, conv.flatten(branch, f"{ptr}/anyOf/{i}") if isinstance(branch, dict)
                               else ({} if branch else {"type": []}), lambda m: conv.relax(ptr, m))
            except Unsatisfiable:
                continue
            part = self.string_language(merged, ptr)
            machine = part if machine is None else unite(machine, part)
        return machine if machine is not None else string_body({"enum": []}, 0, None)

    def extra_member(self, props: dict[str, Schema], pattern_props: dict[str, Schema], additional: Schema | None,
                     names: Dfa | None) -> str | None:
        """The grammar of one property beyond the declared ones, or None when none is allowed."""
        conv, ptr = self.conv, self.ptr
        declared = list(props)
        if not pattern_props and names is None:
            if additional is False:
                return None
            try:
                value = conv.expr(True if additional is None else additional, f"{ptr}/additionalProperties")
            except Unsatisfiable:
                return None
            return f"{conv.excluded_key(declared)} {conv.colon} {value}"
        patterns = list(pattern_props)
        extra_schema: Schema = True if additional is None else additional

        def group(indices: frozenset[int]) -> Hashable | None:
            schemas = [pattern_props[patterns[i]] for i in sorted(indices)] if indices else [extra_schema]
            if any(x is False for x in schemas):
                return None
            return "any" if all(map(is_trivial, schemas)) else tuple(sorted(indices))

        try:
            regions = key_regions(declared, patterns, names, group)
            alts = []
            for key, region in regions:
                value_schema: Schema
                if isinstance(key, tuple) and key:
                    value_schema = {"allOf": [pattern_props[patterns[i]] for i in key]}
                    where = f"{ptr}/patternProperties/{escape_pointer(patterns[key[0]])}"
                else:
                    value_schema = True if key == "any" else extra_schema
                    where = f"{ptr}/additionalProperties"
                try:
                    value = conv.expr(value_schema, where)
                except Unsatisfiable:
                    continue
                key_text = conv.body_terminal(region)
                alts.append(f"{key_text} {conv.colon} {value}")
            return alternation(alts) if alts else None
        except (TooComplex, UnsupportedPattern):
            return self.approximate_extra(declared, pattern_props, additional)

    def approximate_extra(self, declared: list[str], pattern_props: dict[str, Schema],
                          additional: Schema | None) -> str | None:
        """Extra properties when their key regions are too complex: one alternative per pattern (keys matching
        no pattern are not generated), each reported."""
        conv, ptr = self.conv, self.ptr
        if additional is not False:
            conv.narrow(ptr, "properties matching no patternProperties pattern are not generated")
        alts = []
        for pat, sub in pattern_props.items():
            if sub is False:
                continue
            try:
                key = terminal('"' + pattern_to_regex(pat) + '"')
            except UnsupportedPattern as exc:
                conv.relax(ptr, f"patternProperties key pattern {pat!r} ({exc}) relaxed to any key")
                key = conv.excluded_key(declared)
            if any(re.search(pat, name) for name in declared):
                conv.relax(ptr, f"patternProperties {pat!r} may repeat a declared property")
            try:
                value = conv.expr(sub, f"{ptr}/patternProperties/{escape_pointer(pat)}")
            except Unsatisfiable:
                continue
            alts.append(f"{key} {conv.colon} {value}")
        if len(alts) > 1:
            conv.relax(ptr, "a key matching several patternProperties is checked against one of them")
        return alternation(alts) if alts else None

    def check_counts(self, members: list[tuple[str, bool]], extra: str | None) -> None:
        """min/maxProperties: exact when only extra properties exist (a repetition count), checked when the
        count is fixed by the declared ones, else relaxed."""
        lo, hi = self.s.get("minProperties"), self.s.get("maxProperties")
        n_req, n_all = sum(r for _, r in members), len(members)
        counted_by_repetition = not members and extra is not None
        if lo is not None and lo > n_req and not counted_by_repetition:
            if extra is None and lo > n_all:
                raise Unsatisfiable(f"minProperties {lo} exceeds the properties allowed at {self.ptr or '/'}")
            self.conv.relax(self.ptr, "minProperties not enforced")
        if hi is not None:
            if hi < n_req:
                raise Unsatisfiable(f"maxProperties {hi} is below the required count at {self.ptr or '/'}")
            if not counted_by_repetition and (extra is not None or hi < n_all):
                self.conv.relax(self.ptr, "maxProperties not enforced")

    def sequence(self, members: list[tuple[str, bool]], extra: str | None) -> str:
        conv = self.conv
        ws = conv.ws + " " if conv.ws else ""
        comma = conv.comma
        if not members:
            if extra is None:
                return f'"{{" {ws}"}}"'
            lo, hi = conv.counts(self.s.get("minProperties"), self.s.get("maxProperties"), self.ptr,
                                 "minProperties/maxProperties")
            if lo >= 2:
                conv.relax(self.ptr, "minProperties counts a repeated property name twice")
            rest = quantifier(max(lo - 1, 0), None if hi is None else hi - 1)
            run = f"{extra}" + (f" ( {comma} {extra} ){rest}" if rest != "{0}" else "")
            if hi == 0:
                return f'"{{" {ws}"}}"'
            return f'"{{" {ws}{run} {ws}"}}"' if lo > 0 else f'"{{" {ws}( {run} {ws})? "}}"'
        hint = rule_hint(self.ptr, "obj")
        n = len(members)
        if extra is not None and len(extra) > 60:  # referenced up to three times below: name it once
            extra = conv.new_rule(f"{hint}-extra", extra)
        # tail[k]: the members from k on, each preceded by a comma; then extra members.
        tail: list[str] = [""] * (n + 1)
        tail[n] = f"( {comma} {extra} )*" if extra is not None else ""
        for k in range(n - 1, -1, -1):
            member, req = members[k]
            item = f"{comma} {member}"
            piece = item if req else f"( {item} )?"
            body = f"{piece} {tail[k + 1]}".strip()
            tail[k] = conv.new_rule(f"{hint}-tail-{k}", body) if k > 0 and tail[k + 1] else body
        # first[k]: the first member present is k or later (required ones cannot be skipped).
        first_required = next((k for k, (_, r) in enumerate(members) if r), None)
        stop = first_required if first_required is not None else n - 1
        alts = []
        for k in range(stop + 1):
            alts.append(f"{members[k][0]} {tail[k + 1]}".strip())
        if first_required is None and extra is not None:
            alts.append(f"{extra} {tail[n]}")
        inner = alternation(alts)
        if first_required is None:
            return f'"{{" {ws}( {inner} {ws})? "}}"'
        return f'"{{" {ws}{inner} {ws}"}}"'
