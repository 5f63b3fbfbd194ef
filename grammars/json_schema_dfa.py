"""Regular languages over JSON text as small DFAs, for what one regex of a schema cannot say alone: a key that
matches no `patternProperties` pattern, a `pattern` together with a `format` or a length, an integer range that
is also a multiple. Languages are built from regex text (`dfa_of`), combined (`intersect`, `subtract`,
`unite`), and written back as regex text (json_schema_dfa_regex.py), so the result is still one `/.../`
terminal of the emitted grammar. Every step has a size cap (`TooComplex`), so a hard schema costs a relaxation,
never minutes.

A `Dfa` is complete over all code points, which are cut into intervals (its symbols). Complements are taken
inside `canonical_body()`, the string bodies `json.dumps(..., ensure_ascii=False)` writes (one spelling per
character), so "no pattern matches this key" is decided on the decoded text exactly.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .json_schema_charset import CharSet

try:
    import re._constants as sre_c
    import re._parser as sre_parse
except ImportError:  # Python 3.10
    import sre_constants as sre_c
    import sre_parse

MAX_STATES = 2_000  # of any DFA built here
MAX_NFA_STATES = 20_000
_END = 0x110000

# One character as json.dumps(ensure_ascii=False) spells it: raw, a short escape, or \u00xx (lowercase) for
# the other control characters.
CANONICAL_CHAR = r'(?:[^"\\\x00-\x1f]|\\["\\bfnrt]|\\u00(?:0[0-7bef]|1[0-9a-f]))'


class TooComplex(ValueError):
    """An automaton or its regex text grew past the limits."""


@dataclass(frozen=True, eq=False)
class Dfa:
    """A complete DFA: symbol i is the code points [bounds[i], bounds[i + 1]) (the last runs to U+10FFFF);
    `trans[s][i]` is the next state; state 0 is the start."""

    bounds: tuple[int, ...]
    trans: tuple[tuple[int, ...], ...]
    accepting: frozenset[int]

    def symbol_set(self, i: int) -> CharSet:
        hi = self.bounds[i + 1] - 1 if i + 1 < len(self.bounds) else _END - 1
        return CharSet.of((self.bounds[i], hi))

    def accepts(self, text: str) -> bool:
        state = 0
        for ch in text:
            state = self.trans[state][bisect_right(self.bounds, ord(ch)) - 1]
        return state in self.accepting


# ---- regex text -> DFA -----------------------------------------------------------------------------------
def dfa_of(regex: str) -> Dfa:
    """The minimal DFA of a regex in the dialect the grammar's terminals use (Python syntax, full match)."""
    out = _fsm_or_failure(regex)
    if isinstance(out, TooComplex):
        raise TooComplex(str(out))
    return out


@lru_cache(maxsize=512)
def _fsm_or_failure(regex: str) -> Dfa | TooComplex:
    """`dfa_of`, with its failure cached too (a regex too complex to combine fails after a second of work)."""
    nfa = _Nfa()
    try:
        start, end = nfa.build(list(sre_parse.parse(regex)))
        return _minimize(_determinize(nfa, start, end))
    except TooComplex as exc:
        return exc


class _Nfa:
    """Thompson NFA: per state, character edges (CharSet, target) and epsilon edges."""

    def __init__(self) -> None:
        self.edges: list[list[tuple[CharSet, int]]] = []
        self.eps: list[list[int]] = []

    def new(self) -> int:
        if len(self.edges) >= MAX_NFA_STATES:
            raise TooComplex("regex too large to combine")
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1

    def build(self, items: list[tuple[Any, Any]]) -> tuple[int, int]:
        start = cur = self.new()
        for op, av in items:
            cur = self.item(op, av, cur)
        return start, cur

    def item(self, op: Any, av: Any, cur: int) -> int:
        if op in (sre_c.LITERAL, sre_c.NOT_LITERAL, sre_c.ANY, sre_c.IN):
            nxt = self.new()
            self.edges[cur].append((_char_set(op, av), nxt))
            return nxt
        if op == sre_c.SUBPATTERN:
            return self.chain(list(av[3]), cur)
        if op == sre_c.BRANCH:
            nxt = self.new()
            for alt in av[1]:
                self.eps[self.chain(list(alt), cur)].append(nxt)
            return nxt
        if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            lo, hi, sub = av
            items = list(sub)
            for _ in range(lo):
                cur = self.chain(items, cur)
            if hi >= sre_c.MAXREPEAT:
                loop = self.new()
                self.eps[cur].append(loop)
                self.eps[self.chain(items, loop)].append(loop)
                return loop
            ends = [cur]
            for _ in range(hi - lo):
                cur = self.chain(items, cur)
                ends.append(cur)
            nxt = self.new()
            for e in ends:
                self.eps[e].append(nxt)
            return nxt
        raise TooComplex(f"regex construct {op} is not combined")

    def chain(self, items: list[tuple[Any, Any]], cur: int) -> int:
        entry = self.new()
        self.eps[cur].append(entry)
        for op, av in items:
            entry = self.item(op, av, entry)
        return entry


