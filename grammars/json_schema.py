"""JSON Schema -> grammar text in the GBNF dialect of `ebnf.py`, so a schema compiles like any user grammar.

`json_schema_to_ebnf(schema)` returns the grammar with its report; `compile_json_schema(schema, vocab)` compiles
that grammar for a vocabulary. The rule: every keyword constrains only the instance types it governs (draft
2020-12, and each older draft's own keywords when its `$schema` names it) and is enforced exactly, or the
report says how the grammar differs: `relaxations` (it accepts more: keywords with no exact grammar) and
`narrowings` (it accepts less: an inferred type, an asserted `format`, a fixed key order or spelling). Invalid
and unsatisfiable schemas, and references we cannot follow, raise `SchemaError`.

Output policy (what a grammar accepts, beyond validity; all reported as narrowings):
* Whitespace `"compact"` (the default) is one line with `", "` and `": "` separators, exactly what
  `json.dumps(value, ensure_ascii=False)` writes and what models usually emit; `"flexible"` allows up to
  `max_whitespace` spaces, tabs or newlines between any two tokens (for pretty-printed output).
* Properties come in declared order; optional ones may be skipped; extra properties (when allowed) follow the
  declared ones. Required properties missing from `properties` are declared after them.
* Property names and constants are spelled as `json.dumps(..., ensure_ascii=False)` writes them; integers and
  numbers under bounds, `multipleOf` or excluded values are written without exponent, integers without a
  fraction (`1`, not `1.0`). Strings accept every JSON escape except half a surrogate pair, so lengths count
  characters exactly; inside a `pattern`, a character is accepted raw or by its usual escape, not as `\\u0041`.
* Without `type`, the type is inferred from the keywords present (`properties` -> object, ...), unless
  `infer_types=False`: then every JSON type is allowed, each with the keywords that govern it.
* `strict=True` forbids properties and tuple items the schema does not mention when it leaves
  `additionalProperties` / `items` unspecified (XGrammar's strict mode); the default follows JSON Schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .bytedfa import ByteDFA
from .grammar import Grammar, compile_grammar
from .json_schema_charset import ANY_JSON_CHAR
from .json_schema_containers import ObjectBuilder, array_rule
from .json_schema_dfa import Dfa
from .json_schema_dfa_bytes import quoted_byte_dfa
from .json_schema_dfa_regex import to_regex
from .json_schema_formats import NUMBER
from .json_schema_logic import MAX_ANY_OF_PRODUCT, rewrite_logic, settle_unevaluated
from .json_schema_merge import (
    JSON_TYPES,
    NOT_INTEGER,
    Schema,
    Unsatisfiable,
    constrains,
    is_trivial,
    merge,
    normalize,
)
from .json_schema_negate import negate
from .json_schema_refs import References, draft_of
from .json_schema_report import Report, SchemaError
from .json_schema_scalars import enum_expr, number_expr, string_expr
from .json_schema_text import alternation, literal, other_char, rule_hint, terminal
from .json_schema_types import UnknownType, declared_types, disjoint, inferred_types, ref_set
from .json_schema_values import satisfies, satisfies_flat
from .pda import MAX_REPEAT

if TYPE_CHECKING:
    from .vocabulary import Vocabulary

Whitespace = Literal["compact", "flexible"]

_MAX_NEGATION_DEPTH = 16
_REFERENCE_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")
__all__ = ["SchemaConversion", "SchemaError", "compile_json_schema", "json_schema_to_ebnf"]


@dataclass(frozen=True)
class SchemaConversion:
    """The grammar text (start rule `root`) and how it differs from the schema, one message each."""

    ebnf: str
    relaxations: tuple[str, ...]
    narrowings: tuple[str, ...] = ()
    terminals: Mapping[str, Dfa] = field(default_factory=dict)  # string-body DFAs of some terminals, by their text


def json_schema_to_ebnf(
    schema: dict[str, Any] | bool | str,
    *,
    whitespace: Whitespace = "compact",
    strict: bool = False,
    max_whitespace: int = 32,
    infer_types: bool = True,
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
    conv = Converter(schema, whitespace, strict, max_whitespace, infer_types)
    try:
        root = conv.expr(schema, "")
    except Unsatisfiable as exc:
        raise SchemaError(f"unsatisfiable schema: {exc}") from exc
    except UnknownType as exc:
        raise SchemaError(f"invalid schema: {exc}") from exc
    except RecursionError as exc:
        raise SchemaError("(root): schema nests or refers to itself too deeply") from exc
    relaxations, narrowings = conv.report.final()
    return SchemaConversion(conv.render(root), relaxations, narrowings, dict(conv.terminals))


def compile_json_schema(schema: dict[str, Any] | bool | str, vocab: Vocabulary, **opts: Any) -> Grammar:
    """Compile a JSON Schema for `vocab` (options as for `json_schema_to_ebnf`): the core's cached `Grammar` of
    the emitted EBNF, built with the conversion's `relaxations` and `narrowings` (part of its cache key, so two
    schemas with the same grammar but different reports each get their own)."""
    conversion = json_schema_to_ebnf(schema, **opts)
    return compile_grammar(conversion.ebnf, vocab, syntax="ebnf", relaxations=conversion.relaxations,
                           narrowings=conversion.narrowings, prebuilt=_prebuilt(conversion.terminals))


def _prebuilt(terminals: Mapping[str, Dfa]) -> Callable[[str], ByteDFA | None]:
    """The parser's lookup of a terminal's byte DFA: built from its body DFA when the grammar is compiled (not
    when a cached grammar is found), None for the terminals the conversion has no DFA of."""
    def lookup(text: str) -> ByteDFA | None:
        machine = terminals.get(text)
        return None if machine is None else quoted_byte_dfa(machine)
    return lookup


class Converter:
    """One conversion: the rules emitted so far, memo tables, and the report."""

    def __init__(self, root: Schema, whitespace: Whitespace, strict: bool, max_whitespace: int,
                 infer_types: bool) -> None:
        self.root = root
        self.strict = strict
        self.infer_types = infer_types
        self.draft = draft_of(root)
        self.refs = References(root)
        self.report = Report()
        self.rules: dict[str, str] = {}
        self.memo: dict[Any, str] = {}
        self._keep_alive: list[Any] = []  # memo keys are ids of these objects
        self._flattening: set[str] = set()
        self._pending: dict[int, str | None] = {}  # ids of schemas being converted -> rule name if recursive
        self._negation_depth = 0
        self.terminals: dict[str, Dfa] = {}  # see `body_terminal`
        spelling = ("property names and constants as json.dumps writes them; numbers under bounds, multipleOf "
                    "or excluded values without exponent, integers without fraction or exponent")
        if whitespace == "compact":
            self.ws = ""
            self.comma, self.colon = '", "', '": "'
            self.narrow("", f"whitespace as json.dumps writes it (', ' and ': ', nothing else: whitespace='flexible' "
                            f"allows more); {spelling}")
        else:
            self.rules["ws"] = terminal(f"[ \\t\\n\\r]{{0,{max_whitespace}}}")
            self.ws = "ws"
            self.comma, self.colon = 'ws "," ws', 'ws ":" ws'
            self.narrow("", f"at most {max_whitespace} whitespace characters between tokens; {spelling}")

    # ---- rules and report ----------------------------------------------------------------------------------
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
        """A fixed helper rule (plain string, one character, ...), emitted once under a name no schema rule
        takes (a `$defs` entry may well be called `string`)."""
        key = ("shared", name)
        if key not in self.memo:
            self.memo[key] = self.new_rule(name, body)
        return self.memo[key]

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
        self.report.relax(ptr, message)

    def narrow(self, ptr: str, message: str) -> None:
        self.report.narrow(ptr, message)

    def error(self, ptr: str, message: str) -> SchemaError:
        return SchemaError(f"{ptr or '/'}: {message}")

    def body_terminal(self, machine: Dfa) -> str:
        """The `/"..."/` terminal of the strings whose bodies `machine` accepts, `machine` kept (`terminals`), so
        the grammar's compile builds the terminal's byte DFA from it rather than from the regex text."""
        text = terminal('"' + to_regex(machine) + '"')
        self.terminals[text] = machine
        return text

    @contextmanager
    def scratch(self) -> Iterator[Report]:
        """Report into a scratch `Report` (for flattening done only to reason about a schema)."""
        saved, self.report = self.report, Report()
        try:
            yield self.report
        finally:
            self.report = saved

    # ---- values --------------------------------------------------------------------------------------------
    def exact_flatten(self, schema: Schema, ptr: str) -> dict[str, Any] | None:
        """`flatten(schema)` when it is exact (no relaxation needed), else None; reports nothing."""
        if not isinstance(schema, dict):
            return {} if schema else {"type": []}
        with self.scratch() as report:
            try:
                flat = self.flatten(schema, ptr)
            except SchemaError:
                return None
        return None if report.relaxations else flat

    def satisfies(self, value: Any, schema: Schema) -> bool | None:
        return satisfies(value, schema, self.exact_flatten, self.draft)

    def satisfies_flat(self, value: Any, flat: dict[str, Any]) -> bool | None:
        return satisfies_flat(value, flat, self.exact_flatten, self.draft)

    # ---- dispatch ------------------------------------------------------------------------------------------
    def expr(self, schema: Schema, ptr: str) -> str:
        """A GBNF expression for the instances of `schema` (a rule name or a short inline expression)."""
        if schema is True or is_trivial(schema):
            return self.any_value()
        if schema is False:
            raise Unsatisfiable(f"false schema at {ptr or '/'}")
        if not isinstance(schema, dict):
            raise self.error(ptr, f"a schema must be an object or a boolean, not {type(schema).__name__}")
        refs = ref_set({"$ref": schema["$ref"]} if self.draft < 2019 and "$ref" in schema else schema)
        if refs is not None:  # (allOf of) references, e.g. merged properties: one rule per set of targets,
            if len(refs) == 1:  # named before its body so recursion terminates
                return self.ref_rule(next(iter(refs)), ptr)
            return self.ref_set_rule(refs, ptr)
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
        target_ptr, target = self.refs.resolve(ref, ptr)
        key = ("ref", target_ptr)
        if key in self.memo:
            return self.memo[key]
        name = self.new_rule(target_ptr.rsplit("/", 1)[-1] or "root-ref")
        self.memo[key] = name
        self.rules[name] = self.expr(target, target_ptr)
        return name

    def ref_set_rule(self, refs: frozenset[str], ptr: str) -> str:
        key = ("refs", refs)
        if key in self.memo:
            return self.memo[key]
        name = self.new_rule("all-" + "-".join(sorted(r.rsplit("/", 1)[-1] for r in refs)))
        self.memo[key] = name
        self.rules[name] = self.flat_expr(self.flatten({"allOf": [{"$ref": r} for r in sorted(refs)]}, ptr), ptr)
        return name

    # ---- flattening: references and allOf merged, logic rewritten --------------------------------------------
    def flatten(self, schema: dict[str, Any], ptr: str) -> dict[str, Any]:
        """`schema` with its references and `allOf` merged in, normalised; `oneOf` folded into `anyOf`;
        dependencies, `if`/`then`/`else` and `not` rewritten into `anyOf` branches where exact, else relaxed;
        `unevaluated*` turned into `additionalProperties` / `items` where that is exact."""
        parts: list[tuple[Schema, str]] = []
        if self.draft < 2019 and "$ref" in schema:  # before 2019-09, the siblings of a $ref are ignored
            own: dict[str, Any] = {}
            parts.append(self.refs.resolve(schema["$ref"], ptr)[::-1])
        else:
            own = normalize({k: v for k, v in schema.items() if k not in (*_REFERENCE_KEYS, "allOf")}, self.draft)
            if "$ref" in schema:
                parts.append(self.refs.resolve(schema["$ref"], ptr)[::-1])
            for keyword, draft in (("$dynamicRef", 2020), ("$recursiveRef", 2019)):
                if keyword in schema and self.draft == draft:
                    parts.append(self.refs.resolve_dynamic(keyword, schema[keyword], ptr)[::-1])
            for i, sub in enumerate(schema.get("allOf", [])):
                parts.append((sub, f"{ptr}/allOf/{i}"))
        if "dependencies" in schema and self.draft >= 2019 and constrains("dependencies", schema["dependencies"]):
            self.narrow(ptr, "`dependencies` (a draft-07 keyword) enforced")
        if "oneOf" in own:
            branches = own.pop("oneOf")
            if self.may_overlap(branches):
                self.relax(ptr, "oneOf enforced as anyOf (branches may overlap)")
            own = self.merge(own, {"anyOf": branches}, ptr) if "anyOf" in own else {**own, "anyOf": branches}
        for sub, sub_ptr in parts:
            if sub is False:
                raise Unsatisfiable(f"allOf contains false at {sub_ptr}")
            if sub is True:
                continue
            if not isinstance(sub, dict):
                raise self.error(sub_ptr, "a schema must be an object or a boolean")
            key = f"{sub_ptr}@{id(sub)}"
            if key in self._flattening:
                raise self.error(ptr, "allOf/$ref refers to itself without consuming input")
            self._flattening.add(key)
            try:
                flat_sub = self.flatten(sub, sub_ptr)
            finally:
                self._flattening.discard(key)
            for unsettled in ("unevaluatedProperties", "unevaluatedItems"):
                if unsettled in flat_sub:
                    self.relax(sub_ptr, f"{unsettled} next to anyOf inside an allOf: not enforced")
                    flat_sub = {k: v for k, v in flat_sub.items() if k != unsettled}
            own = self.merge(own, flat_sub, ptr)
        logic = any(k in own for k in ("if", "not", "dependentSchemas"))
        own = rewrite_logic(self, own, ptr)
        return settle_unevaluated(self, own, ptr, logic)

    def merge(self, a: dict[str, Any], b: dict[str, Any], ptr: str) -> dict[str, Any]:
        out = merge(a, b, lambda m: self.relax(ptr, m))
        if len(out.get("anyOf", ())) > MAX_ANY_OF_PRODUCT:
            raise self.error(ptr, "allOf of anyOfs expands to too many alternatives")
        return out

    def negation(self, schema: Schema, ptr: str) -> Schema | None:
        """The complement of `schema` (json_schema_negate.py), or None when it has no exact one here."""
        if self._negation_depth >= _MAX_NEGATION_DEPTH:
            return None
        self._negation_depth += 1
        try:
            try:
                flat = self.exact_flatten(schema, ptr)
            except Unsatisfiable:
                return True
            return None if flat is None else negate(flat, self.draft)
        finally:
            self._negation_depth -= 1

    def may_overlap(self, branches: list[Schema]) -> bool:
        """Conservative: False only when no instance the grammar generates for one branch satisfies another
        (by type, by enum values, or by a required discriminator property)."""
        flats = []
        for i, br in enumerate(branches):
            if br is False:
                continue
            try:
                flat = self.exact_flatten(br, f"/oneOf/{i}")
            except Unsatisfiable:
                continue
            if flat is None:
                return True
            flats.append(flat)
        return any(not (disjoint(a, b, self.infer_types, self.satisfies)
                        and disjoint(b, a, self.infer_types, self.satisfies))
                   for i, a in enumerate(flats) for b in flats[i + 1:])

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
                        alts.append(self.flat_expr(self.merge(base, merged_branch, ptr), sub_ptr))
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
        if "enum" in s:
            return enum_expr(self, s, ptr)
        try:
            declared = declared_types(s)
        except UnknownType as exc:  # named by its pointer, as every other schema error is
            raise self.error(ptr, str(exc)) from exc
        if declared is None and self.infer_types and inferred_types(s) != set(JSON_TYPES):
            types = inferred_types(s)
            try:
                out = self.of_types(types, s, ptr)
            except Unsatisfiable:  # the keywords' own types have no instance: the others still do
                return self.of_types(set(JSON_TYPES), s, ptr)
            names = ", ".join(t for t in JSON_TYPES if t in types and not (t == "integer" and "number" in types))
            self.narrow(ptr, f"type inferred as {names} from its keywords (infer_types=False keeps every type)")
            return out
        return self.of_types(set(JSON_TYPES) if declared is None else declared, s, ptr)

    def of_types(self, types: set[str], s: dict[str, Any], ptr: str) -> str:
        if not types:
            raise Unsatisfiable(f"empty type list at {ptr or '/'}")
        if "number" in types:
            types = types - {"integer"}
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
            return self.new_rule(rule_hint(ptr, "object"), ObjectBuilder(self, s, ptr).body())
        if t == "array":
            return array_rule(self, s, ptr)
        if t == "string":
            return string_expr(self, s, ptr)
        if t in ("number", "integer"):
            if t == "integer" and s.get(NOT_INTEGER):
                raise Unsatisfiable(f"an integer that is not an integer at {ptr or '/'}")
            return number_expr(self, s, ptr, integer=(t == "integer"))
        if t == "boolean":
            return '( "true" | "false" )'
        return '"null"'

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
        key = ("shared", "value")
        if key in self.memo:
            return self.memo[key]
        string = self.shared("string", terminal(f'"{ANY_JSON_CHAR}*"'))
        value, obj, arr = self.new_rule("value"), self.new_rule("object"), self.new_rule("array")
        self.memo[key] = value
        self.rules[value] = f'( {obj} | {arr} | {string} | {terminal(NUMBER)} | "true" | "false" | "null" )'
        ws = self.ws + " " if self.ws else ""
        member = f"{string} {self.colon} {value}"
        self.rules[obj] = f'"{{" {ws}( {member} ( {self.comma} {member} )* {ws})? "}}"'
        self.rules[arr] = f'"[" {ws}( {value} ( {self.comma} {value} )* {ws})? "]"'
        return value
