"""Sets of Unicode characters and their spelling inside a JSON string, as Python-regex text.

JSON Schema constrains the *decoded* string (`pattern`, `format`, `minLength`), but the grammar matches the
*encoded* text between the quotes. Every decoded character therefore becomes the set of its accepted
spellings: the raw character where JSON allows it, else its escape (`\\"`, `\\\\`, `\\n`, `\\u001f`; control
characters in their short and `\\u00XX` forms). Each spelling is one decoded character, so a length or a
pattern over the decoded text stays exact; other spellings (`\\u0041` for `A`) are refused, never misjudged.

The regex text produced here is the dialect `interegular` parses (the core's `/.../` terminals): non-ASCII
characters are written raw, because `interegular` does not read `\\uXXXX` escapes.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_CODEPOINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)

# Escapes JSON defines with a short form; every other control character is written \u00XX.
_SHORT_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
_REGEX_SPECIAL = set("\\^$.|?*+()[]{}-/\"'#&~ ")


@dataclass(frozen=True)
class CharSet:
    """A set of code points as sorted, disjoint, non-adjacent inclusive ranges; surrogates never included."""

    ranges: tuple[tuple[int, int], ...]

    @staticmethod
    def of(*ranges: tuple[int, int]) -> CharSet:
        return CharSet(_normalize(list(ranges)))

    @staticmethod
    def chars(text: str) -> CharSet:
        return CharSet.of(*((ord(c), ord(c)) for c in text))

    def union(self, other: CharSet) -> CharSet:
        return CharSet(_normalize(list(self.ranges) + list(other.ranges)))

    def complement(self) -> CharSet:
        out, start = [], 0
        for lo, hi in self.ranges:
            if lo > start:
                out.append((start, lo - 1))
            start = hi + 1
        if start <= MAX_CODEPOINT:
            out.append((start, MAX_CODEPOINT))
        return CharSet(_normalize(out))

    def minus(self, other: CharSet) -> CharSet:
        return self.intersect(other.complement())

    def intersect(self, other: CharSet) -> CharSet:
        out, i, j = [], 0, 0
        a, b = self.ranges, other.ranges
        while i < len(a) and j < len(b):
            lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
            if lo <= hi:
                out.append((lo, hi))
            if a[i][1] < b[j][1]:
                i += 1
            else:
                j += 1
        return CharSet(tuple(out))

    def __contains__(self, cp: int) -> bool:
        return any(lo <= cp <= hi for lo, hi in self.ranges)

    def is_empty(self) -> bool:
        return not self.ranges


def _normalize(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    pieces: list[tuple[int, int]] = []
    for lo, hi in ranges:  # cut the surrogate block out: it has no UTF-8 spelling
        if hi < SURROGATES[0] or lo > SURROGATES[1]:
            pieces.append((lo, hi))
            continue
        if lo < SURROGATES[0]:
            pieces.append((lo, SURROGATES[0] - 1))
        if hi > SURROGATES[1]:
            pieces.append((SURROGATES[1] + 1, hi))
    pieces.sort()
    out: list[tuple[int, int]] = []
    for lo, hi in pieces:
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


ALL = CharSet.of((0, MAX_CODEPOINT))
DIGIT = CharSet.of((0x30, 0x39))
WORD = CharSet.of((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
# ECMA-262 WhiteSpace and LineTerminator (what JSON Schema's `\s` means).
SPACE = CharSet.of((0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                   (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF))
LINE_TERMINATORS = CharSet.of((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))
# Characters JSON lets a string hold unescaped.
JSON_RAW = ALL.minus(CharSet.of((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)))
_CONTROLS = CharSet.of((0x00, 0x1F))


def regex_char(cp: int) -> str:
    """One code point as regex text that matches exactly it (inside or outside a class)."""
    ch = chr(cp)
    if cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02x}"
    if ch in _REGEX_SPECIAL:
        return "\\" + ch
    return ch


def regex_class(cs: CharSet) -> str:
    """A regex character class for `cs` (negated when that is shorter)."""
    if len(cs.ranges) == 1 and cs.ranges[0][0] == cs.ranges[0][1]:
        return regex_char(cs.ranges[0][0])
    comp = cs.complement()
    negate = len(comp.ranges) < len(cs.ranges)
    body = "".join(
        regex_char(lo) if lo == hi else f"{regex_char(lo)}-{regex_char(hi)}"
        for lo, hi in (comp.ranges if negate else cs.ranges)
    )
    return f"[{'^' if negate else ''}{body}]"


def _escape_spelling(cp: int) -> str:
    """The JSON escape of a character that cannot appear raw, as regex text."""
    short = _SHORT_ESCAPES.get(cp)
    if short is not None:
        return "".join(regex_char(ord(c)) for c in short)
    hexs = f"{cp:04x}"
    return "\\\\u" + "".join(c if c.isdigit() else f"[{c}{c.upper()}]" for c in hexs)


def json_encoded(cs: CharSet) -> str:
    """Regex text matching a JSON spelling of one character of `cs` (which must not be empty).

    Raw where JSON allows it; otherwise its escape. Control characters (U+0000-U+001F) are matched as one
    group accepting both their `\\u00XX` and short (`\\n`) spellings: several spellings of a character, each
    still one character, so lengths stay exact.
    """
    parts = []
    raw = cs.intersect(JSON_RAW)
    if not raw.is_empty():
        parts.append(regex_class(raw))
    escaped = cs.minus(JSON_RAW)
    controls = [cp for lo, hi in escaped.intersect(_CONTROLS).ranges for cp in range(lo, hi + 1)]
    if len(controls) > 2:
        parts.append(_controls_spelling(controls))
        escaped = escaped.minus(_CONTROLS)
    for lo, hi in escaped.ranges:
        parts.extend(_escape_spelling(cp) for cp in range(lo, hi + 1))
    if not parts:
        raise ValueError("empty character set has no JSON spelling")
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def _controls_spelling(controls: list[int]) -> str:
    """`\\` then a short escape letter or `u00XX` (either hex case) for the given control code points."""
    letters = "".join(ch for ch, cp in (("b", 8), ("t", 9), ("n", 10), ("f", 12), ("r", 13)) if cp in controls)
    groups = []
    for high in (0, 1):
        lows = [cp & 0xF for cp in controls if cp >> 4 == high]
        if lows:
            digits = "".join(f"{d:x}" + (f"{d:X}" if d > 9 else "") for d in lows)
            groups.append(f"{high}[{digits}]")
    alts = ([f"[{letters}]"] if letters else []) + ["u00(?:" + "|".join(groups) + ")"]
    return "\\\\(?:" + "|".join(alts) + ")"


# Any one character of a JSON string, in any spelling JSON allows, but never half a surrogate pair: `\uD83D`
# alone would count as one character of a `maxLength` while decoding to part of one. No raw `/`: the text goes
# inside a `/.../` terminal.
ANY_JSON_CHAR = (
    r'(?:[^"\\\x00-\x1f]|\\(?:["\\\/bfnrt]|u(?:[0-9a-ce-fA-CE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})))'
)