_ASCII_CATEGORIES = {
    sre_c.CATEGORY_DIGIT: CharSet.of((0x30, 0x39)),
    sre_c.CATEGORY_WORD: CharSet.of((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
    sre_c.CATEGORY_SPACE: CharSet.of((0x09, 0x0D), (0x20, 0x20)),
}


def _char_set(op: Any, av: Any) -> CharSet:
    if op == sre_c.LITERAL:
        return CharSet.of((av, av))
    if op == sre_c.NOT_LITERAL:
        return CharSet.of((av, av)).complement()
    if op == sre_c.ANY:
        return CharSet.of((0x0A, 0x0A)).complement()
    cs, negate = CharSet(()), False
    for item_op, item_av in av:
        if item_op == sre_c.NEGATE:
            negate = True
        elif item_op == sre_c.LITERAL:
            cs = cs.union(CharSet.of((item_av, item_av)))
        elif item_op == sre_c.RANGE:
            cs = cs.union(CharSet.of(item_av))
        elif item_op == sre_c.CATEGORY and item_av in _ASCII_CATEGORIES:
            cs = cs.union(_ASCII_CATEGORIES[item_av])
        else:
            raise TooComplex(f"character class item {item_op} is not combined")
    return cs.complement() if negate else cs


def _bounds_of(sets: list[CharSet]) -> tuple[int, ...]:
    cuts = {0}
    for cs in sets:
        for lo, hi in cs.ranges:
            cuts.add(lo)
            if hi + 1 < _END:
                cuts.add(hi + 1)
    return tuple(sorted(cuts))


def _symbols_of(cs: CharSet, bounds: tuple[int, ...]) -> list[int]:
    out: list[int] = []
    for lo, hi in cs.ranges:
        out.extend(range(bisect_right(bounds, lo) - 1, bisect_right(bounds, hi)))
    return out


def _determinize(nfa: _Nfa, start: int, end: int) -> Dfa:
    bounds = _bounds_of([cs for row in nfa.edges for cs, _ in row])
    moves: list[list[tuple[list[int], int]]] = [[(_symbols_of(cs, bounds), t) for cs, t in row] for row in nfa.edges]

    def closure(states: set[int]) -> frozenset[int]:
        stack, seen = list(states), set(states)
        while stack:
            for t in nfa.eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)

    dead: frozenset[int] = frozenset()
    ids: dict[frozenset[int], int] = {closure({start}): 0}
    order = [closure({start})]
    trans: list[tuple[int, ...]] = []
    i = 0
    while i < len(order):
        targets: list[set[int]] = [set() for _ in bounds]
        for s in order[i]:
            for symbols, t in moves[s]:
                for sym in symbols:
                    targets[sym].add(t)
        row = []
        for tset in targets:
            nxt = closure(tset) if tset else dead
            if nxt not in ids:
                if len(order) >= MAX_STATES:
                    raise TooComplex("automaton too large")
                ids[nxt] = len(order)
                order.append(nxt)
            row.append(ids[nxt])
        trans.append(tuple(row))
        i += 1
    return Dfa(bounds, tuple(trans), frozenset(j for j, st in enumerate(order) if end in st))


def _minimize(dfa: Dfa) -> Dfa:
    """The minimal DFA of the states reachable from the start (Moore's partition refinement)."""
    reach = {0}
    stack = [0]
    while stack:
        for t in dfa.trans[stack.pop()]:
            if t not in reach:
                reach.add(t)
                stack.append(t)
    states = sorted(reach)
    block = {s: int(s in dfa.accepting) for s in states}
    n_blocks = len(set(block.values()))
    while True:
        signature = {s: (block[s], tuple(block[t] for t in dfa.trans[s])) for s in states}
        numbering: dict[tuple[int, tuple[int, ...]], int] = {}
        for s in states:
            numbering.setdefault(signature[s], len(numbering))
        new_block = {s: numbering[signature[s]] for s in states}
        if len(numbering) == n_blocks:
            break
        block, n_blocks = new_block, len(numbering)
    start_block = block[0]
    renumber = {start_block: 0}
    for s in states:
        renumber.setdefault(block[s], len(renumber))
    trans: list[tuple[int, ...] | None] = [None] * len(renumber)
    for s in states:
        b = renumber[block[s]]
        if trans[b] is None:
            trans[b] = tuple(renumber[block[t]] for t in dfa.trans[s])
    accepting = frozenset(renumber[block[s]] for s in states if s in dfa.accepting)
    rows = tuple(r for r in trans if r is not None)
    return _merge_symbols(Dfa(dfa.bounds, rows, accepting))


def _merge_symbols(dfa: Dfa) -> Dfa:
    """Adjacent symbols every state treats alike become one."""
    keep = [0] + [i for i in range(1, len(dfa.bounds)) if any(row[i] != row[i - 1] for row in dfa.trans)]
    if len(keep) == len(dfa.bounds):
        return dfa
    return Dfa(tuple(dfa.bounds[i] for i in keep), tuple(tuple(row[i] for i in keep) for row in dfa.trans),
               dfa.accepting)


# ---- set operations ------------------------------------------------------------------------------------
def _product(a: Dfa, b: Dfa, accept: Callable[[bool, bool], bool]) -> Dfa:
    bounds = tuple(sorted(set(a.bounds) | set(b.bounds)))
    sym_a = [bisect_right(a.bounds, x) - 1 for x in bounds]
    sym_b = [bisect_right(b.bounds, x) - 1 for x in bounds]
    ids: dict[tuple[int, int], int] = {(0, 0): 0}
    order = [(0, 0)]
    trans: list[tuple[int, ...]] = []
    i = 0
    while i < len(order):
        sa, sb = order[i]
        row_a, row_b = a.trans[sa], b.trans[sb]
        row = []
        for k in range(len(bounds)):
            pair = (row_a[sym_a[k]], row_b[sym_b[k]])
            if pair not in ids:
                if len(order) >= MAX_STATES * 4:
                    raise TooComplex("product automaton too large")
                ids[pair] = len(order)
                order.append(pair)
            row.append(ids[pair])
        trans.append(tuple(row))
        i += 1
    accepting = frozenset(j for j, (x, y) in enumerate(order) if accept(x in a.accepting, y in b.accepting))
    return _minimize(Dfa(bounds, tuple(trans), accepting))


def intersect(a: Dfa, b: Dfa) -> Dfa:
    return _product(a, b, lambda x, y: x and y)


def subtract(a: Dfa, b: Dfa) -> Dfa:
    return _product(a, b, lambda x, y: x and not y)


def unite(a: Dfa, b: Dfa) -> Dfa:
    return _product(a, b, lambda x, y: x or y)


def checked(dfa: Dfa) -> Dfa:
    """`dfa` minimized, refused past `MAX_STATES`."""
    out = _minimize(dfa)
    if len(out.trans) > MAX_STATES:
        raise TooComplex(f"automaton of {len(out.trans)} states")
    return out


def is_empty(dfa: Dfa) -> bool:
    seen, stack = {0}, [0]
    while stack:
        s = stack.pop()
        if s in dfa.accepting:
            return False
        for t in dfa.trans[s]:
            if t not in seen:
                seen.add(t)
                stack.append(t)
    return True


def canonical_body() -> Dfa:
    return dfa_of(CANONICAL_CHAR + "*")


def literal_dfa(texts: list[str]) -> Dfa:
    """The DFA accepting exactly the given strings: their trie."""
    chars = sorted({ord(c) for t in texts for c in t})
    bounds = _bounds_of([CharSet.of((c, c)) for c in chars])
    nodes: list[dict[int, int]] = [{}]
    finals = set()
    for text in texts:
        state = 0
        for ch in text:
            sym = bisect_right(bounds, ord(ch)) - 1
            if sym not in nodes[state]:
                nodes[state][sym] = len(nodes)
                nodes.append({})
            state = nodes[state][sym]
        finals.add(state)
    dead = len(nodes)
    trans = tuple(tuple(node.get(i, dead) for i in range(len(bounds))) for node in nodes)
    return _minimize(Dfa(bounds, (*trans, (dead,) * len(bounds)), frozenset(finals)))


def table_dfa(chars: str, table: dict[int, dict[str, int]], finals: set[int]) -> Dfa:
    """The DFA of a transition table over single characters (missing moves: rejected); state 0 starts."""
    bounds = _bounds_of([CharSet.of((ord(c), ord(c))) for c in chars])
    states = sorted(table)
    index = {s: i for i, s in enumerate(states)}
    dead = len(states)
    rows = []
    for s in states:
        row = [dead] * len(bounds)
        for ch, t in table[s].items():
            row[bisect_right(bounds, ord(ch)) - 1] = index[t]
        rows.append(tuple(row))
    rows.append((dead,) * len(bounds))
    return checked(Dfa(bounds, tuple(rows), frozenset(index[f] for f in finals)))
