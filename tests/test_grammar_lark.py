"""Lark front end and the shipped grammars: tables against lark itself, random walks that lark must parse."""

from __future__ import annotations

import heapq
import random

import lark
import pytest
from grammar_vocabs import VOCABS, allowed_ids

from radixgen.grammars import (
    GrammarError,
    Vocabulary,
    builtin_grammar_names,
    compile_grammar,
    load_builtin_grammar,
)

BYTES_VOCAB = Vocabulary([bytes([b]) for b in range(256)] + [b"<eos>"], eos_token_ids=[256])

CASES = {
    "json": ['{"a": [1, 2.5e-3, true, null, {"b": "x\\"y"}]}', "[]", " {} ", '"s"', '{"a" 1}', "[1,]", "01",
             '{"a":1,"a":2}', "[[[[]]]]", '"\\u00e9"', '"\\x"', "tru"],
    "arithmetic": ["1 + 2*x ^ 2", "f(x, -y)/(3)", "1 +", "f(,)", "2^3^4", "-(-(1))", "f()", "a b"],
    "sql": ["SELECT a, b FROM t WHERE a > 1 AND b LIKE 'x%' ORDER BY a DESC LIMIT 10;",
            "select count(*) from users u join orders o on u.id = o.uid group by u.name having count(*) > 2",
            "SELECT DISTINCT name FROM people WHERE age BETWEEN 18 AND 30 OR name IN ('a', 'b')",
            "SELECT FROM t", "SELECTa FROM t", "SELECT * FROM t WHERE", "SELECT a FROM t LIMIT x"],
    "tool_call": ['<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}</tool_call>',
                  ('<tool_call>{"name": "f", "arguments": {}}</tool_call>\n<tool_call>{"name": "g", '
                   '"arguments": {"x": [1, {"y": null}]}}</tool_call>'),
                  '<tool_call>{"name": 1, "arguments": {}}</tool_call>',
                  '<tool_call>{"name": "f"}</tool_call>'],
}


def lark_accepts(reference: lark.Lark, text: str) -> bool:
    try:
        reference.parse(text)
    except lark.exceptions.LarkError:
        return False
    return True


@pytest.fixture(scope="module")
def references() -> dict[str, lark.Lark]:
    # dynamic_complete: terminals matched in place at every length, the lexerless semantics we implement.
    return {name: lark.Lark(load_builtin_grammar(name), parser="earley", lexer="dynamic_complete")
            for name in CASES}


def test_builtin_names() -> None:
    assert set(builtin_grammar_names()) >= {"json", "sql", "arithmetic", "tool_call"}
    with pytest.raises(GrammarError):
        load_builtin_grammar("nope")


@pytest.mark.parametrize("name", sorted(CASES))
def test_builtin_grammar_agrees_with_lark(name: str, references: dict[str, lark.Lark]) -> None:
    grammar = compile_grammar(load_builtin_grammar(name), BYTES_VOCAB)
    for text in CASES[name]:
        m = grammar.matcher()
        ours = m.advance_bytes(text.encode()) and m.is_accepting()
        assert ours == lark_accepts(references[name], text), (name, text)


LARK_FEATURES = [
    # (grammar, text, accepted)
    ('start: "a"i "b"', "Ab", True),
    ('start: WORD+\n%import common.WORD\n%import common.WS\n%ignore WS', " ab  cd ", True),
    ('start: _list{NUMBER, ","}\n_list{x, sep}: x (sep x)*\n%import common.NUMBER', "1,2.5,3", True),
    ('start: _list{NUMBER, ","}\n_list{x, sep}: x (sep x)*\n%import common.NUMBER', "1,,2", False),
    ('start: x ~ 2..3\nx: "x"', "xxx", True),
    ('start: x ~ 2..3\nx: "x"', "x", False),
    ('start: [a] "b"\na: "a"', "b", True),
    ('?start: s\ns: "(" s* ")"', "(()())", True),
    ("start: ESCAPED_STRING\n%import common.ESCAPED_STRING", '"a\\"b"', True),
    ("start: ESCAPED_STRING\n%import common.ESCAPED_STRING", '"a"b"', False),
    ("start: C_COMMENT\n%import common.C_COMMENT", "/* x * y */", True),
    ("start: C_COMMENT\n%import common.C_COMMENT", "/* x */ y */", False),
    ('start: A B\nA: /[a-z]+/\nB: /[0-9]+/', "abc123", True),
]


@pytest.mark.parametrize(("grammar_text", "text", "accepted"), LARK_FEATURES)
def test_lark_features(grammar_text: str, text: str, accepted: bool) -> None:
    m = compile_grammar(grammar_text, BYTES_VOCAB).matcher()
    assert (m.advance_bytes(text.encode()) and m.is_accepting()) == accepted


@pytest.mark.parametrize("grammar_text", [
    "start: missing_rule",
    'start: "a" (',
    "start: /(?<!a)b/",
    'start: a\na: b "x"\nb: a "y" | "z"',
])
def test_lark_errors_are_grammar_errors(grammar_text: str) -> None:
    with pytest.raises(GrammarError):
        compile_grammar(grammar_text, BYTES_VOCAB)


def shortest_completion(grammar, state: int, limit: int = 20000) -> bytes | None:  # type: ignore[no-untyped-def]
    """A short text that completes the match: best-first search over single bytes, preferring states with
    shallower parser stacks (so nesting unwinds) and then shorter paths."""
    automaton = grammar.automaton

    def depth(s: int) -> int:
        stacks = getattr(automaton, "stacks", None)
        return min(len(st) for st in stacks(s)) if stacks is not None and stacks(s) else 0

    parents: dict[int, tuple[int, int] | None] = {state: None}
    heap = [(depth(state), 0, state)]
    while heap and len(parents) < limit:
        _, length, s = heapq.heappop(heap)
        if automaton.accepting(s):
            out = bytearray()
            while parents[s] is not None:
                s, b = parents[s]  # type: ignore[misc]
                out.append(b)
            return bytes(reversed(out))
        for b in range(256):
            t = automaton.step(s, bytes([b]))
            if t >= 0 and t not in parents:
                parents[t] = (s, b)
                heapq.heappush(heap, (depth(t), length + 1, t))
    return None


def random_walk(grammar, vocab: Vocabulary, rng: random.Random, steps: int = 30) -> bytes:  # type: ignore
    """Sample `steps` tokens from the masks (checking they are never empty), then finish along the shortest
    completion, byte by byte, and end with EOS."""
    m = grammar.matcher()
    row = vocab.new_mask()
    out = bytearray()
    for _ in range(steps):
        m.fill_mask(row)
        ids = allowed_ids(row, vocab.size)
        assert ids.size > 0, f"empty mask after {bytes(out)!r}"
        tid = int(rng.choice(ids))
        if tid in vocab.eos_token_ids:
            return bytes(out)
        assert m.advance(tid)
        out += vocab.token_bytes[tid]
    tail = shortest_completion(grammar, m.state)
    assert tail is not None, f"no completion after {bytes(out)!r}"
    assert m.advance_bytes(tail) and m.is_accepting()
    return bytes(out + tail)


@pytest.mark.parametrize("name", sorted(CASES))
def test_random_walks_parse_with_lark(name: str, references: dict[str, lark.Lark]) -> None:
    vocab, _ = VOCABS["gpt2"]()
    grammar = compile_grammar(load_builtin_grammar(name), vocab)
    rng = random.Random(1234)
    for _ in range(4):
        text = random_walk(grammar, vocab, rng)
        assert lark_accepts(references[name], text.decode("utf-8")), (name, text)
