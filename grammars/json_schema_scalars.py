"""Strings, numbers and constants for the JSON Schema compiler.

One constraint becomes one regex terminal directly (`pattern`, `format`, a length, bounds); several on the same
value (a `pattern` and a `format`, bounds and `multipleOf`, values a negation excludes) are intersected as DFAs
(json_schema_dfa.py) and written back as one terminal. Where that grows too large, one constraint is kept and
the others are reported as relaxed.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from .json_schema_charset import ANY_JSON_CHAR
from .json_schema_dfa import Dfa, TooComplex, dfa_of, intersect, is_empty, subtract, table_dfa
from .json_schema_dfa_regex import to_regex
from .json_schema_formats import FORMATS, INTEGER, NUMBER, integer_range, number_range
from .json_schema_keys import string_body
from .json_schema_merge import NOT_ENUM, NOT_INTEGER, NOT_PATTERNS, Unsatisfiable, canonical
from .json_schema_regex import UnsupportedPattern, pattern_full_width, pattern_to_regex, regex_width
from .json_schema_text import alternation, literal, quantifier, terminal
from .json_schema_types import bound, ceil_int, floor_int

if TYPE_CHECKING:
    from .json_schema import Converter

_MAX_REGEX_REPEAT = 16  # longer counted repetitions of a string character become GBNF repetitions
NUMBER_PLAIN = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?"  # a number without exponent
NON_INTEGER = r"-?(?:0|[1-9][0-9]*)\.[0-9]*[1-9][0-9]*"  # ... whose value is not integral
_MAX_MULTIPLE_STATES = 5_000
_BOUND_DIGITS = 40
_LARGEST_BOUND = 10**_BOUND_DIGITS


def string_expr(conv: Converter, s: dict[str, Any], ptr: str) -> str:
    min_len, max_len = conv.counts(s.get("minLength"), s.get("maxLength"), ptr, "minLength/maxLength")
    if max_len is not None and max_len < min_len:
        raise Unsatisfiable(f"minLength > maxLength at {ptr or '/'}")
    fmt = s.get("format")
    asserted = isinstance(fmt, str) and fmt in FORMATS
    if fmt is not None and not asserted:
        conv.relax(ptr, f"format {fmt!r} not enforced")
    if asserted:
        conv.narrow(ptr, f"format {fmt!r} asserted")
    patterns: list[tuple[str, str]] = []  # (pattern, its regex)
    for pattern in s.get("pattern", ()):
        try:
            patterns.append((pattern, pattern_to_regex(pattern)))
        except UnsupportedPattern as exc:
            conv.relax(ptr, f"pattern {pattern!r} ({exc}) relaxed to any string")
    positives = [regex for _, regex in patterns] + ([FORMATS[fmt]] if isinstance(fmt, str) and asserted else [])
    excluded = [v for v in s.get(NOT_ENUM, ()) if isinstance(v, str)]
    negatives = list(s.get(NOT_PATTERNS, ()))
    counted = min_len > 0 or max_len is not None
    if not positives and not negatives and not excluded:
        return _plain_string(conv, min_len, max_len)
    if not positives and not negatives and not counted:
        return conv.excluded_key(excluded)  # a string that is none of them
    if len(positives) == 1 and not negatives and not excluded:
        width = pattern_full_width(patterns[0][0]) if patterns else regex_width(positives[0])
        if not counted or (width is not None and width[0] >= min_len and (max_len is None or width[1] <= max_len)):
            return terminal(f'"{positives[0]}"')
    view = {"pattern": tuple(p for p, _ in patterns), "format": fmt if asserted else None, NOT_PATTERNS: negatives,
            NOT_ENUM: excluded}
    try:
        machine = string_body(view, min_len, max_len)
        if is_empty(machine):
            raise Unsatisfiable(f"no string satisfies the schema at {ptr or '/'}")
        return conv.body_terminal(machine)
    except (TooComplex, UnsupportedPattern):
        pass
    if not positives:
        conv.relax(ptr, "excluded strings or patterns (from `not`) not enforced")
        return _plain_string(conv, min_len, max_len)
    conv.relax(ptr, "pattern, format and length enforced one at a time: only the first of them")
    return terminal(f'"{positives[0]}"')


def _plain_string(conv: Converter, min_len: int, max_len: int | None) -> str:
    quant = quantifier(min_len, max_len)
    if quant == "*":
        return conv.shared("string", terminal(f'"{ANY_JSON_CHAR}*"'))
    if max_len is None or max_len <= _MAX_REGEX_REPEAT:
        return terminal(f'"{ANY_JSON_CHAR}{quant}"')
    # long bounded strings: a counted repetition of a one-character rule; as one regex terminal the DFA
    # construction grows quadratically (seconds for maxLength 256)
    char = conv.shared("char", terminal(ANY_JSON_CHAR))
    return f'"\\"" {char}{quant} "\\""'


def number_expr(conv: Converter, s: dict[str, Any], ptr: str, *, integer: bool) -> str:
    lo, lo_excl = bound(s, "minimum", "exclusiveMinimum", max)
    hi, hi_excl = bound(s, "maximum", "exclusiveMaximum", min)
    multiple = s.get("multipleOf")
    if multiple is not None:
        step = Fraction(str(multiple))
        if step <= 0:
            raise conv.error(ptr, f"multipleOf must be positive, not {multiple}")
        if integer and (1 / step).denominator == 1:
            multiple = None  # every integer is a multiple
        elif step == 1:
            integer, multiple = True, None
    not_integer = bool(s.get(NOT_INTEGER))
    if integer and not_integer:
        raise Unsatisfiable(f"an integer that is not an integer at {ptr or '/'}")
    excluded = [v for v in s.get(NOT_ENUM, ()) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    base = _bounded(conv, s, ptr, integer, (lo, lo_excl, hi, hi_excl))
    if multiple is None and not not_integer and not excluded:
        return terminal(base)
    try:
        machine = dfa_of(NUMBER_PLAIN if base == NUMBER else base)
        if not_integer:
            machine = intersect(machine, dfa_of(NON_INTEGER))
        if multiple is not None:
            machine = intersect(machine, multiple_dfa(Fraction(str(multiple))))
        if excluded:
            machine = subtract(machine, dfa_of("(?:" + "|".join(number_spellings(v) for v in excluded) + ")"))
        if is_empty(machine):
            raise Unsatisfiable(f"no number satisfies the schema at {ptr or '/'}")
        return terminal(to_regex(machine))
    except TooComplex:
        conv.relax(ptr, "multipleOf / excluded numbers not enforced" if multiple is None
                   else f"multipleOf {multiple} not enforced")
        return terminal(base)


def _bounded(conv: Converter, s: dict[str, Any], ptr: str, integer: bool,
             bounds: tuple[float | None, bool, float | None, bool]) -> str:
    """The regex of the numbers (or integers) within the bounds of `s`; bounds beyond +-10**40 are pulled in
    to it (reported: their digit-by-digit regexes nest too deeply to compile)."""
    lo, lo_excl, hi, hi_excl = bounds
    if lo is not None and lo < -_LARGEST_BOUND:
        lo, lo_excl = -_LARGEST_BOUND, False
        conv.narrow(ptr, f"numbers below -10**{_BOUND_DIGITS} excluded")
    if hi is not None and hi > _LARGEST_BOUND:
        hi, hi_excl = _LARGEST_BOUND, False
        conv.narrow(ptr, f"numbers above 10**{_BOUND_DIGITS} excluded")
    if integer:
        ilo = None if lo is None else (int(lo) + 1 if lo_excl and float(lo).is_integer() else ceil_int(lo))
        ihi = None if hi is None else (int(hi) - 1 if hi_excl and float(hi).is_integer() else floor_int(hi))
        if ilo is None and ihi is None:
            return INTEGER
        try:
            return integer_range(ilo, ihi)
        except ValueError as exc:
            raise Unsatisfiable(f"{exc} at {ptr or '/'}") from exc
    if lo is None and hi is None:
        return NUMBER
    try:
        regex, exact = number_range(lo, lo_excl, hi, hi_excl)
    except ValueError as exc:
        raise Unsatisfiable(f"{exc} at {ptr or '/'}") from exc
    if not exact:
        conv.relax(ptr, "non-integer number bounds widened to the enclosing integers")
    return regex


def multiple_dfa(step: Fraction) -> Dfa:
    """Plain decimals (no exponent; their syntax checked elsewhere) that are integer multiples of `step`.

    With step = P / 10**Q, x is a multiple iff x * 10**Q is an integer (at most Q fraction digits that are not
    trailing zeros) divisible by P: the digits are read as a number mod P, Q fraction digits at most."""
    den: int = step.denominator
    q = 0
    while (10 ** q) % den:
        q += 1
        if q > 30:
            raise TooComplex(f"multipleOf {step} is not a decimal")
    p: int = step.numerator * (10 ** q // den)
    odd = p
    for f in (2, 5):
        while odd % f == 0:
            odd //= f
    if odd > 3 or p * (q + 2) > _MAX_MULTIPLE_STATES:  # remainders mod 7 and up have no regex of useful size
        raise TooComplex(f"multipleOf {step}: too many remainders")

    def int_state(r: int) -> int:
        return 2 + r

    def frac_state(r: int, k: int) -> int:
        return 2 + p + r * (q + 1) + k

    digits = "0123456789"
    table: dict[int, dict[str, int]] = {0: {"-": 1, **{c: int_state(int(c) % p) for c in digits}},
                                        1: {c: int_state(int(c) % p) for c in digits}}
    finals = set()
    for r in range(p):
        table[int_state(r)] = {**{c: int_state((10 * r + int(c)) % p) for c in digits}, ".": frac_state(r, 0)}
        if r * 10 ** q % p == 0:
            finals.add(int_state(r))
        for k in range(q + 1):
            if k < q:
                table[frac_state(r, k)] = {c: frac_state((10 * r + int(c)) % p, k + 1) for c in digits}
            else:
                table[frac_state(r, k)] = {"0": frac_state(r, q)}
            if k > 0 and r * 10 ** (q - k) % p == 0:
                finals.add(frac_state(r, k))
    return table_dfa("-." + digits, table, finals)


def number_spellings(v: int | float) -> str:
    """Regex of the plain-decimal spellings of the number `v` (trailing fraction zeros allowed), and of the
    spelling json.dumps gives it."""
    d = Decimal(v) if isinstance(v, int) else Decimal(repr(v))
    alts = []
    if d == d.to_integral_value():
        i = int(d)
        alts.append(("-?0" if i == 0 else ("\\-" if i < 0 else "") + str(abs(i))) + r"(?:\.0+)?")
    else:
        text = format(d.normalize(), "f")
        sign, text = ("\\-", text[1:]) if text.startswith("-") else ("", text)
        whole, _, frac = text.partition(".")
        alts.append(f"{sign}{whole}\\.{frac}0*")
    dumped = json.dumps(v)
    if "e" in dumped or "E" in dumped:
        alts.append(re.sub(r"([.+\-])", r"\\\1", dumped))
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def enum_expr(conv: Converter, s: dict[str, Any], ptr: str) -> str:
    """The listed values the other keywords of `s` allow (checked one by one: json_schema_values.py)."""
    rest = {k: v for k, v in s.items() if k != "enum"}
    values, unsure = [], False
    for v in s["enum"]:
        verdict = conv.satisfies_flat(v, rest)
        if verdict is False:
            continue
        unsure |= verdict is None
        values.append(v)
    if not values:
        raise Unsatisfiable(f"no enum value satisfies the schema at {ptr or '/'}")
    if unsure:
        conv.relax(ptr, "enum values not all checked against the other keywords")
    fmt = rest.get("format")
    if isinstance(fmt, str) and fmt not in FORMATS and any(isinstance(v, str) for v in values):
        conv.relax(ptr, f"format {fmt!r} not enforced")
    unique = list({canonical(v): v for v in values}.values())
    return alternation([const_expr(conv, v, ptr) for v in unique])


def const_expr(conv: Converter, v: Any, ptr: str) -> str:
    """The grammar of one JSON value: its json.dumps spelling, numbers in any plain spelling of their value."""
    ws = conv.ws + " " if conv.ws else ""
    if isinstance(v, dict):
        if len(v) >= 2:
            conv.narrow(ptr, "object constants are written in their listed key order")
        members = [f"{literal(json.dumps(k, ensure_ascii=False))} {conv.colon} {const_expr(conv, x, ptr)}"
                   for k, x in v.items()]
        return f'"{{" {ws}' + f" {conv.comma} ".join(members) + f' {ws}"}}"' if members else f'"{{" {ws}"}}"'
    if isinstance(v, list):
        items = [const_expr(conv, x, ptr) for x in v]
        return f'"[" {ws}' + f" {conv.comma} ".join(items) + f' {ws}"]"' if items else f'"[" {ws}"]"'
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return terminal(number_spellings(v))
    return literal(json.dumps(v, ensure_ascii=False))
