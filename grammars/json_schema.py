"""JSON Schema -> grammar text in the GBNF dialect of `ebnf.py`, so a schema compiles like any user grammar.

`json_schema_to_ebnf(schema)` returns the grammar and the list of what it could not enforce exactly
(`relaxations`); `compile_json_schema(schema, vocab)` compiles that grammar for a vocabulary. The rule: every
constraint is enforced exactly, or enforced more strictly (the grammar accepts a subset of the valid
instances), or named in `relaxations`; unsatisfiable schemas and unsupported references raise `SchemaError`.

Output policy (what a grammar accepts, beyond validity):
* Whitespace `"compact"` (the default) is one line with `", "` and `": "` separators, exactly what
  `json.dumps(value, ensure_ascii=False)` writes and what models usually emit; `"flexible"` allows up to
  `max_whitespace` spaces, tabs or newlines between any two tokens (for pretty-printed output).
* Properties come in declared order; optional ones may be skipped; extra properties (when allowed) follow the
  declared ones. Required properties missing from `properties` are declared after them.
* Strings accept every JSON escape except half a surrogate pair (`\\ud83d` alone), so `minLength` /
  `maxLength` count characters exactly; inside a `pattern`, a character is accepted raw or by its usual escape
  (`\\"`, `\\n`, `\\u001f`), not as `\\u0041`. Counts above 4,096 (the core's largest repetition) are
  reported as relaxed.
* Without `type`, the type is inferred from the keywords present (`properties` -> object, ...).
* `strict=True` forbids properties and tuple items the schema does not mention when it leaves
  `additionalProperties` / `items` unspecified (XGrammar's strict mode); the default follows JSON Schema.
* Numbers under bounds are written without exponent; integers never as `-0` or `1.0`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .errors import GrammarError
from .grammar import Grammar, compile_grammar
from .json_schema_charset import ANY_JSON_CHAR
from .json_schema_containers import ObjectBuilder, array_rule
from .json_schema_formats import FORMATS, INTEGER, NUMBER, integer_range, number_range
from .json_schema_merge import (
    ARRAY_KEYWORDS,
    JSON_TYPES,
    OBJECT_KEYWORDS,
    Schema,
    Unsatisfiable,
    is_trivial,
    json_pointer_get,
    merge,
    normalize,
)
from .json_schema_regex import UnsupportedPattern, pattern_full_width, pattern_to_regex, regex_width
from .json_schema_text import alternation, literal, other_char, quantifier, rule_hint, terminal
from .json_schema_types import (
    UnknownType,
    bound,
    ceil_int,
    declared_types,
    disjoint,
    floor_int,
    inferred_types,
    is_trivial_keyword,
    negated_types,
    ref_set,
    type_matches,
    value_allowed,
)
from .pda import MAX_REPEAT

if TYPE_CHECKING:
    from .vocabulary import Vocabulary

Whitespace = Literal["compact", "flexible"]

# Keywords that constrain instances but have no grammar here: each one present is reported as relaxed.
_RELAXED_KEYWORDS = {
    "not": "`not` is not enforced",
    "dependencies": "`dependencies` is not enforced",
    "dependentRequired": "`dependentRequired` is not enforced",
    "dependentSchemas": "`dependentSchemas` is not enforced",
    "contains": "`contains` is not enforced",
    "unevaluatedItems": "`unevaluatedItems` is not enforced",
    "$dynamicRef": "`$dynamicRef` is not followed",
    "$recursiveRef": "`$recursiveRef` is not followed",
}
_MAX_ANY_OF_PRODUCT = 256
_MAX_REGEX_REPEAT = 16  # longer counted repetitions of a string character become GBNF repetitions


class SchemaError(GrammarError):
    """A schema that is invalid, unsatisfiable or uses something we can neither enforce nor relax.

    The message starts with the JSON pointer of the offending subschema.
    """


@dataclass(frozen=True)
class SchemaConversion:
    """The grammar text (start rule `root`) and what could not be enforced exactly, one message each."""

    ebnf: str
    relaxations: tuple[str, ...]


def json_schema_to_ebnf(
    schema: dict[str, Any] | bool | str,
    *,
    whitespace: Whitespace = "compact",
    strict: bool = False,
    max_whitespace: int = 32,
) -> SchemaConversion:
    """Convert a JSON Schema (dict, boolean, or its JSON text) to GBNF text; see the module docstring."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"(root): schema is not valid JSON: {exc}") from exc
    if not isinstance(schema, (dict, bool)):
        raise SchemaError("(root): a schema must be an object or a boolean")
    if whitespace not in ("compact", "flexible"):
        raise ValueError(f"whitespace must be 'compact' or 'flexible', not {whitespace!r}")
    conv = Converter(schema, whitespace, strict, max_whitespace)
    try:
        root = conv.expr(schema, "")
    except Unsatisfiable as exc:
        raise SchemaError(f"unsatisfiable schema: {exc}") from exc
    except UnknownType as exc:
        raise SchemaError(f"invalid schema: {exc}") from exc
    except RecursionError as exc:
        raise SchemaError("(root): schema nests or refers to itself too deeply") from exc
    return SchemaConversion(conv.render(root), tuple(dict.fromkeys(conv.relaxations)))


