"""GBNF text for the JSON Schema compiler: literals, `/regex/` terminals, groups, and the key characters
that step off a trie of property names."""

from __future__ import annotations

from .json_schema_charset import JSON_RAW, CharSet, regex_char, regex_class


def literal(text: str) -> str:
    """A GBNF string literal matching `text` exactly."""
    out = []
    for ch in text:
        cp = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif cp < 0x20 or cp == 0x7F:
            out.append(f"\\x{cp:02x}")
        elif not ch.isprintable():
            out.append(f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def terminal(regex: str) -> str:
    """A GBNF `/.../` regex terminal (every `/` in `regex` is already escaped)."""
    return "/" + regex + "/"


def alternation(parts: list[str]) -> str:
    parts = list(dict.fromkeys(parts))
    return parts[0] if len(parts) == 1 else "( " + " | ".join(parts) + " )"


def quantifier(lo: int, hi: int | None) -> str:
    if hi is None:
        return {0: "*", 1: "+"}.get(lo, f"{{{lo},}}")
    if (lo, hi) == (0, 1):
        return "?"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def escape_pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def rule_hint(ptr: str, kind: str) -> str:
    last = ptr.rsplit("/", 1)[-1] if ptr else ""
    return f"{last}-{kind}" if last and not last.isdigit() else kind


_SHORT_DECODED = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\", "/": "/"}


def other_char(children: list[str]) -> str:
    """Regex for one JSON-spelled character that is none of `children`: raw, a short escape, or \\u00XX of a
    control character (the only `\\u` escapes allowed here, so a name's character cannot be re-spelled)."""
    raw = CharSet.chars("".join(children)).complement().intersect(JSON_RAW)
    alts = [regex_class(raw)]
    short = "".join(c for c in 'bfnrt"\\/' if _SHORT_DECODED[c] not in children)
    if short:
        alts.append(f"\\\\[{regex_class_body(short)}]")
    controls = [cp for cp in range(0x20) if chr(cp) not in children]
    if len(controls) == 0x20:
        alts.append("\\\\u00[01][0-9a-fA-F]")
    elif controls:
        alts.append("\\\\u00(?:" + "|".join(f"{cp:02x}" if cp < 10 or cp in range(16, 26) else
                                              f"{cp >> 4}[{cp & 15:x}{cp & 15:X}]" for cp in controls) + ")")
    return "(?:" + "|".join(alts) + ")"


def regex_class_body(chars: str) -> str:
    return "".join(regex_char(ord(c)) for c in chars)
