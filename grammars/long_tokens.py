"""Which of the vocabulary's few long tokens a parser stack can read, decided frame by frame and memoized.

Masks built from lookahead representatives are exact for tokens of at most the split length (masks.py); the
few longer ones (`Vocabulary.long_tokens`) are decided here. A stack reads a token when its top frame reads all
of it, or may pop at some offset into the frame below, which reads the rest or pops again, down to the root
frame: the chain of a mask's frame walks, for one byte string. What a frame reads of a token from an offset
depends only on the frame, so it is memoized: a top frame's answer for every long token at once (inside a shared
terminal, per vocabulary: every grammar with that terminal reuses it), a frame below per (frame, token, offset).
A configuration met for the first time then mostly costs one lookup per stack, and never interns the states a
long token passes through.
"""

from __future__ import annotations

from collections.abc import Callable

from radixgen.grammars.automaton import MARK, PdaAutomaton, Stack, dfa_accepting_list, dfa_row_tuple
from radixgen.grammars.bytedfa import ByteDFA
from radixgen.grammars.vocabulary import Run, Vocabulary

Reading = tuple[bool, tuple[int, ...]]  # (reads to the end without leaving the frame, offsets where it may pop)


def read_frame(step: Callable[[int, int], int], pops: Callable[[int], bool], alive: Callable[[int], bool],
               state: int, data: bytes, run: Run, offset: int, below: bool) -> Reading:
    """A frame at `state` reading `data[offset:]`: whether it reads to the end without leaving the frame, and
    the offsets after which it may pop (`pops`) so that the frame below reads on from there. `below`: the
    frame resumes after a pop above it, so `state` itself may already pop or be a pure pop (not `alive`).

    `data` is `run` (head + unit * count): once a whole unit brings the state back to where the unit began,
    every later unit does too (the automaton is deterministic), so the frame reads to the end (the offsets of
    later pops do not matter then: the token is read either way)."""
    exits: list[int] = []
    if below:
        if pops(state):
            exits.append(offset)
        if not alive(state):
            return False, tuple(exits)
    head, unit, _ = run
    size, first, end = len(unit), len(head), len(data)
    unit_start = unit_state = -1  # where the unit being read began (a unit boundary), and the state there
    i = offset
    while i < end:
        if size and i >= first and (i - first) % size == 0:
            if unit_start >= 0 and state == unit_state:  # a cycle: every later unit is read the same way
                return True, tuple(exits)
            unit_start, unit_state = i, state
        state = step(state, data[i])
        i += 1
        if state < 0:
            return False, tuple(exits)
        if pops(state):
            exits.append(i)
        if not alive(state):
            return False, tuple(exits)
    return True, tuple(exits)


def automaton_steps(automaton: PdaAutomaton) -> tuple[Callable[[int, int], int], Callable[[int], bool],
                                                       Callable[[int], bool]]:
    """`read_frame`'s (step, pops, alive) for a grammar's configurations; the flag arrays are read afresh at
    each call (interning grows them)."""
    return (automaton.read_byte, lambda s: bool(automaton.escapes[s]), lambda s: bool(automaton.nonempty[s]))


TopReading = tuple[int, tuple[tuple[int, tuple[int, ...]], ...]]  # (bits read whole, (token, pop offsets)...)


def _top_reading(readings: list[Reading]) -> TopReading:
    """A top frame's readings of every long token, as the bits of those it reads whole and the pop offsets of
    the others that may pop."""
    whole = sum(1 << token for token, (ok, _) in enumerate(readings) if ok)
    return whole, tuple((token, exits) for token, (ok, exits) in enumerate(readings) if not ok and exits)


