r"""Regex (Python `re` syntax, the subset `interegular` supports) -> character FSM -> byte-level DFA.

The pattern is matched in full (like `re.fullmatch`). The shorthand classes `\d`, `\w`, `\s` are ASCII-only
(as with `re.ASCII`, and as JSON Schema's ECMA-262 patterns mean them). Anything interegular cannot turn into
a finite automaton
(lookarounds, backreferences, anchors in the middle, ...) is refused with `GrammarError` at compile time.
"""

from __future__ import annotations

import re
from functools import lru_cache

import interegular
from interegular.fsm import TransitionKey, anything_else

from radixgen.grammars.bytedfa import ByteDFA, CharTransitions, dfa_from_char_automaton
from radixgen.grammars.errors import GrammarError


def _char_transitions(fsm: interegular.FSM) -> tuple[list[CharTransitions], list[bool], int]:
    states = sorted(fsm.states)
    index = {s: i for i, s in enumerate(states)}
    by_symbol: dict[TransitionKey, list[int]] = {}
    else_symbol: TransitionKey | None = None
    for char, symbol in fsm.alphabet.items():
        if char is anything_else:
            else_symbol = symbol
        else:
            by_symbol.setdefault(symbol, []).append(ord(char))
    runs: dict[TransitionKey, list[tuple[int, int]]] = {}
    for symbol, cps in by_symbol.items():
        merged: list[tuple[int, int]] = []
        for cp in sorted(cps):
            if merged and cp == merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], cp)
            else:
                merged.append((cp, cp))
        runs[symbol] = merged
    transitions = []
    for s in states:
        moves = fsm.map.get(s, {})
        default = index[moves[else_symbol]] if else_symbol is not None and else_symbol in moves else -1
        intervals: list[tuple[int, int, int]] = []
        for symbol in by_symbol:
            target = index[moves[symbol]] if symbol in moves else -1
            intervals.extend((lo, hi, target) for lo, hi in runs[symbol])
        transitions.append(CharTransitions.from_intervals(intervals, default))
    accepting = [s in fsm.finals for s in states]
    return transitions, accepting, index[fsm.initial]


_UNICODE_ESCAPE = re.compile(r"\\\\|\\u([0-9a-fA-F]{4})|\\U([0-9a-fA-F]{8})|\\x\\{([0-9a-fA-F]+)\\}")


def _inline_unicode_escapes(pattern: str) -> str:
    """interegular does not read \\uXXXX escapes: replace them by the (re-escaped) character itself."""

    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "\\\\":
            return m.group(0)
        char = chr(int(m.group(1) or m.group(2) or m.group(3), 16))
        return re.escape(char) if not char.isalnum() else char

    return _UNICODE_ESCAPE.sub(repl, pattern)


def _strip_anchors_and_check(pattern: str) -> str:
    """Drop a leading `^` / trailing `$` (no-ops for a full match); refuse constructs that are not regular or
    that interegular would silently mistreat: lookarounds, backreferences, conditionals, other anchors."""
    pattern = pattern.removeprefix("^")
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1]
    in_class = False
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            nxt = pattern[i + 1:i + 2]
            if not in_class and (nxt in ("b", "B", "A", "Z", "z") or (nxt.isdigit() and nxt != "0")):
                raise GrammarError(f"regex {pattern!r}: \\{nxt} (anchor or backreference) is not supported")
            i += 2
            continue
        if in_class:
            in_class = ch != "]" or pattern[i - 1] == "["
        elif ch == "[":
            in_class = True
            if pattern.startswith("^", i + 1):
                i += 1
        elif ch in "^$":
            raise GrammarError(f"regex {pattern!r}: anchors inside the pattern are not supported")
        elif pattern.startswith(("(?=", "(?!", "(?<=", "(?<!", "(?P=", "(?("), i):
            raise GrammarError(f"regex {pattern!r}: lookarounds, backreferences and conditionals are not "
                               f"supported (they are not regular)")
        i += 1
    return pattern


@lru_cache(maxsize=1024)
def regex_to_dfa(pattern: str) -> ByteDFA:
    """Compile `pattern` (full match) to a byte-level DFA; `GrammarError` for unsupported syntax."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise GrammarError(f"invalid regex {pattern!r}: {exc}") from exc
    pattern = _strip_anchors_and_check(pattern)
    try:
        fsm = interegular.parse_pattern(_inline_unicode_escapes(pattern)).to_fsm()
    except Exception as exc:  # interegular raises several types (Unsupported, InvalidSyntax, ValueError)
        raise GrammarError(f"regex {pattern!r} uses syntax that cannot be compiled to an automaton: {exc}") \
            from exc
    transitions, accepting, start = _char_transitions(fsm)
    return dfa_from_char_automaton(transitions, accepting, start)
