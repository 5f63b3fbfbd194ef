"""Deterministic byte automata the matcher runs: a regex DFA as is, or a pushdown automaton, determinized
lazily.

Both expose the same table interface: a state id per matcher position, `table` / `row_tuple(state)` giving the
next state for each byte (-1 dead), and `accepting(state)`. For a regex the table is complete up front. For a
grammar a state ("configuration") is the set of parser stacks still alive; configurations are interned and
their rows filled on first use, then shared by every matcher of the grammar, so steady-state decoding is the
same table lookup as for a regex.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Protocol

import numpy as np

from radixgen.grammars.bytedfa import ByteDFA, live_pairs
from radixgen.grammars.columns import group_bytes
from radixgen.grammars.pda import PdaTables

DEAD = -1
UNKNOWN = -2

Stack = tuple[int, ...]
# A configuration: its stacks sorted and distinct. Plain tuples of tuples of ints, unlike frozensets, are
# untracked by the cyclic garbage collector, so the thousands a large grammar interns do not lengthen its pauses.
Config = tuple[Stack, ...]


def config_of(stacks: Iterable[Stack]) -> Config:
    """The canonical configuration of a collection of stacks."""
    return tuple(sorted(set(stacks)))


class ByteAutomaton(Protocol):
    initial: int

    @property
    def table(self) -> np.ndarray: ...

    def ensure_rows(self, states: np.ndarray) -> None: ...

    def live_pairs(self, state: int) -> tuple[tuple[int, int], ...]: ...

    def row_tuple(self, state: int) -> tuple[int, ...]: ...

    def accepting(self, state: int) -> bool: ...

    def step(self, state: int, data: bytes) -> int: ...


class _DfaRows:
    """Row access shared by the automata that are one DFA (its rows are always complete)."""

    _dfa: ByteDFA

    def ensure_rows(self, states: np.ndarray) -> None:
        return None

    def live_pairs(self, state: int) -> tuple[tuple[int, int], ...]:
        """(byte, next state) for every live byte, ascending."""
        return live_pairs(self._dfa, state)

    def row_tuple(self, state: int) -> tuple[int, ...]:
        """The table row of `state` as a Python tuple."""
        return dfa_row_tuple(self._dfa, state)


class DfaAutomaton(_DfaRows):
    """A regex: states are DFA states, the table is the DFA's."""

    def __init__(self, dfa: ByteDFA) -> None:
        self._dfa = dfa
        self.initial = 0

    @property
    def dfa(self) -> ByteDFA:
        return self._dfa

    @property
    def table(self) -> np.ndarray:
        return self._dfa.trans

    @property
    def num_states(self) -> int:
        return self._dfa.num_states

    def accepting(self, state: int) -> bool:
        return bool(self._dfa.accepting[state])

    def step(self, state: int, data: bytes) -> int:
        trans = self._dfa.trans
        for b in data:
            state = int(trans[state, b])
            if state < 0:
                return DEAD
        return state


MARK = -1  # bottom frame of a relative stack: "some context we do not look at"


class EscapeFlags(Protocol):
    """Per-state flags of an automaton walked with escapes (`token_walk.walk_trie(..., escapes=True)`)."""

    @property
    def escapes(self) -> np.ndarray: ...  # bool per state: reaching it may leave what the state knows

    @property
    def nonempty(self) -> np.ndarray: ...  # bool per state: something is still alive there


class DfaEscapes(_DfaRows):
    """A DFA walked as the top frame of a parser stack: reaching an accepting state (after at least one byte)
    may pop the frame, so it counts as an escape. Lets walks over a shared terminal be cached per vocabulary
    and reused by every grammar that uses the same terminal."""

    def __init__(self, dfa: ByteDFA) -> None:
        self._dfa = dfa
        self.table: np.ndarray = dfa.trans
        self.escapes: np.ndarray = dfa.accepting
        # numpy's stubs type `.any(axis=...)` as scalar-or-array; on a 2-D array it is an array
        self.nonempty: np.ndarray = (dfa.trans >= 0).any(axis=1)  # type: ignore[assignment]


def dfa_accepting_list(dfa: ByteDFA) -> list[bool]:
    """`dfa.accepting` as a Python list (for per-byte loops; built once per DFA)."""
    found: list[bool] | None = dfa.__dict__.get("_accepting_list")
    if found is None:
        found = dfa.__dict__["_accepting_list"] = dfa.accepting.tolist()
    return found


