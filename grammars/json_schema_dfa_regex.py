"""A DFA (json_schema_dfa.py) written back as regex text, by state elimination: the cheapest state (fewest
in x out edges) goes first, and the text grows under a cap (`TooComplex` past `MAX_REGEX_CHARS`: the caller
relaxes or narrows instead)."""

from __future__ import annotations

from dataclasses import dataclass

from .json_schema_charset import CharSet, regex_class
from .json_schema_dfa import Dfa, TooComplex

MAX_REGEX_CHARS = 40_000


@dataclass(frozen=True, eq=False)
class _Re:
    """A regex under construction: `kind` is "cls" (`chars`), "eps", "cat", "alt" or "star" (`parts`).
    Compared by identity: hashing big trees structurally is slow."""

    kind: str
    chars: CharSet | None = None
    parts: tuple[_Re, ...] = ()
    size: int = 1


_EPS = _Re("eps")


def _node(kind: str, parts: tuple[_Re, ...]) -> _Re:
    size = 1 + sum(p.size for p in parts)
    if size > MAX_REGEX_CHARS // 4:
        raise TooComplex("regex grows too large")
    return _Re(kind, parts=parts, size=size)


def _cat(a: _Re, b: _Re) -> _Re:
    if a.kind == "eps":
        return b
    if b.kind == "eps":
        return a
    left = a.parts if a.kind == "cat" else (a,)
    right = b.parts if b.kind == "cat" else (b,)
    return _node("cat", left + right)


def _alt(a: _Re | None, b: _Re) -> _Re:
    if a is None:
        return b
    items: list[_Re] = []
    for x in (a, b):
        items.extend(x.parts if x.kind == "alt" else (x,))
    chars = [x.chars for x in items if x.kind == "cls" and x.chars is not None]
    rest = list(dict.fromkeys(x for x in items if x.kind != "cls"))
    if chars:
        merged = chars[0]
        for c in chars[1:]:
            merged = merged.union(c)
        rest.insert(0, _Re("cls", merged))
    return rest[0] if len(rest) == 1 else _node("alt", tuple(rest))


def _star(a: _Re) -> _Re:
    if a.kind in ("eps", "star"):
        return a
    if a.kind == "alt" and _EPS in a.parts:
        inner = [x for x in a.parts if x != _EPS]
        return _star(inner[0] if len(inner) == 1 else _node("alt", tuple(inner)))
    return _node("star", (a,))


def _render(r: _Re, out: list[str]) -> None:
    if r.kind == "cls":
        assert r.chars is not None
        out.append(regex_class(r.chars))
    elif r.kind == "cat":
        for part in r.parts:
            _render(part, out) if part.kind != "alt" or _EPS in part.parts else _render_atom(part, out)
    elif r.kind == "alt":
        options = [x for x in r.parts if x != _EPS]
        if len(options) < len(r.parts):  # optional
            _render_atom(options[0] if len(options) == 1 else _Re("alt", parts=tuple(options)), out)
            out.append("?")
            return
        out.append("(?:")
        for i, x in enumerate(options):
            if i:
                out.append("|")
            _render(x, out)
        out.append(")")
    elif r.kind == "star":
        _render_atom(r.parts[0], out)
        out.append("*")


def _render_atom(r: _Re, out: list[str]) -> None:
    """`r` as one atom (something a quantifier can follow)."""
    if r.kind == "cls" or (r.kind == "alt" and _EPS not in r.parts):
        _render(r, out)
        return
    out.append("(?:")
    _render(r, out)
    out.append(")")


def to_regex(dfa: Dfa) -> str:
    """Regex text (`/` escaped) for the language of `dfa` (not empty); `TooComplex` past the size limit."""
    live = _live(dfa)
    if 0 not in live:
        raise TooComplex("empty language")  # callers check emptiness first
    start, final = -1, -2
    edges: dict[int, dict[int, _Re]] = {start: {0: _EPS}}
    for s in live:
        by_target: dict[int, CharSet] = {}
        for i, t in enumerate(dfa.trans[s]):
            if t in live:
                cs = dfa.symbol_set(i)
                by_target[t] = by_target[t].union(cs) if t in by_target else cs
        row: dict[int, _Re] = {t: _Re("cls", cs) for t, cs in by_target.items() if not cs.is_empty()}
        if s in dfa.accepting:
            row[final] = _EPS
        edges[s] = row
    incoming: dict[int, set[int]] = {s: set() for s in [*live, final]}
    for p, row in edges.items():
        for q in row:
            incoming[q].add(p)
    remaining = set(live)
    total = sum(label.size for row in edges.values() for label in row.values())
    while remaining:
        k = min(remaining, key=lambda st: (len(incoming[st] - {st}) * len(set(edges[st]) - {st}), st))
        remaining.discard(k)
        row_k = edges.pop(k)
        loop = row_k.pop(k, None)
        middle = _star(loop) if loop is not None else _EPS
        for p in incoming.pop(k) - {k}:
            row_p = edges[p]
            into = row_p.pop(k)
            total -= into.size
            for q, out_label in row_k.items():
                old = row_p.get(q)
                row_p[q] = _alt(old, _cat(_cat(into, middle), out_label))
                total += row_p[q].size - (old.size if old is not None else 0)
                incoming[q].add(p)
            if total > MAX_REGEX_CHARS:
                raise TooComplex("regex grows too large")
        for q in row_k:
            incoming[q].discard(k)
    result = edges[start].get(final)
    if result is None:
        raise TooComplex("empty language")
    out: list[str] = []
    _render(result, out)
    text = "".join(out)
    if len(text) > MAX_REGEX_CHARS:
        raise TooComplex("regex text too long")
    return text


def _live(dfa: Dfa) -> set[int]:
    """States reachable from the start from which an accepting state is reachable."""
    reach, stack = {0}, [0]
    while stack:
        for t in dfa.trans[stack.pop()]:
            if t not in reach:
                reach.add(t)
                stack.append(t)
    back: dict[int, set[int]] = {}
    for s in reach:
        for t in dfa.trans[s]:
            back.setdefault(t, set()).add(s)
    live = {s for s in reach if s in dfa.accepting}
    stack = list(live)
    while stack:
        for p in back.get(stack.pop(), ()):
            if p not in live:
                live.add(p)
                stack.append(p)
    return live
