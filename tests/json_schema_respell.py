"""Test helpers: whether a compiled JSON Schema grammar accepts a JSON value, as given or in another spelling of
the same value that its reported narrowings allow (object keys in another order, `1` for `1.0`).

Acceptance is decided with the grammar's own automaton (`Matcher.advance_bytes`), for any vocabulary.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from radixgen.grammars import Grammar, Matcher


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def accepts_text(grammar: Grammar, text: str) -> bool:
    m = grammar.matcher()
    return m.advance_bytes(text.encode("utf-8")) and m.is_accepting() if text else m.is_accepting()


MAX_TRIES = 20_000  # key orders tried before giving up (the search is exponential in the worst case)


class _OutOfTries(Exception):
    pass


def accepts_respelled(grammar: Grammar, value: Any, integral: bool = True) -> bool:
    """Whether some spelling of `value` is accepted: the keys of each object in any order, numbers as plain
    decimals and integral ones as integers (unless not `integral`: draft 4 tells 1.0 from 1), json.dumps
    separators. A backtracking search (each spelling is tried with what follows it), up to `MAX_TRIES`."""
    m = grammar.matcher()
    try:
        return any(m.is_accepting() for _ in _spellings(m, value, integral, [MAX_TRIES]))
    except _OutOfTries:
        return False


def _number_spellings(value: int | float, integral: bool) -> list[str]:
    out = [dumps(value)]
    if isinstance(value, float):
        if integral and value.is_integer():
            out.append(str(int(value)))
        out.append(format(Decimal(repr(value)), "f"))
    return list(dict.fromkeys(out))


def _spend(tries: list[int]) -> None:
    tries[0] -= 1
    if tries[0] < 0:
        raise _OutOfTries


def _text(m: Matcher, text: str) -> Iterator[None]:
    """Advance by `text` (if accepted), yield once, then undo."""
    if not text:
        yield
    elif m.advance_bytes(text.encode("utf-8")):
        yield
        m.rollback(1)


def _spellings(m: Matcher, value: Any, integral: bool, tries: list[int]) -> Iterator[None]:
    """Each time `m` has advanced by one accepted spelling of `value`, yield; undo it when resumed."""
    _spend(tries)
    if isinstance(value, list):
        for _ in _text(m, "["):
            yield from _items(m, value, True, integral, tries)
    elif isinstance(value, dict):
        for _ in _text(m, "{"):
            yield from _members(m, list(value.items()), True, integral, tries)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        for text in _number_spellings(value, integral):
            yield from _text(m, text)
    else:
        yield from _text(m, dumps(value))


def _items(m: Matcher, items: list[Any], first: bool, integral: bool, tries: list[int]) -> Iterator[None]:
    if not items:
        yield from _text(m, "]")
        return
    for _ in _text(m, "" if first else ", "):
        for _ in _spellings(m, items[0], integral, tries):
            yield from _items(m, items[1:], False, integral, tries)


def _members(m: Matcher, members: list[tuple[str, Any]], first: bool, integral: bool,
             tries: list[int]) -> Iterator[None]:
    """The members still to write, in every order the grammar accepts, then `}`."""
    if not members:
        yield from _text(m, "}")
        return
    for i, (key, value) in enumerate(members):
        _spend(tries)
        for _ in _text(m, ("" if first else ", ") + dumps(key) + ": "):
            for _ in _spellings(m, value, integral, tries):
                yield from _members(m, members[:i] + members[i + 1:], False, integral, tries)
