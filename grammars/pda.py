"""Grammar IR -> pushdown automaton tables: one determinized byte automaton per rule, with call edges.

Each rule body becomes a Thompson NFA whose edges are bytes (small terminal DFAs inlined), epsilons and calls
of other rules; subset construction over (bytes + callee names) makes it deterministic per rule. Terminals
with more than `INLINE_STATES` states (strings, numbers, long literals) become one shared sub-automaton per
distinct DFA, called like a rule, so they are neither copied nor re-determinized at each use, and their token
walks can be cached per vocabulary. All rule states share one global numbering:

    trans[g, byte] -> g' or -1     bytes read inside the rule (the stack below is untouched)
    calls[g]       -> ((callee_start, return_state), ...)   push `return_state`, continue at callee's start
    accept[g]      -> the rule may end here (pop, the caller continues at its return state)

States from which the rule cannot be completed are pruned, so every live configuration can still reach
acceptance: a mask computed from these tables is never empty before the grammar terminates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radixgen.grammars.bytedfa import ByteDFA, live_pairs
from radixgen.grammars.columns import group_bytes
from radixgen.grammars.counted import fuse_bounded_repeats
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.ir import Alt, Expr, GrammarIR, Graph, Repeat, RuleRef, Seq, Terminal, map_children

DEAD = -1
MAX_REPEAT = 4096  # largest {m,n} bound compiled (each count is a state)
MAX_RULE_NFA_STATES = 200_000
NARROW_BYTES = 8  # a terminal state with at most this many live bytes is determinized byte by byte


@dataclass(frozen=True, eq=False)
class PdaTables:
    trans: np.ndarray  # int32[G, 256]
    accept: np.ndarray  # bool[G]
    calls: tuple[tuple[tuple[int, int], ...], ...]  # per g: (callee start g, return g)
    has_bytes: np.ndarray  # bool[G]: any byte transition
    start: int  # start state of the start rule
    rule_names: tuple[str, ...]
    # Shared terminal sub-automata (see `_share_big_terminals`): state g of one is state g - offset of `dfa`.
    terminals: tuple[tuple[int, ByteDFA], ...] = ()
    terminal_of: np.ndarray | None = None  # int32[G]: index into `terminals`, -1 for ordinary rule states
    rule_start: np.ndarray | None = None  # int32[G]: start state of the rule (or shared terminal) of each state

    @property
    def num_states(self) -> int:
        return int(self.trans.shape[0])


class _RuleNfa:
    """Thompson NFA for one rule body."""

    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.calls: list[list[tuple[str, int]]] = []
        self.frag: list[tuple[ByteDFA, int, int] | None] = []  # (dfa, dfa state, base id of the fragment)

    def new(self) -> int:
        if len(self.eps) >= MAX_RULE_NFA_STATES:
            raise GrammarError(f"a grammar rule expands to more than {MAX_RULE_NFA_STATES} automaton states "
                               f"(nested or large bounded repetitions); simplify it")
        self.eps.append([])
        self.calls.append([])
        self.frag.append(None)
        return len(self.eps) - 1

    def build(self, expr: Expr, entry: int, exit_: int) -> None:
        if isinstance(expr, Terminal):
            dfa = expr.dfa
            base = len(self.eps)
            for q in range(dfa.num_states):
                s = self.new()
                self.frag[s] = (dfa, q, base)
                if dfa.accepting[q]:
                    self.eps[s].append(exit_)
            self.eps[entry].append(base)
        elif isinstance(expr, RuleRef):
            self.calls[entry].append((expr.name, exit_))
        elif isinstance(expr, Seq):
            cur = entry
            for i, item in enumerate(expr.items):
                nxt = exit_ if i == len(expr.items) - 1 else self.new()
                self.build(item, cur, nxt)
                cur = nxt
            if not expr.items:
                self.eps[entry].append(exit_)
        elif isinstance(expr, Alt):
            for option in expr.options:
                self.build(option, entry, exit_)
        elif isinstance(expr, Graph):
            states = {0: entry, expr.end: exit_}
            for a, item, b in expr.edges:
                for node in (a, b):
                    if node not in states:
                        states[node] = self.new()
                self.build(item, states[a], states[b])
        elif isinstance(expr, Repeat):
            bound = expr.min if expr.max is None else expr.max
            if bound > MAX_REPEAT:
                raise GrammarError(f"repetition bound {bound} is larger than {MAX_REPEAT}: a bounded "
                                   f"repetition is compiled into one automaton state per count; use * or + "
                                   f"(and check the length elsewhere) or a smaller bound")
            cur = entry
            for _ in range(expr.min):
                nxt = self.new()
                self.build(expr.item, cur, nxt)
                cur = nxt
            if expr.max is None:
                loop = self.new()
                self.eps[cur].append(loop)
                self.build(expr.item, loop, loop)
                self.eps[loop].append(exit_)
            else:
                for _ in range(expr.max - expr.min):
                    self.eps[cur].append(exit_)
                    nxt = self.new()
                    self.build(expr.item, cur, nxt)
                    cur = nxt
                self.eps[cur].append(exit_)
        else:  # pragma: no cover - the IR is closed
            raise TypeError(f"unknown grammar expression {expr!r}")


@dataclass
class _RuleDfa:
    rows: list[np.ndarray]  # per local state: local targets (int32[256], -1 dead)
    calls: list[list[tuple[str, int]]]  # per local state: (callee, local return state)
    accept: list[bool]


def _determinize(nfa: _RuleNfa, final: int) -> _RuleDfa:
    closure_memo: dict[int, frozenset[int]] = {}

    def closure_of(state: int) -> frozenset[int]:
        found = closure_memo.get(state)
        if found is None:
            seen = {state}
            work = [state]
            while work:
                for t in nfa.eps[work.pop()]:
                    if t not in seen:
                        seen.add(t)
                        work.append(t)
            found = closure_memo[state] = frozenset(seen)
        return found

    def closure(states: list[int]) -> frozenset[int]:
        if len(states) == 1:
            return closure_of(states[0])
        out: set[int] = set()
        for s in states:
            out |= closure_of(s)
        return frozenset(out)

    index: dict[frozenset[int], int] = {}
    subsets: list[frozenset[int]] = []

    def intern(subset: frozenset[int]) -> int:
        found = index.get(subset)
        if found is None:
            found = index[subset] = len(subsets)
            subsets.append(subset)
        return found

    dfa = _RuleDfa([], [], [])
    intern(closure_of(0))
    i = 0
    while i < len(subsets):
        subset = subsets[i]
        i += 1
        frags = [frag for s in subset if (frag := nfa.frag[s]) is not None]
        row = np.full(256, DEAD, dtype=np.int32)
        if len(frags) == 1 and len(pairs := live_pairs(frags[0][0], frags[0][1])) <= NARROW_BYTES:
            # One terminal state with a few bytes (a literal's next character): no grouping needed.
            _, _, base = frags[0]
            for b, t in pairs:
                row[b] = intern(closure_of(t + base))
        elif frags:
            targets = np.stack([np.where(d.trans[q] >= 0, d.trans[q] + base, DEAD) for d, q, base in frags])
            groups, firsts = group_bytes(targets)
            results = np.full(firsts.shape[0], DEAD, dtype=np.int32)
            for g, b in enumerate(firsts.tolist()):
                live = [int(t) for t in targets[:, b] if t >= 0]
                if live:
                    results[g] = intern(closure(live))
            row = results[groups]
        grouped: dict[str, list[int]] = {}
        for s in subset:
            for callee, ret in nfa.calls[s]:
                grouped.setdefault(callee, []).append(ret)
        dfa.rows.append(row)
        dfa.calls.append([(callee, intern(closure(rets))) for callee, rets in sorted(grouped.items())])
        dfa.accept.append(final in subset)
    return dfa


INLINE_STATES = 8  # terminals with more DFA states become shared sub-automata instead of inlined copies


def _share_big_terminals(ir: GrammarIR) -> tuple[dict[str, Expr], dict[str, ByteDFA]]:
    """Replace every large terminal by a call of one synthetic rule per distinct DFA: the rule automata
    stay small (no DFA copied at each use, no subset construction over its states). Bounded repetitions of
    one-item terminals and their closing terminal are fused into one terminal first (counted.py)."""
    shared: dict[int, tuple[str, ByteDFA]] = {}

    def visit(expr: Expr) -> Expr:
        if isinstance(expr, Terminal):
            if expr.dfa.num_states <= INLINE_STATES:
                return expr
            found = shared.get(id(expr.dfa))
            if found is None:
                found = shared[id(expr.dfa)] = (f"__terminal_{len(shared)}_{expr.label}", expr.dfa)
            return RuleRef(found[0])
        return map_children(expr, visit)

    rules = {name: visit(fuse_bounded_repeats(body, ir.rules)) for name, body in ir.rules.items()}
    return rules, {name: dfa for name, dfa in shared.values()}


def build_pda(ir: GrammarIR) -> PdaTables:
    """Tables for a normalized IR (see `ir.normalize`)."""
    rules, terminal_rules = _share_big_terminals(ir)
    names = sorted(rules, key=lambda n: (n != ir.start, n)) + sorted(terminal_rules)
    rule_dfas: dict[str, _RuleDfa] = {}
    for name, body in rules.items():
        nfa = _RuleNfa()
        entry, final = nfa.new(), nfa.new()
        nfa.build(body, entry, final)
        rule_dfas[name] = _determinize(nfa, final)
    offsets: dict[str, int] = {}
    total = 0
    for name in names:
        offsets[name] = total
        total += len(rule_dfas[name].rows) if name in rule_dfas else terminal_rules[name].num_states
    rule_rows = sum(len(rd.rows) for rd in rule_dfas.values())  # rule states first, then terminals
    trans = np.full((total, 256), DEAD, dtype=np.int32)
    accept = np.zeros(total, dtype=bool)
    calls: list[tuple[tuple[int, int], ...]] = []
    for name in names[:len(rule_dfas)]:
        rd, off = rule_dfas[name], offsets[name]
        rows = np.stack(rd.rows)
        trans[off:off + rows.shape[0]] = np.where(rows >= 0, rows + off, DEAD)
        accept[off:off + rows.shape[0]] = rd.accept
        calls.extend(tuple((offsets[callee], ret + off) for callee, ret in local) for local in rd.calls)
    for name in names[len(rule_dfas):]:  # a terminal's table is copied as one block; it calls nothing
        dfa, off = terminal_rules[name], offsets[name]
        trans[off:off + dfa.num_states] = np.where(dfa.trans >= 0, dfa.trans + off, DEAD)
        accept[off:off + dfa.num_states] = dfa.accepting
        calls.extend([()] * dfa.num_states)

    # Prune rule states that cannot complete their rule (all rules reachable this way are productive).
    # Terminal states always can (a `ByteDFA` invariant), and rule states only read bytes into rule states.
    has_edge = trans[:rule_rows] >= 0
    safe = np.where(has_edge, trans[:rule_rows], 0)
    completable = _completable(trans[:rule_rows], accept, calls, rule_rows)
    trans[:rule_rows] = np.where(has_edge & completable[safe], trans[:rule_rows], DEAD)
    pruned_calls = tuple(
        tuple((callee, ret) for callee, ret in edges if completable[callee] and completable[ret])
        for edges in calls)
    terminal_list = tuple((offsets[name], dfa) for name, dfa in sorted(terminal_rules.items()))
    terminal_of = np.full(total, -1, dtype=np.int32)
    for i, (offset, dfa) in enumerate(terminal_list):
        terminal_of[offset:offset + dfa.num_states] = i
    rule_start = np.repeat(np.array([offsets[name] for name in names], dtype=np.int32),
                           np.diff([offsets[name] for name in names] + [total]))
    # numpy's stubs type `.any(axis=...)` as scalar-or-array; on a 2-D array it is an array
    has_bytes: np.ndarray = (trans >= 0).any(axis=1)  # type: ignore[assignment]
    return PdaTables(trans=np.ascontiguousarray(trans), accept=accept, calls=pruned_calls,
                     has_bytes=has_bytes, start=offsets[ir.start], rule_names=tuple(names),
                     terminals=terminal_list, terminal_of=terminal_of, rule_start=rule_start)


def _completable(rule_trans: np.ndarray, accept: np.ndarray, calls: list[tuple[tuple[int, int], ...]],
                 rule_rows: int) -> np.ndarray:
    """bool per state: its rule can be completed from it (terminal states always can). Propagated backwards
    from the accepting states, one frontier at a time over the reversed byte edges (a state with a byte into
    a completable state is completable) and the calls (whose callee and return both are): linear in the
    edges, however long the chains of a rule (a long literal) are."""
    completable = accept.copy()
    completable[rule_rows:] = True
    src, byte = np.nonzero(rule_trans >= 0)
    pairs = np.unique(rule_trans[src, byte].astype(np.int64) * rule_rows + src)  # (target, source), by target
    targets, sources = pairs // rule_rows, pairs % rule_rows
    first = np.searchsorted(targets, np.arange(completable.shape[0] + 1))  # edges into state t: first[t]..
    call_src = np.array([g for g, edges in enumerate(calls) for _ in edges], dtype=np.int64)
    call_callee = np.array([c for edges in calls for c, _ in edges], dtype=np.int64)
    call_ret = np.array([r for edges in calls for _, r in edges], dtype=np.int64)
    frontier = np.flatnonzero(completable)
    while frontier.size:
        counts = first[frontier + 1] - first[frontier]
        offsets = np.repeat(first[frontier] - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        reached = [sources[offsets]]
        if call_src.size:
            reached.append(call_src[completable[call_callee] & completable[call_ret]])
        fresh = np.concatenate(reached)
        frontier = np.unique(fresh[~completable[fresh]])
        completable[frontier] = True
    done: np.ndarray = completable
    return done


def called_states(pda: PdaTables) -> np.ndarray:
    """bool per state: its rule is called by some rule, so the state can be the top frame of a stack deeper
    than its root (the states of a rule nobody calls, like the start rule's, only ever sit in root frames)."""
    if pda.rule_start is None:
        return np.ones(pda.num_states, dtype=bool)
    return np.isin(pda.rule_start, [callee for calls in pda.calls for callee, _ in calls])