# Rows cached for per-byte loops are tuples of ints, not lists: the cyclic garbage collector stops tracking
# such tuples, so thousands of cached rows do not lengthen its pauses (which land in mask times otherwise).


def dfa_row_tuple(dfa: ByteDFA, state: int) -> tuple[int, ...]:
    """Row `state` of `dfa.trans` as a Python tuple (cached on the DFA)."""
    cache: dict[int, tuple[int, ...]] = dfa.__dict__.setdefault("_row_tuples", {})
    found = cache.get(state)
    if found is None:
        found = cache[state] = tuple(dfa.trans[state].tolist())
    return found


def _live_pairs_of(row: np.ndarray) -> tuple[tuple[int, int], ...]:
    live = np.flatnonzero(row >= 0)
    return tuple(zip(live.tolist(), row[live].tolist()))


class PdaAutomaton:
    """A grammar: states are interned sets of stacks of PDA states (the root frame first).

    A call whose return state only ends its rule (accepting, nothing to read or call: a rule's last item, like
    `value ::= object | ...` or a property-name trie's next character) pushes no return frame: the callee's end
    pops straight into the frame below, as the return would have (a tail call). Stacks stay as deep as the
    nesting of the text, not of the rules that spell it.

    A stack may also be *relative*: it starts with `MARK`, standing for frames below that are not part of the
    key. Popping into `MARK` is not followed; the configuration records it in `escapes` instead. A token walk
    from a relative configuration that meets no escaping configuration never depended on the frames below,
    so its mask is exact for every full configuration with those top frames (XGrammar's context-independent
    tokens, computed per stack suffix and shared across nesting depths).
    """

    def __init__(self, pda: PdaTables) -> None:
        self._pda = pda
        self._accept_list: list[bool] = pda.accept.tolist()
        ends_only = pda.accept & ~pda.has_bytes & (np.fromiter(map(len, pda.calls), dtype=np.int64,
                                                                count=pda.num_states) == 0)
        self._tail_return: list[bool] = ends_only.tolist()  # a call returning here is a tail call
        self._configs: list[Config] = []
        self._index: dict[tuple[Config, bool], int] = {}
        self._accepting: list[bool] = []
        self._table = np.full((64, 256), UNKNOWN, dtype=np.int32)
        self._escapes = np.zeros(64, dtype=bool)
        self._nonempty = np.zeros(64, dtype=bool)
        self._terminal_top = np.full(64, -1, dtype=np.int32)
        self._live: dict[int, tuple[tuple[int, int], ...]] = {}
        self._rows: dict[int, tuple[int, ...]] = {}
        self._groups: dict[int, tuple[np.ndarray, tuple[int, ...]]] = {}
        self._edges: dict[tuple[int, int], int] = {}  # see `edge`
        self._closures: dict[Stack, tuple[Config, bool]] = {}
        self._lock = threading.RLock()
        initial = self._intern(*self._close([(pda.start,)]))
        assert initial is not None, "the start rule was checked productive at compile time"
        self.initial = initial

    @property
    def table(self) -> np.ndarray:
        return self._table

    @property
    def escapes(self) -> np.ndarray:
        """bool per state: its closure popped a relative stack into MARK."""
        return self._escapes

    @property
    def terminal_top(self) -> np.ndarray:
        """int32 per state: index into `pda.terminals` when the state is one stack whose top frame is inside
        that shared terminal (so walks below it can reuse per-vocabulary terminal walks), else -1."""
        return self._terminal_top

    @property
    def nonempty(self) -> np.ndarray:
        """bool per state: some stack is still alive (false only for a pure escape)."""
        return self._nonempty

    @property
    def num_states(self) -> int:
        return len(self._configs)

    def accepting(self, state: int) -> bool:
        return self._accepting[state]

    def stacks(self, state: int) -> Config:
        return self._configs[state]

    @property
    def pda(self) -> PdaTables:
        return self._pda

    def intern_stacks(self, stacks: Iterable[Stack]) -> int:
        """The state of an already closed set of stacks (relative ones included)."""
        with self._lock:
            found = self._intern(config_of(stacks), False)
        assert found is not None
        return found

    def fill_relative_tops(self) -> None:
        """Intern the relative stack `(MARK, g)` of every PDA state g with bytes and fill their rows in bulk.

        Walks from a grammar position start from these states and mostly stay in them (bytes read inside
        one rule: property names, literals), so filling them with one gather instead of one row at a time
        makes those walks cheaper. A target that calls a rule or may end its rule gets its closure as usual.
        States inside shared terminals are left out: walks from them are terminal walks (terminal_walks.py)."""
        pda = self._pda
        with self._lock:
            ids = np.full(pda.num_states, DEAD, dtype=np.int64)
            rule_state = pda.terminal_of < 0 if pda.terminal_of is not None else np.ones_like(pda.has_bytes)
            tops = np.flatnonzero(pda.has_bytes & rule_state)
            for g in tops.tolist():
                found = self._intern(((MARK, g),), False)
                assert found is not None
                ids[g] = found
            target_state = ids.copy()
            closing = np.flatnonzero(rule_state & (pda.accept | np.fromiter((bool(c) for c in pda.calls),
                                                                             dtype=bool, count=pda.num_states)))
            for t in closing.tolist():
                target_state[t] = self._intern_or_dead(self._close_one((MARK, t)))
            fresh = tops[self._table[ids[tops], 0] == UNKNOWN]
            trans = pda.trans[fresh]
            self._table[ids[fresh]] = np.where(trans >= 0, target_state[np.maximum(trans, 0)], DEAD)

    def closed_state(self, stack: Stack) -> int:
        """The state of the closure of one stack (relative or not), or DEAD when nothing of it is left."""
        with self._lock:
            return self._intern_or_dead(self._close_one(stack))

    def _close(self, stacks: list[Stack]) -> tuple[Config, bool]:
        """Epsilon closure: push calls, pop finished rules; keep stacks that can read a byte or accept.
        Returns the kept stacks and whether a relative stack popped into MARK."""
        pda = self._pda
        if len(stacks) == 1:
            (only,) = stacks
            top = only[-1]
            if not pda.calls[top] and not pda.accept[top]:  # the common case: nothing to push or pop
                return ((only,), False) if pda.has_bytes[top] else ((), False)
        seen: set[Stack] = set()
        kept: set[Stack] = set()
        escaped = False
        tail_return = self._tail_return
        work = list(stacks)
        while work:
            s = work.pop()
            if s in seen:
                continue
            seen.add(s)
            top = s[-1]
            below = s[:-1]
            for callee, ret in pda.calls[top]:
                work.append(below + (callee,) if tail_return[ret] else below + (ret, callee))
            if pda.accept[top] and below:
                if below == (MARK,):
                    escaped = True
                else:
                    work.append(below)
            if pda.has_bytes[top] or (pda.accept[top] and not below):
                kept.add(s)
        return config_of(kept), escaped

    def _close_one(self, stack: Stack) -> tuple[Config, bool]:
        """`_close([stack])`, memoized: the same stack recurs in many configurations."""
        found = self._closures.get(stack)
        if found is None:
            found = self._closures[stack] = self._close([stack])
        return found

    def _intern_or_dead(self, closed: tuple[Config, bool]) -> int:
        found = self._intern(*closed)
        return DEAD if found is None else found

    def _intern(self, config: Config, escaped: bool) -> int | None:
        if not config and not escaped:
            return None
        key = (config, escaped)
        found = self._index.get(key)
        if found is not None:
            return found
        idx = len(self._configs)
        self._configs.append(config)
        self._index[key] = idx
        self._accepting.append(any(self._accept_list[s[0]] for s in config if len(s) == 1))
        if idx >= self._table.shape[0]:
            grown = np.full((2 * self._table.shape[0], 256), UNKNOWN, dtype=np.int32)
            grown[: self._table.shape[0]] = self._table
            escapes = np.zeros(2 * self._table.shape[0], dtype=bool)
            escapes[: self._table.shape[0]] = self._escapes
            nonempty = np.zeros(2 * self._table.shape[0], dtype=bool)
            nonempty[: self._table.shape[0]] = self._nonempty
            terminal_top = np.full(2 * self._table.shape[0], -1, dtype=np.int32)
            terminal_top[: self._table.shape[0]] = self._terminal_top
            self._escapes, self._nonempty, self._terminal_top = escapes, nonempty, terminal_top
            self._table = grown
        self._escapes[idx] = escaped
        self._nonempty[idx] = bool(config)
        if len(config) == 1 and not escaped and self._pda.terminal_of is not None:
            (stack,) = config
            self._terminal_top[idx] = self._pda.terminal_of[stack[-1]]
        return idx

    def _byte_groups(self, g: int) -> tuple[np.ndarray, tuple[int, ...]]:
        """Bytes of PDA state g grouped by target: (group of each byte, target of each group)."""
        found = self._groups.get(g)
        if found is None:
            targets, groups = np.unique(self._pda.trans[g], return_inverse=True)
            found = self._groups[g] = (groups.reshape(-1), tuple(targets.tolist()))
        return found

    def _fill_row(self, state: int) -> None:
        stacks = self._configs[state]
        row = np.full(256, DEAD, dtype=np.int32)
        if len(stacks) == 1:
            (stack,) = stacks
            groups, targets = self._byte_groups(stack[-1])
            below = stack[:-1]
            results = np.array([DEAD if t < 0 else self._intern_or_dead(self._close_one(below + (t,)))
                                for t in targets], dtype=np.int32)
            row = results[groups]
        elif stacks:
            trans = self._pda.trans
            tops = np.fromiter((s[-1] for s in stacks), dtype=np.int64, count=len(stacks))
            top_targets = trans[tops]  # [k, 256]
            groups, firsts = group_bytes(top_targets)
            results = np.array([self._moved(stacks, top_targets[:, b].tolist()) for b in firsts.tolist()],
                               dtype=np.int32)
            row = results[groups]
        self._table[state] = row

    def ensure_rows(self, states: np.ndarray) -> None:
        """Fill the table rows of `states` that are still unknown."""
        pending = states[self._table[states, 0] == UNKNOWN]
        if pending.size == 0:
            return
        with self._lock:
            for state in np.unique(pending):
                if self._table[state, 0] == UNKNOWN:
                    self._fill_row(int(state))

    def live_pairs(self, state: int) -> tuple[tuple[int, int], ...]:
        """(byte, next state) for every live byte of `state`, ascending."""
        found = self._live.get(state)
        if found is None:
            self.row_tuple(state)  # fills the row when unknown
            found = self._live[state] = _live_pairs_of(self._table[state])
        return found

    def row_tuple(self, state: int) -> tuple[int, ...]:
        """The table row of `state` as a Python tuple (filled first if unknown)."""
        found = self._rows.get(state)
        if found is None:
            if self._table[state, 0] == UNKNOWN:
                with self._lock:
                    if self._table[state, 0] == UNKNOWN:
                        self._fill_row(state)
            found = self._rows[state] = tuple(self._table[state].tolist())
        return found

    def read_byte(self, state: int, byte: int) -> int:
        """The state after `byte` (DEAD when it dies) through the cached row tuples. A state whose row is still
        unknown is left so: only the edge taken is computed (`edge`), since a long byte string mostly passes
        through states nothing else visits."""
        row = self._rows.get(state)
        if row is not None:
            return row[byte]
        if self._table[state, 0] != UNKNOWN:
            return self.row_tuple(state)[byte]
        return self.edge(state, byte)

    def row_known(self, state: int) -> bool:
        return bool(self._table[state, 0] != UNKNOWN)

    def edge(self, state: int, byte: int) -> int:
        """The state after `byte` from `state`, without filling the row (memoized per edge). The same
        closure union as `_fill_row` computes for that byte, so the same interned state."""
        key = (state, byte)
        found = self._edges.get(key)
        if found is None:
            stacks = self._configs[state]
            trans = self._pda.trans
            with self._lock:
                found = self._edges[key] = self._moved(stacks, [int(trans[s[-1], byte]) for s in stacks])
        return found

    def _moved(self, stacks: Config, targets: list[int]) -> int:
        """The state after each stack's top moves to its target (-1: that stack dies), or DEAD. The closure
        of a union is the union of closures: each moved stack's own closure is reused."""
        kept: set[Stack] = set()
        escaped = False
        for s, t in zip(stacks, targets):
            if t >= 0:
                one_kept, one_escaped = self._close_one(s[:-1] + (t,))
                kept.update(one_kept)
                escaped |= one_escaped
        return self._intern_or_dead((config_of(kept), escaped))

    def step(self, state: int, data: bytes) -> int:
        for b in data:
            if self._table[state, 0] == UNKNOWN:
                with self._lock:
                    if self._table[state, 0] == UNKNOWN:
                        self._fill_row(state)
            state = int(self._table[state, b])
            if state < 0:
                return DEAD
        return state