def compile_json_schema(schema: dict[str, Any] | bool | str, vocab: Vocabulary, **opts: Any) -> Grammar:
    """Compile a JSON Schema for `vocab` (options as for `json_schema_to_ebnf`): the core's cached `Grammar` of
    the emitted EBNF, built with the conversion's `relaxations` (part of its cache key, so two schemas with the
    same grammar but different relaxations each get their own report)."""
    conversion = json_schema_to_ebnf(schema, **opts)
    return compile_grammar(conversion.ebnf, vocab, syntax="ebnf", relaxations=conversion.relaxations)


class Converter:
    """One conversion: the rules emitted so far, memo tables, and the relaxations found."""

    def __init__(self, root: Schema, whitespace: Whitespace, strict: bool, max_whitespace: int) -> None:
        self.root = root
        self.strict = strict
        self.rules: dict[str, str] = {}
        self.memo: dict[Any, str] = {}
        self.relaxations: list[str] = []
        self._keep_alive: list[Any] = []  # memo keys are ids of these objects
        self._anchors: dict[str, str] | None = None
        self._flattening: set[str] = set()
        self._pending: dict[int, str | None] = {}  # ids of schemas being converted -> rule name if recursive
        if whitespace == "compact":
            self.ws = ""
            self.comma, self.colon = '", "', '": "'
        else:
            self.rules["ws"] = terminal(f"[ \\t\\n\\r]{{0,{max_whitespace}}}")
            self.ws = "ws"
            self.comma, self.colon = 'ws "," ws', 'ws ":" ws'

    # ---- rules ------------------------------------------------------------------------------------------
    def new_rule(self, hint: str, body: str | None = None) -> str:
        base = re.sub(r"[^A-Za-z0-9_-]+", "-", hint).strip("-")[:40] or "s"
        if not base[0].isalpha():
            base = "s-" + base
        name, n = base, 1
        while name in self.rules or name == "root":
            n += 1
            name = f"{base}-{n}"
        self.rules[name] = body if body is not None else ""
        return name

    def shared(self, name: str, body: str) -> str:
        """A fixed helper rule (any value, plain string, ...), emitted once."""
        if name not in self.rules:
            self.rules[name] = body
        return name

    def render(self, root_expr: str) -> str:
        lines = [f"root ::= {root_expr}"]
        lines += [f"{name} ::= {body}" for name, body in self.rules.items()]
        return "\n".join(lines) + "\n"

    def counts(self, lo: Any, hi: Any, ptr: str, what: str) -> tuple[int, int | None]:
        """A (min, max) count pair as ints, clamped to the largest repetition the core compiles (reported)."""
        lo = int(lo or 0)
        hi = None if hi is None else int(hi)
        if hi is not None and hi < lo:
            raise Unsatisfiable(f"{what}: minimum {lo} > maximum {hi} at {ptr or '/'}")
        if hi is not None and hi > MAX_REPEAT:
            self.relax(ptr, f"{what}: maximum {hi} above {MAX_REPEAT} not enforced")
            hi = None
        if lo > MAX_REPEAT:
            self.relax(ptr, f"{what}: minimum {lo} enforced as {MAX_REPEAT}")
            lo = MAX_REPEAT
        return lo, hi

    def relax(self, ptr: str, message: str) -> None:
        self.relaxations.append(f"{message} at {ptr or '/'}")

    def error(self, ptr: str, message: str) -> SchemaError:
        return SchemaError(f"{ptr or '/'}: {message}")

    # ---- dispatch ---------------------------------------------------------------------------------------
    def expr(self, schema: Schema, ptr: str) -> str:
        """A GBNF expression for the instances of `schema` (a rule name or a short inline expression)."""
        if schema is True or is_trivial(schema):
            return self.any_value()
        if schema is False:
            raise Unsatisfiable(f"false schema at {ptr or '/'}")
        if not isinstance(schema, dict):
            raise self.error(ptr, f"a schema must be an object or a boolean, not {type(schema).__name__}")
        refs = ref_set(schema)
        if refs is not None:  # (allOf of) references, e.g. merged properties: one rule per set of targets,
            if len(refs) == 1:  # named before its body so recursion terminates
                return self.ref_rule(next(iter(refs)), ptr)
            return self.ref_set_rule(refs, schema, ptr)
        key = id(schema)
        if key in self.memo:
            return self.memo[key]
        if key in self._pending:  # recursion through a subschema object (not a $ref): name it now
            pending = self._pending[key]
            if pending is None:
                pending = self._pending[key] = self.new_rule(rule_hint(ptr, "rec"))
            return pending
        self._keep_alive.append(schema)
        self._pending[key] = None
        try:
            out = self.flat_expr(self.flatten(schema, ptr), ptr)
        finally:
            name = self._pending.pop(key)
        if name is not None:
            self.rules[name] = out
            out = name
        self.memo[key] = out
        return out

    def ref_rule(self, ref: str, ptr: str) -> str:
        target_ptr, target = self.resolve(ref, ptr)
        key = ("ref", target_ptr)
        if key in self.memo:
            return self.memo[key]
        name = self.new_rule(target_ptr.rsplit("/", 1)[-1] or "root-ref")
        self.memo[key] = name
        self.rules[name] = self.expr(target, target_ptr)
        return name

    def ref_set_rule(self, refs: frozenset[str], schema: dict[str, Any], ptr: str) -> str:
        key = ("refs", refs)
        if key in self.memo:
            return self.memo[key]
        name = self.new_rule("all-" + "-".join(sorted(r.rsplit("/", 1)[-1] for r in refs)))
        self.memo[key] = name
        self.rules[name] = self.flat_expr(self.flatten({"allOf": [{"$ref": r} for r in sorted(refs)]}, ptr), ptr)
        return name

    def resolve(self, ref: str, ptr: str) -> tuple[str, Schema]:
        if not isinstance(ref, str):
            raise self.error(ptr, "$ref must be a string")
        base, _, fragment = ref.partition("#")
        root_id = self.root.get("$id", self.root.get("id", "")) if isinstance(self.root, dict) else ""
        if base and base != str(root_id).partition("#")[0]:
            raise self.error(ptr, f"$ref {ref!r} points outside this document")
        if fragment and not fragment.startswith("/"):
            anchors = self.anchor_table()
            if fragment not in anchors:
                raise self.error(ptr, f"$ref {ref!r}: no $anchor or id named {fragment!r}")
            fragment = anchors[fragment]
        try:
            return fragment, json_pointer_get(self.root, fragment)
        except (KeyError, IndexError, ValueError) as exc:
            raise self.error(ptr, f"$ref {ref!r} does not resolve") from exc

    def anchor_table(self) -> dict[str, str]:
        if self._anchors is None:
            self._anchors = {}
            stack: list[tuple[Any, str]] = [(self.root, "")]
            while stack:
                node, at = stack.pop()
                if isinstance(node, dict):
                    for key in ("$anchor", "$id", "id"):
                        value = node.get(key)
                        if isinstance(value, str) and value:
                            self._anchors.setdefault(value.lstrip("#"), at)
                    stack.extend((v, f"{at}/{k.replace('~', '~0').replace('/', '~1')}") for k, v in node.items())
                elif isinstance(node, list):
                    stack.extend((v, f"{at}/{i}") for i, v in enumerate(node))
        return self._anchors

    def flatten(self, schema: dict[str, Any], ptr: str) -> dict[str, Any]:
        """`schema` with `$ref` and `allOf` merged in, normalised; `oneOf` folded into `anyOf`."""
        own = normalize({k: v for k, v in schema.items() if k not in ("$ref", "allOf")})
        if "oneOf" in own:
            branches = own.pop("oneOf")
            if self.may_overlap(branches):
                self.relax(ptr, "oneOf enforced as anyOf (branches may overlap)")
            own = merge(own, {"anyOf": branches}, lambda m: self.relax(ptr, m)) if "anyOf" in own else {
                **own, "anyOf": branches}
        parts: list[tuple[Schema, str]] = []
        if "$ref" in schema:
            target_ptr, target = self.resolve(schema["$ref"], ptr)
            parts.append((target, target_ptr))
        for i, sub in enumerate(schema.get("allOf", [])):
            parts.append((sub, f"{ptr}/allOf/{i}"))
        for sub, sub_ptr in parts:
            if sub is False:
                raise Unsatisfiable(f"allOf contains false at {sub_ptr}")
            if sub is True:
                continue
            key = f"{sub_ptr}@{id(sub)}"
            if key in self._flattening:
                raise self.error(ptr, "allOf/$ref refers to itself without consuming input")
            self._flattening.add(key)
            try:
                flat_sub = self.flatten(sub, sub_ptr)
            finally:
                self._flattening.discard(key)
            own = merge(own, flat_sub, lambda m: self.relax(ptr, m))
            if len(own.get("anyOf", ())) > _MAX_ANY_OF_PRODUCT:
                raise self.error(ptr, "allOf of anyOfs expands to too many alternatives")
        return own

    def may_overlap(self, branches: list[Schema]) -> bool:
        """Conservative: False only when the branches provably accept pairwise disjoint sets (by type, by
        enum values, or by a required discriminator property with disjoint enum/const values)."""
        resolved = []
        for br in branches:
            if br is False:
                continue
            if isinstance(br, dict) and "$ref" in br:
                try:
                    br = self.resolve(br["$ref"], "")[1]
                except SchemaError:
                    return True
            if not isinstance(br, dict):
                return True
            resolved.append(normalize(br))
        return any(not disjoint(a, b) for i, a in enumerate(resolved) for b in resolved[i + 1:])

    def flat_expr(self, s: dict[str, Any], ptr: str) -> str:
        if "anyOf" in s:
            base = {k: v for k, v in s.items() if k != "anyOf"}
            alts, last_error = [], None
            for i, branch in enumerate(s["anyOf"]):
                sub_ptr = f"{ptr}/anyOf/{i}"
                try:
                    if base and not is_trivial(base):
                        if branch is False:
                            continue
                        merged_branch = self.flatten(branch, sub_ptr) if isinstance(branch, dict) else {}
                        alts.append(self.flat_expr(merge(base, merged_branch, lambda m: self.relax(ptr, m)),
                                                   sub_ptr))
                    else:
                        alts.append(self.expr(branch, sub_ptr))
                except Unsatisfiable as exc:
                    last_error = exc
            if not alts:
                raise last_error or Unsatisfiable(f"anyOf with no satisfiable branch at {ptr or '/'}")
            return alternation(alts)
        return self.typed(s, ptr)

    # ---- one schema without applicators -----------------------------------------------------------------
    def typed(self, s: dict[str, Any], ptr: str) -> str:
        excluded_types = negated_types(s.get("not"))
        for key, message in _RELAXED_KEYWORDS.items():
            if key in s and not is_trivial_keyword(key, s[key]) and not (key == "not" and excluded_types):
                self.relax(ptr, message)
        if "if" in s and ("then" in s or "else" in s):
            self.relax(ptr, "`if`/`then`/`else` is not enforced")
        if "enum" in s:
            if excluded_types:
                s = {**s, "enum": [v for v in s["enum"] if not type_matches(v, excluded_types)]}
            return self.enum(s, ptr)
        types = (declared_types(s) if "type" in s else inferred_types(s)) or set()  # `type: null` declares none
        if excluded_types:  # `not: {type: ...}` is enforced exactly by dropping those types
            types -= excluded_types
            if "integer" in excluded_types and "number" in types:
                self.relax(ptr, "`not: {type: integer}` under type number is not enforced")
        if not types:
            raise Unsatisfiable(f"empty type list at {ptr or '/'}")
        if "number" in types:
            types.discard("integer")
        alts = []
        for t in JSON_TYPES:
            if t not in types:
                continue
            try:
                alts.append(self.of_type(t, s, ptr))
            except Unsatisfiable:
                if len(types) == 1:
                    raise
        if not alts:
            raise Unsatisfiable(f"no type of {sorted(types)} is satisfiable at {ptr or '/'}")
        return alternation(alts)

    def of_type(self, t: str, s: dict[str, Any], ptr: str) -> str:
        if t == "object":
            return self.object(s, ptr)
        if t == "array":
            return self.array(s, ptr)
        if t == "string":
            return self.string(s, ptr)
        if t in ("number", "integer"):
            return self.number(s, ptr, integer=(t == "integer"))
        if t == "boolean":
            return '( "true" | "false" )'
        return '"null"'

    def enum(self, s: dict[str, Any], ptr: str) -> str:
        values = [v for v in s["enum"] if value_allowed(v, s)]
        if not values:
            raise Unsatisfiable(f"no enum value satisfies the schema at {ptr or '/'}")
        if set(s) & (OBJECT_KEYWORDS | ARRAY_KEYWORDS | {"pattern", "format", "multipleOf"}):
            self.relax(ptr, "enum values are not checked against object/array/pattern/format keywords")
        return alternation([literal(json.dumps(v, ensure_ascii=False)) for v in values])

    # ---- scalars ----------------------------------------------------------------------------------------
    def string(self, s: dict[str, Any], ptr: str) -> str:
        min_len, max_len = self.counts(s.get("minLength"), s.get("maxLength"), ptr, "minLength/maxLength")
        if max_len is not None and max_len < min_len:
            raise Unsatisfiable(f"minLength > maxLength at {ptr or '/'}")
        body = None
        if "pattern" in s:
            try:
                body = pattern_to_regex(s["pattern"])
            except UnsupportedPattern as exc:
                self.relax(ptr, f"pattern {s['pattern']!r} ({exc}) relaxed to any string")
            if body is not None and "format" in s:
                self.relax(ptr, f"format {s['format']!r} not enforced alongside a pattern")
        elif "format" in s:
            body = FORMATS.get(s["format"])
            if body is None:
                self.relax(ptr, f"format {s['format']!r} not enforced")
        if body is None:
            quant = quantifier(min_len, max_len)
            if quant == "*":
                return self.shared("string", terminal(f'"{ANY_JSON_CHAR}*"'))
            if max_len is None or max_len <= _MAX_REGEX_REPEAT:
                return terminal(f'"{ANY_JSON_CHAR}{quant}"')
            # long bounded strings: a counted repetition of a one-character rule; as one regex terminal the
            # DFA construction grows quadratically (seconds for maxLength 256)
            char = self.shared("char", terminal(ANY_JSON_CHAR))
            return f'"\\"" {char}{quant} "\\""'
        if min_len > 0 or max_len is not None:
            # formats are ASCII without escapes, so their regex width is the decoded length
            width = pattern_full_width(s["pattern"]) if "pattern" in s else regex_width(body)
            if width is None or width[0] < min_len or (max_len is not None and width[1] > max_len):
                self.relax(ptr, "minLength/maxLength not enforced alongside a pattern or format")
        return terminal(f'"{body}"')

    def number(self, s: dict[str, Any], ptr: str, *, integer: bool) -> str:
        lo, lo_excl = bound(s, "minimum", "exclusiveMinimum", max)
        hi, hi_excl = bound(s, "maximum", "exclusiveMaximum", min)
        multiple = s.get("multipleOf")
        if multiple is not None and not (integer and float(multiple).is_integer() and int(multiple) == 1):
            if not integer and multiple == 1:
                integer = True
            else:
                self.relax(ptr, f"multipleOf {multiple} not enforced")
        if integer:
            ilo = None if lo is None else (int(lo) + 1 if lo_excl and float(lo).is_integer() else ceil_int(lo))
            ihi = None if hi is None else (int(hi) - 1 if hi_excl and float(hi).is_integer() else floor_int(hi))
            if ilo is None and ihi is None:
                return terminal(INTEGER)
            try:
                return terminal(integer_range(ilo, ihi))
            except ValueError as exc:
                raise Unsatisfiable(f"{exc} at {ptr or '/'}") from exc
        if lo is None and hi is None:
            return terminal(NUMBER)
        try:
            regex, exact = number_range(lo, lo_excl, hi, hi_excl)
        except ValueError as exc:
            raise Unsatisfiable(f"{exc} at {ptr or '/'}") from exc
        if not exact:
            self.relax(ptr, "non-integer number bounds widened to the enclosing integers")
        return terminal(regex)

    def excluded_key(self, names: list[str]) -> str:
        """A quoted JSON key that does not decode to any of `names`, as rules over their trie.

        Each trie node is one rule: a character that leaves the trie (then any text and the closing quote),
        a child character, or the closing quote when the node is not a whole name. Near the trie only the
        canonical spelling of a name's character is accepted, so no escape sequence can re-spell a name.
        (Rules, not one regex: large alternations of `.*` tails are slow to determinise.)
        """
        if not names:
            return self.shared("string", terminal(f'"{ANY_JSON_CHAR}*"'))
        key = ("excluded", tuple(sorted(names)))
        if key in self.memo:
            return self.memo[key]
        rest = self.shared("key-rest", terminal(f'{ANY_JSON_CHAR}*"'))
        trie: dict[str, Any] = {}  # character -> subtrie; "" marks the end of a name
        for name in names:
            node = trie
            for ch in name:
                node = node.setdefault(ch, {})
            node[""] = {}  # end of a name

        def rule(node: dict[str, Any], depth: int) -> str:
            children = [c for c in node if c]
            alts = [f"{terminal(other_char(children))} {rest}"]
            alts += [f"{literal(json.dumps(c, ensure_ascii=False)[1:-1])} {rule(node[c], depth + 1)}"
                     for c in children]
            if "" not in node:
                alts.append('"\\""')
            return self.new_rule(f"key-{len(self.memo)}-{depth}", " | ".join(alts))

        out = f'"\\"" {rule(trie, 0)}'
        self.memo[key] = out
        return out

    def any_value(self) -> str:
        """The grammar of every JSON value (shared rules `value`, `object`, `array`, ...)."""
        if "value" in self.rules:
            return "value"
        string = self.shared("string", terminal(f'"{ANY_JSON_CHAR}*"'))
        self.rules["value"] = (f'( object | array | {string} | {terminal(NUMBER)} | "true" | "false" '
                               f'| "null" )')
        ws = self.ws + " " if self.ws else ""
        member = f"{string} {self.colon} value"
        self.rules["object"] = f'"{{" {ws}( {member} ( {self.comma} {member} )* {ws})? "}}"'
        self.rules["array"] = f'"[" {ws}( value ( {self.comma} value )* {ws})? "]"'
        return "value"

    # ---- containers (json_schema_containers.py) ---------------------------------------------------------
    def object(self, s: dict[str, Any], ptr: str) -> str:
        return self.new_rule(rule_hint(ptr, "object"), ObjectBuilder(self, s, ptr).body())

    def array(self, s: dict[str, Any], ptr: str) -> str:
        return array_rule(self, s, ptr)