class LongTokenReader:
    """Per grammar: the long tokens (`Vocabulary.long_tokens` order) each stack can read, as a bit set."""

    def __init__(self, vocab: Vocabulary, automaton: PdaAutomaton) -> None:
        self._vocab = vocab
        self._automaton = automaton
        self._steps = automaton_steps(automaton)
        self._data = tuple(data for _, data, _ in vocab.long_tokens[1])
        self._runs = vocab.long_token_runs
        self._tops: dict[tuple[int, bool], TopReading] = {}  # by (top frame, the stack is that frame alone)
        self._frames: dict[tuple[int, int, int], Reading] = {}  # frames below the top: (start, token, offset)
        self._starts: dict[tuple[int, bool], int] = {}  # see `_start`

    def readable(self, stack: Stack, wanted: int) -> int:
        """The bits of `wanted` (bit i: long token i) whose tokens `stack` can read from its position: the top
        frame's answer for every token at once, then the frames below for the tokens it may pop on."""
        whole, popping = self._top(stack[-1], len(stack) == 1)
        found = whole & wanted
        for token, offsets in popping:
            if wanted >> token & 1 and self._reads_below(stack, token, offsets):
                found |= 1 << token
        return found

    def _top(self, frame: int, root: bool) -> TopReading:
        """What the top frame `frame` reads of every long token: inside a shared terminal, its DFA's reading
        (`_terminal_top`); else the frame as one stack, relative unless it is the root."""
        key = (frame, root)
        found = self._tops.get(key)
        if found is None:
            pda = self._automaton.pda
            term = int(pda.terminal_of[frame]) if pda.terminal_of is not None else -1
            if term >= 0:
                offset, dfa = pda.terminals[term]
                found = self._terminal_top(dfa, frame - offset)
            else:
                state = self._automaton.intern_stacks((((frame,) if root else (MARK, frame)),))
                found = _top_reading([read_frame(*self._steps, state, data, run, 0, False)
                                      for data, run in zip(self._data, self._runs)])
            self._tops[key] = found
        return found

    def _terminal_top(self, dfa: ByteDFA, q: int) -> TopReading:
        """`_top` inside a shared terminal: its DFA's reading from state `q`, cached per vocabulary (by the DFA's
        digest, so every grammar with that terminal reuses it)."""
        key = (dfa.digest, q, "long")
        found: TopReading | None = self._vocab.terminal_walks.get(key)
        if found is None:
            accepting = dfa_accepting_list(dfa)
            readings = [read_frame(lambda s, b: dfa_row_tuple(dfa, s)[b], accepting.__getitem__, lambda s: True,
                                   q, data, run, 0, False) for data, run in zip(self._data, self._runs)]
            found = self._vocab.terminal_walks.put(key, _top_reading(readings), 64 * len(readings))
        return found

    def _reads_below(self, stack: Stack, token: int, offsets: tuple[int, ...]) -> bool:
        """The frames below the top, from the top down, read the rest of `token` from one of the `offsets`
        where the frame above them may pop."""
        for level in range(len(stack) - 2, -1, -1):
            below: set[int] = set()
            for offset in offsets:
                whole, exits = self._frame_reading(stack[level], level == 0, token, offset)
                if whole:
                    return True
                below.update(exits)
            if not below:
                return False
            offsets = tuple(sorted(below))
        return False

    def _frame_reading(self, frame: int, root: bool, token: int, offset: int) -> Reading:
        """Frame `frame` below the top, resumed after a pop at `offset`, reading the rest of long token `token`
        (relative to the frames below it unless it is the root)."""
        start = self._start(frame, root)
        key = (start, token, offset)
        found = self._frames.get(key)
        if found is None:
            found = self._frames[key] = read_frame(*self._steps, start, self._data[token], self._runs[token],
                                                   offset, True) if start >= 0 else (False, ())
        return found

    def _start(self, frame: int, root: bool) -> int:
        """The state a frame below the top resumes in: the closure of (MARK, frame), or of (frame,) for the
        root; DEAD when nothing of it is left."""
        key = (frame, root)
        found = self._starts.get(key)
        if found is None:
            found = self._starts[key] = self._automaton.closed_state((frame,) if root else (MARK, frame))
        return found
