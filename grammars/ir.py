"""The one grammar IR every front end (EBNF, Lark, JSON Schema via EBNF) produces.

A grammar is a set of named rules; a rule body is an expression over terminals (byte-level DFAs), rule
references and token references (one token id, not text: resolved into terminals against a vocabulary by
token_refs.py before `normalize`). `normalize` removes direct left recursion (rewriting `A ::= A x | y` to
`A ::= y x*`) and refuses what the pushdown matcher cannot run: undefined rules, indirect left recursion, an
unproductive start rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from radixgen.grammars.bytedfa import ByteDFA, dfa_from_bytes
from radixgen.grammars.errors import GrammarError


@dataclass(frozen=True, eq=False)
class Terminal:
    """Bytes matched by one DFA; `label` is for error messages and debugging only."""

    dfa: ByteDFA
    label: str = ""


@dataclass(frozen=True)
class RuleRef:
    name: str


@dataclass(frozen=True)
class Seq:
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Expr, ...]


@dataclass(frozen=True)
class Repeat:
    """`item` between `min` and `max` times; `max=None` is unbounded."""

    item: Expr
    min: int
    max: int | None


@dataclass(frozen=True)
class Graph:
    """Alternatives of sequences with shared parts, as an acyclic automaton over expressions: paths from node
    0 to node `end`, each edge `(from, expr, to)` reading `expr`. Front ends use it where expanding optional
    items would list exponentially many alternatives (lark's BNF output does)."""

    edges: tuple[tuple[int, Expr, int], ...]
    end: int


@dataclass(frozen=True)
class TokenRef:
    """One token rather than text (token_refs.py): one of `ids`, or the token spelling `name` in the vocabulary
    (`fallback`: the text `name` itself where the vocabulary has no such token). Front ends write it as
    `written`; `token_refs.resolve_token_refs` turns it into a terminal against a vocabulary."""

    written: str
    ids: tuple[int, ...] = ()
    name: str | None = None
    fallback: bool = False


Expr = Terminal | RuleRef | Seq | Alt | Repeat | Graph | TokenRef

EMPTY = Seq(())
_ONE_TOKEN = dfa_from_bytes(b"\xff")  # stands for a token reference when deriving (never empty)


def map_children(expr: Expr, fn: Callable[[Expr], Expr]) -> Expr:
    """`expr` rebuilt with `fn` applied to each direct sub-expression; leaves (terminals, rule and token
    references) as they are. The one walk of the rewriting passes (pda.py, token_refs.py)."""
    if isinstance(expr, Seq):
        return Seq(tuple(fn(e) for e in expr.items))
    if isinstance(expr, Alt):
        return Alt(tuple(fn(e) for e in expr.options))
    if isinstance(expr, Repeat):
        return Repeat(fn(expr.item), expr.min, expr.max)
    if isinstance(expr, Graph):
        return Graph(tuple((a, fn(e), b) for a, e, b in expr.edges), expr.end)
    return expr


@dataclass
class GrammarIR:
    rules: dict[str, Expr] = field(default_factory=dict)
    start: str = "root"


def _options(expr: Expr) -> tuple[Expr, ...]:
    return expr.options if isinstance(expr, Alt) else (expr,)


def _split_head(expr: Expr) -> tuple[Expr | None, Expr]:
    """(first item, rest) of a sequence-like expression; (None, expr) when it has no first item."""
    if isinstance(expr, Seq):
        if not expr.items:
            return None, expr
        return expr.items[0], Seq(expr.items[1:])
    return expr, EMPTY


def _graph_reach(graph: Graph, passable) -> set[int]:  # type: ignore[no-untyped-def]
    """Nodes reachable from node 0 over edges whose expression satisfies `passable`."""
    seen = {0}
    work = [0]
    while work:
        u = work.pop()
        for a, e, b in graph.edges:
            if a == u and b not in seen and passable(e):
                seen.add(b)
                work.append(b)
    return seen


def _refs(expr: Expr) -> set[str]:
    if isinstance(expr, Graph):
        return set().union(*(_refs(e) for _, e, _ in expr.edges)) if expr.edges else set()
    if isinstance(expr, RuleRef):
        return {expr.name}
    if isinstance(expr, Seq):
        return set().union(*(_refs(e) for e in expr.items)) if expr.items else set()
    if isinstance(expr, Alt):
        return set().union(*(_refs(e) for e in expr.options))
    if isinstance(expr, Repeat):
        return _refs(expr.item)
    return set()


def _derives(expr: Expr, rules: set[str], terminal: Callable[[ByteDFA], bool]) -> bool:
    """Whether `expr` derives a string of the kind `terminal` says a terminal derives, given the rules known to
    (the empty string: nullable; any string at all: productive)."""
    if isinstance(expr, Graph):
        return expr.end in _graph_reach(expr, lambda e: _derives(e, rules, terminal))
    if isinstance(expr, Terminal):
        return terminal(expr.dfa)
    if isinstance(expr, TokenRef):  # one token: some bytes, never none
        return terminal(_ONE_TOKEN)
    if isinstance(expr, RuleRef):
        return expr.name in rules
    if isinstance(expr, Seq):
        return all(_derives(e, rules, terminal) for e in expr.items)
    if isinstance(expr, Alt):
        return any(_derives(e, rules, terminal) for e in expr.options)
    return expr.min == 0 or _derives(expr.item, rules, terminal)


def _nullable(expr: Expr, nullable_rules: set[str]) -> bool:
    return _derives(expr, nullable_rules, ByteDFA.accepts_empty)


def _productive(expr: Expr, productive_rules: set[str]) -> bool:
    return _derives(expr, productive_rules, lambda dfa: bool(dfa.accepting.any()))


def _left_refs(expr: Expr, nullable_rules: set[str]) -> set[str]:
    """Rules that can be entered before any byte of `expr` is read."""
    if isinstance(expr, Graph):
        starts = _graph_reach(expr, lambda e: _nullable(e, nullable_rules))
        return set().union(*(_left_refs(e, nullable_rules) for a, e, _ in expr.edges if a in starts))
    if isinstance(expr, RuleRef):
        return {expr.name}
    if isinstance(expr, Seq):
        out: set[str] = set()
        for e in expr.items:
            out |= _left_refs(e, nullable_rules)
            if not _nullable(e, nullable_rules):
                break
        return out
    if isinstance(expr, Alt):
        return set().union(*(_left_refs(e, nullable_rules) for e in expr.options))
    if isinstance(expr, Repeat):
        return _left_refs(expr.item, nullable_rules)
    return set()


def _remove_direct_left_recursion(name: str, body: Expr) -> Expr:
    recursive: list[Expr] = []
    base: list[Expr] = []
    for option in _options(body):
        head, rest = _split_head(option)
        (recursive if head == RuleRef(name) else base).append(rest if head == RuleRef(name) else option)
    if not recursive:
        return body
    if not base:
        raise GrammarError(f"rule {name!r} is left-recursive with no non-recursive alternative")
    base_expr = base[0] if len(base) == 1 else Alt(tuple(base))
    tail = recursive[0] if len(recursive) == 1 else Alt(tuple(recursive))
    return Seq((base_expr, Repeat(tail, 0, None)))


def _least_fixpoint(rules: dict[str, Expr], holds: Callable[[Expr, set[str]], bool]) -> set[str]:
    """The rules for which `holds(body, known)` becomes true, iterating until nothing changes (nullable and
    productive rules are both such least fixpoints)."""
    known: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, body in rules.items():
            if name not in known and holds(body, known):
                known.add(name)
                changed = True
    return known

def normalize(ir: GrammarIR) -> GrammarIR:
    """Check references, remove direct left recursion, refuse indirect left recursion; returns a new IR."""
    if ir.start not in ir.rules:
        raise GrammarError(f"start rule {ir.start!r} is not defined")
    for name, body in ir.rules.items():
        missing = _refs(body) - ir.rules.keys()
        if missing:
            raise GrammarError(f"rule {name!r} refers to undefined rule(s): {', '.join(sorted(missing))}")
    rules = {name: _remove_direct_left_recursion(name, body) for name, body in ir.rules.items()}

    nullable = _least_fixpoint(rules, _nullable)
    left = {name: _left_refs(body, nullable) for name, body in rules.items()}
    for name in rules:
        # Depth-first search for a path of left calls from `name` back to itself.
        stack, seen = list(left[name]), set()
        while stack:
            r = stack.pop()
            if r == name:
                raise GrammarError(f"rule {name!r} is left-recursive through other rules; rewrite it with "
                                   f"repetition (x*) or right recursion")
            if r not in seen:
                seen.add(r)
                stack.extend(left[r])

    productive = _least_fixpoint(rules, _productive)
    if ir.start not in productive:
        raise GrammarError(f"start rule {ir.start!r} cannot derive any finite text")
    return GrammarIR(rules, ir.start)
