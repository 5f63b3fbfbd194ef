"""JSON Schema `pattern` -> regex over the JSON-encoded string body (the text between the quotes).

The pattern is parsed with Python's own regex parser (`re._parser`, the `sre_parse` of Python 3.10) and
rebuilt node by node: each character set becomes the set of its JSON spellings (`json_schema_charset`), the
structure (groups, alternation, repetition) is kept. The output is `interegular` syntax, matched in full by the
core's `/.../` terminals.

Semantics follow JSON Schema (ECMA-262 regexes, unanchored search):
* a pattern matches anywhere, so an unanchored side gets "any characters" added; `^` / `$` (and `\\A`, `\\Z`)
  at the ends of the pattern or of each top-level alternative anchor it;
* `\\d` is `[0-9]`, `\\w` is `[A-Za-z0-9_]`, `\\s` is the ECMA-262 white space set, `.` excludes line
  terminators (`\\n`, `\\r`, U+2028, U+2029).
Lookarounds, backreferences, word boundaries, anchors inside the pattern, possessive/atomic groups and
case-insensitive or multi-line flags raise `UnsupportedPattern`; the caller decides whether to relax or refuse.
"""

from __future__ import annotations

from typing import Any

try:
    import re._constants as sre_c
    import re._parser as sre_parse
except ImportError:  # Python 3.10
    import sre_constants as sre_c
    import sre_parse

from .json_schema_charset import (
    ALL,
    ANY_JSON_CHAR,
    DIGIT,
    LINE_TERMINATORS,
    SPACE,
    WORD,
    CharSet,
    json_encoded,
)

# One parsed regex node, `(opcode, argument)` as `sre_parse` gives it; the argument's shape depends on the opcode.
_Node = tuple[Any, Any]

MAX_PATTERN_REPEAT = 256  # a counted repetition is one DFA state per count; larger ones are refused


class UnsupportedPattern(ValueError):
    """A pattern construct with no exact translation; the message names it (e.g. "lookaround")."""


# Python's `\s` and ECMA's differ (U+FEFF, U+001C-U+001F, U+0085); use the characters both accept.
_SPACE_BOTH = SPACE.minus(CharSet.of((0xFEFF, 0xFEFF)))
_CATEGORIES = {
    sre_c.CATEGORY_DIGIT: DIGIT,
    sre_c.CATEGORY_NOT_DIGIT: DIGIT.complement(),
    sre_c.CATEGORY_WORD: WORD,
    sre_c.CATEGORY_NOT_WORD: WORD.complement(),
    sre_c.CATEGORY_SPACE: _SPACE_BOTH,
    sre_c.CATEGORY_NOT_SPACE: SPACE.complement(),
}
_BEGIN = (sre_c.AT_BEGINNING, sre_c.AT_BEGINNING_STRING)
_END = (sre_c.AT_END, sre_c.AT_END_STRING)
_ANY_STRING = ANY_JSON_CHAR + "*"


def pattern_to_regex(pattern: str) -> str:
    """Regex text for the JSON string bodies whose decoded value `re.search`es `pattern` (ECMA semantics)."""
    try:
        parsed = sre_parse.parse(pattern)
    except Exception as exc:  # re.error, OverflowError, RecursionError
        raise UnsupportedPattern(f"invalid regex ({exc})") from exc
    flags = parsed.state.flags
    if flags & (sre_c.SRE_FLAG_IGNORECASE | sre_c.SRE_FLAG_MULTILINE | sre_c.SRE_FLAG_LOCALE):
        raise UnsupportedPattern("case-insensitive, multi-line or locale flag")
    return _Translator(bool(flags & sre_c.SRE_FLAG_DOTALL)).top(list(parsed))


def pattern_full_width(pattern: str) -> tuple[int, int] | None:
    """(min, max) decoded length of a string matching `pattern` when it is anchored at both ends, else None."""
    parsed = list(sre_parse.parse(pattern))
    if len(parsed) < 2 or parsed[0] != (sre_c.AT, sre_c.AT_BEGINNING) or parsed[-1][0] != sre_c.AT:
        return None
    if parsed[-1][1] not in _END:
        return None
    lo, hi = sre_parse.SubPattern(sre_parse.State(), parsed[1:-1]).getwidth()
    return lo, (hi if hi < sre_c.MAXREPEAT else 1 << 62)


def regex_width(regex: str) -> tuple[int, int]:
    """(min, max) length of the matches of a plain regex (max 2**62 when unbounded)."""
    lo, hi = sre_parse.parse(regex).getwidth()
    return lo, (hi if hi < sre_c.MAXREPEAT else 1 << 62)


