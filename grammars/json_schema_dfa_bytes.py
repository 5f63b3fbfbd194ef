"""A `Dfa` of string bodies, quoted, as the byte DFA of its grammar terminal: built from the `Dfa` itself rather
than by parsing back the regex text `to_regex` writes for it (interegular's construction of those texts was half
of a schema's compile time: an extra-keys region of a dozen names took 0.8 s).
"""

from __future__ import annotations

from .bytedfa import ByteDFA, CharTransitions, dfa_from_char_automaton
from .json_schema_dfa import Dfa

QUOTE = ord('"')
_END = 0x110000


def _live_states(machine: Dfa) -> set[int]:
    """The states from which an accepting state is reachable."""
    live = set(machine.accepting)
    grew = True
    while grew:
        grew = False
        for s, row in enumerate(machine.trans):
            if s not in live and any(t in live for t in row):
                live.add(s)
                grew = True
    return live


def quoted_byte_dfa(machine: Dfa) -> ByteDFA | None:
    """The bytes of `"` + a body `machine` accepts + `"`, or None when a body may go on with a raw quote where it
    could also end (then a quote there is not only the closing one, and the caller compiles the regex text). A
    canonical body reads a raw quote only after a backslash, where it cannot end."""
    symbol = next(i for i in range(len(machine.bounds) - 1, -1, -1) if machine.bounds[i] <= QUOTE)
    live = _live_states(machine)
    if any(machine.trans[s][symbol] in live for s in machine.accepting):
        return None
    n = len(machine.trans)
    opening, closed = n, n + 1  # char states: the machine's, then before the opening quote and after the closing
    highs = [b - 1 for b in machine.bounds[1:]] + [_END - 1]
    states = []
    for s, row in enumerate(machine.trans):
        intervals = [(lo, hi, t) for lo, hi, t in zip(machine.bounds, highs, row) if t in live]
        if s in machine.accepting:
            intervals.append((QUOTE, QUOTE, closed))  # the quote's interval leads nowhere here (checked above)
        states.append(CharTransitions.from_intervals(intervals, -1))
    states.append(CharTransitions.from_intervals([(QUOTE, QUOTE, 0)], -1))
    states.append(CharTransitions.from_intervals([], -1))
    return dfa_from_char_automaton(states, [False] * (n + 1) + [True], opening)
