"""Test-only oracle: the GBNF text `json_schema_to_ebnf` emits, translated to a Lark grammar and parsed with
Lark's Earley parser, so schema conversions are checked independently of radixgen's own matcher.

Handles exactly the dialect subset the converter writes: one rule per line, literals, `/regex/` terminals,
rule names, `( )`, `|`, `* + ?` and `{m}`, `{m,}`, `{m,n}`.
"""

from __future__ import annotations

import re
from functools import lru_cache

import lark

_TOKEN = re.compile(r'\s*(?:("(?:[^"\\]|\\.)*")|(/(?:[^/\\]|\\.)*/)|([A-Za-z_][A-Za-z0-9_-]*)|(\{[0-9,]+\})'
                    r'|([()|*+?]))')
_GBNF_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "'": "'", "[": "[", "]": "]", "-": "-",
                 "/": "/"}


def _unescape_literal(body: str) -> str:
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[nxt]
            out.append(chr(int(body[i + 2: i + 2 + width], 16)))
            i += 2 + width
        else:
            out.append(_GBNF_ESCAPES[nxt])
            i += 2
    return "".join(out)


def _lark_regex(pattern: str) -> str:
    if re.fullmatch(pattern, ""):
        raise ValueError(f"empty-matching terminal /{pattern}/ (only `ws` may match empty)")
    return "/(?p)" + pattern + "/"  # POSIX leftmost-longest: Lark's lexer only tries prefixes of one match


def gbnf_to_lark(text: str) -> str:
    """Lark grammar text (start rule `start`) equivalent to the converter's GBNF."""
    rules = [line.split(" ::= ", 1) for line in text.split("\n") if line.strip()]
    names = {name: f"r{i}" for i, (name, _) in enumerate(rules)}
    out = []
    for name, body in rules:
        out.append(f"{names[name]}: {_translate(body, names)}")
    out.append(f"start: {names['root']}")
    return "\n".join(out)


def _translate(body: str, names: dict[str, str]) -> str:
    tokens, pos = [], 0
    while pos < len(body.rstrip()):
        m = _TOKEN.match(body, pos)
        if not m:
            raise ValueError(f"cannot read GBNF at {body[pos:pos + 30]!r}")
        tokens.append(m.group(m.lastindex))
        pos = m.end()
    out: list[str] = []  # translated atoms; quantifiers rewrite the last atom
    stack: list[list[str]] = []
    for tok in tokens:
        if tok == "(":
            stack.append(out)
            out = []
        elif tok == ")":
            inner = " ".join(out)
            out = stack.pop()
            out.append(f"({inner})")
        elif tok == "|":
            out.append("|")
        elif tok in ("*", "+", "?"):
            out[-1] = f"{out[-1]}{tok}"
        elif tok.startswith("{"):
            atom = out[-1]
            lo, _, hi = tok[1:-1].partition(",")
            if "," not in tok:
                out[-1] = f"{atom} ~ {lo}" if int(lo) > 0 else ""
            elif hi == "":
                out[-1] = (f"({atom} ~ {lo}) " if int(lo) > 0 else "") + f"{atom}*"
            else:
                out[-1] = f"[{atom} ~ {max(int(lo), 1)}..{hi}]" if int(lo) == 0 else f"{atom} ~ {lo}..{hi}"
        elif tok.startswith('"'):
            text = _unescape_literal(tok[1:-1])
            # a backslash as a class: Lark's loader mangles an escaped backslash followed by a quote
            out.append(_lark_regex("".join("[\\\\]" if c == "\\" else re.escape(c).replace("/", "\\/")
                                           for c in text)))
        elif tok.startswith("/"):
            pattern = tok[1:-1]
            if re.fullmatch(pattern, ""):  # the flexible-whitespace rule: make it optional instead
                m = re.fullmatch(r"(.*)\{0,(\d+)\}", pattern)
                assert m, pattern
                out.append(f"[/(?p){m.group(1)}{{1,{m.group(2)}}}/]")
            else:
                out.append(_lark_regex(pattern))
        else:
            out.append(names[tok])
    return " ".join(x for x in out if x) or '""'


@lru_cache(maxsize=64)
def lark_parser(gbnf: str) -> lark.Lark:
    return lark.Lark(gbnf_to_lark(gbnf), parser="earley", lexer="dynamic_complete", start="start",
                     regex=True)


def accepts(gbnf: str, text: str) -> bool:
    """Whether the grammar derives exactly `text`."""
    try:
        lark_parser(gbnf).parse(text)
    except (lark.exceptions.UnexpectedInput, lark.exceptions.UnexpectedEOF):
        return False
    return True