class _Translator:
    def __init__(self, dotall: bool) -> None:
        self.dot = ALL if dotall else ALL.minus(LINE_TERMINATORS)

    def top(self, items: list[_Node]) -> str:
        """An alternative of the whole pattern: strip its anchors, pad unanchored ends with any text."""
        if len(items) == 1 and items[0][0] == sre_c.BRANCH:
            return "(?:" + "|".join(self.top(list(alt)) for alt in items[0][1][1]) + ")"
        begins = bool(items) and items[0][0] == sre_c.AT and items[0][1] in _BEGIN
        ends = bool(items) and items[-1][0] == sre_c.AT and items[-1][1] in _END
        core = items[int(begins): len(items) - int(ends)]
        if not begins and not ends and len(core) == 1 and core[0][0] == sre_c.SUBPATTERN:
            _group, add_flags, _del_flags, sub = core[0][1]
            if not add_flags and _has_anchor(list(sub)):
                return self.top(list(sub))
        # `.*` next to an unanchored end adds nothing to the "any characters" padding there: drop it
        while not begins and core and _is_dot_star(core[0]):
            core = core[1:]
        while not ends and core and _is_dot_star(core[-1]):
            core = core[:-1]
        if not begins and not ends and not core:
            return _ANY_STRING
        body = self.seq(core)
        return ("" if begins else _ANY_STRING) + body + ("" if ends else _ANY_STRING)

    def seq(self, items: list[_Node]) -> str:
        return "".join(self.node(op, av) for op, av in items)

    def node(self, op: Any, av: Any) -> str:
        if op == sre_c.LITERAL:
            return json_encoded(CharSet.of((av, av)))
        if op == sre_c.NOT_LITERAL:
            return self.charset(CharSet.of((av, av)).complement())
        if op == sre_c.ANY:
            return self.charset(self.dot)
        if op == sre_c.IN:
            return self.charset(self.class_set(av))
        if op == sre_c.BRANCH:
            return "(?:" + "|".join(self.seq(list(alt)) for alt in av[1]) + ")"
        if op == sre_c.SUBPATTERN:
            _group, add_flags, _del_flags, sub = av
            if add_flags & (sre_c.SRE_FLAG_IGNORECASE | sre_c.SRE_FLAG_MULTILINE):
                raise UnsupportedPattern("case-insensitive or multi-line group")
            if add_flags & sre_c.SRE_FLAG_DOTALL:
                return _Translator(True).group(list(sub))
            return self.group(list(sub))
        if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            lo, hi, sub = av
            if lo > MAX_PATTERN_REPEAT or MAX_PATTERN_REPEAT < hi < sre_c.MAXREPEAT:
                raise UnsupportedPattern(f"repetition bound above {MAX_PATTERN_REPEAT}")
            return self.group(list(sub)) + _quantifier(lo, hi)
        if op == sre_c.AT:
            raise UnsupportedPattern("anchor or word boundary inside the pattern")
        if op in (sre_c.ASSERT, sre_c.ASSERT_NOT):
            raise UnsupportedPattern("lookaround")
        if op in (sre_c.GROUPREF, sre_c.GROUPREF_EXISTS):
            raise UnsupportedPattern("backreference")
        raise UnsupportedPattern(f"regex construct {op}")

    def group(self, items: list[_Node]) -> str:
        return "(?:" + self.seq(items) + ")"

    def class_set(self, items: list[_Node]) -> CharSet:
        cs = CharSet(())
        negate = False
        for op, av in items:
            if op == sre_c.NEGATE:
                negate = True
            elif op == sre_c.LITERAL:
                cs = cs.union(CharSet.of((av, av)))
            elif op == sre_c.RANGE:
                cs = cs.union(CharSet.of(av))
            elif op == sre_c.CATEGORY and av in _CATEGORIES:
                cs = cs.union(_CATEGORIES[av])
            else:
                raise UnsupportedPattern(f"character class item {op} {av}")
        return cs.complement() if negate else cs

    def charset(self, cs: CharSet) -> str:
        if cs.is_empty():
            raise UnsupportedPattern("empty character class (the pattern can never match here)")
        return json_encoded(cs)


def _is_dot_star(item: _Node) -> bool:
    op, av = item
    return (op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT) and av[0] == 0 and av[1] >= sre_c.MAXREPEAT
            and list(av[2]) == [(sre_c.ANY, None)])


def _has_anchor(items: list[_Node]) -> bool:
    for op, av in items:
        if op == sre_c.AT:
            return True
        if op == sre_c.BRANCH and any(_has_anchor(list(alt)) for alt in av[1]):
            return True
        if op == sre_c.SUBPATTERN and _has_anchor(list(av[3])):
            return True
    return False


def _quantifier(lo: int, hi: int) -> str:
    if hi >= sre_c.MAXREPEAT:
        return {0: "*", 1: "+"}.get(lo, f"{{{lo},}}")
    if (lo, hi) == (0, 1):
        return "?"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"
