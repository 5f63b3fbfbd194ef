"""Free text that stops at a trigger: GBNF rules for "any text in which no trigger occurs, and once one occurs,
what follows it".

The rules are the trigger set's Aho-Corasick automaton over characters, one rule per state: a state reads one
character and tail-calls the next state, so the text may be as long as it likes (the automaton returns from a
tail call into the frame below). Reading the last character of a trigger continues with that trigger's
continuation instead, which is how a structural tag or a tool call takes over from free text. A trigger the
model writes as one token (a marker) is not read character by character at all: its text never occurs, and
after any text its token reference (token_refs.py) may come instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from radixgen.grammars.ebnf_embed import EmbeddedRules
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.json_schema_text import literal
from radixgen.grammars.token_refs import soft_token


def class_char(ch: str) -> str:
    """One character as it is written inside a GBNF character class."""
    cp = ord(ch)
    if ch in "\\]^-[":
        return "\\" + ch
    if cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02x}"
    if not ch.isprintable():
        return f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"
    return ch


def check_triggers(triggers: Sequence[str]) -> None:
    """Triggers must be non-empty and none may occur inside another (the shorter would always fire first)."""
    for t in triggers:
        if not t:
            raise GrammarError("triggers must be non-empty strings")
    for a in triggers:
        for b in triggers:
            if a is not b and a in b:
                raise GrammarError(f"trigger {a!r} occurs inside trigger {b!r}; triggers must not contain one "
                                   f"another")


@dataclass(frozen=True)
class _Automaton:
    states: tuple[str, ...]  # state i has read states[i], the longest suffix that is a prefix of a trigger
    alphabet: tuple[str, ...]  # the characters of the triggers, in first-seen order


def _automaton(triggers: list[str]) -> _Automaton:
    prefixes = dict.fromkeys(t[:k] for t in triggers for k in range(len(t) + 1))
    alphabet = tuple(dict.fromkeys(ch for t in triggers for ch in t))
    return _Automaton(tuple(prefixes), alphabet)


def _next_state(read: str, prefixes: set[str]) -> str:
    for start in range(len(read) + 1):
        if read[start:] in prefixes:
            return read[start:]
    return ""


def text_until(prefix: str, continuations: Mapping[str, str], may_end: bool = True,
               tokens: Mapping[str, str] | None = None) -> EmbeddedRules:
    """Rules (start `prefix + "0"`) for text in which no key of `continuations` occurs, except that reading one
    goes on with its value (a GBNF expression, typically a rule name). `may_end`: the text may stop anywhere
    outside a trigger (the grammar accepts there); otherwise only a trigger's continuation ends it.

    `tokens` are triggers a model writes as one token (markers such as `<tool_call>`): their text never occurs
    in the free text; after any text the marker (`token_refs.soft_token`: its token where the vocabulary has
    one, else its text) may come, going on with the value."""
    markers = dict(tokens or {})
    ends = {**continuations, **markers}
    triggers = list(ends)
    check_triggers(triggers)
    machine = _automaton(triggers)
    prefixes = set(machine.states)
    index = {s: i for i, s in enumerate(machine.states) if s not in ends}
    lines = []
    for read, i in index.items():
        alternatives = ['""'] if may_end else []
        alternatives += [f"{soft_token(marker)} {after}" for marker, after in markers.items()]
        by_target: dict[str, list[str]] = {}
        for ch in machine.alphabet:
            target = _next_state(read + ch, prefixes)
            if target in markers:  # the marker's text: not in free text
                continue
            if target in continuations:
                alternatives.append(f"{literal(ch)} {continuations[target]}")
            elif target:
                by_target.setdefault(f"{prefix}{index[target]}", []).append(ch)
        stepping = [ch for chars in by_target.values() for ch in chars]
        stepping += [ch for ch in machine.alphabet if _next_state(read + ch, prefixes) in ends]
        alternatives.append(f"[^{''.join(class_char(c) for c in stepping)}] {prefix}0")
        for rule, chars in by_target.items():
            alternatives.append(f"[{''.join(class_char(c) for c in chars)}] {rule}")
        lines.append(f"{prefix}{i} ::= " + " | ".join(alternatives))
    return EmbeddedRules(f"{prefix}0", "\n".join(lines) + "\n")
