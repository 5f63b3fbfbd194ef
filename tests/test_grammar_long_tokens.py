"""The tokens longer than the lookahead split are decided per stack, frame by frame (grammars/long_tokens.py),
exactly: each stack's answer equals stepping the token's bytes from that stack alone, and whole masks equal
stepping every token."""

from __future__ import annotations

import json

import pytest

from radixgen.grammars import Vocabulary, compile_grammar
from radixgen.grammars.json_schema import compile_json_schema
from radixgen.grammars.long_tokens import LongTokenReader

# Single bytes and a few long tokens that cross frames: a unit closing a string and opening the next, runs of
# digits and separators, of spaces and of one character. With fewer than 16 tokens over one byte, the split is
# one byte: nearly every position is replaced by a representative, so the long tokens decide a lot.
LONG = [b'a", "' * 4, b'a","' * 5, b"1, " * 6, b"1," * 9, b"-" * 20, b" " * 20, b"a" * 24, b'"a' * 7,
        b'1]], [[' * 3, "é".encode() * 6, b"12>", b"1,12>"]
TOKENS = [bytes([b]) for b in range(256)] + [b'",', b"]]", b"a,"] + LONG + [b"<eos>"]
EOS = len(TOKENS) - 1
VOCAB = Vocabulary(TOKENS, eos_token_ids=[EOS])

GRAMMARS = [
    ("schema", {"type": "array", "items": {"type": "string", "maxLength": 12}}),
    ("schema", {"type": "array", "items": {"type": "array", "items": {"type": "array",
                                                                      "items": {"type": "integer"}}}}),
    ("schema", {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}},
                                                 "b": {"type": "string", "maxLength": 30}}}),
    ("ebnf", 'root ::= "[" item ("," " "* item)* "]"\nitem ::= "1" | "a"+ | "[" item "]"'),
    # a resumed frame that may end at once (`seq` after a `num`): a pop without a byte between two frames
    ("ebnf", 'root ::= "<" seq ">"\nseq ::= num ("," num)*\nnum ::= "1" "2"?'),
]
INSTANCES = {
    0: [["a", "aaaa", "a-a", "   "], []],
    1: [[[[1, 1, 1], [1]], [[1]]], [[]]],
    2: [{"a": ["a", "a", "aa"], "b": "-" * 25}, {"b": " " * 30}],
    3: [b"[1, 1,   1,[aa],a]", b"[[[1]]]"],
    4: [b"<1,12,1,1,1>", b"<12>"],
}


def _compile(index: int):  # type: ignore[no-untyped-def]
    kind, source = GRAMMARS[index]
    return (compile_json_schema(source, VOCAB) if kind == "schema"
            else compile_grammar(str(source), VOCAB, syntax="ebnf"))


def _texts(index: int) -> list[bytes]:
    return [v if isinstance(v, bytes) else json.dumps(v, ensure_ascii=False).encode() for v in INSTANCES[index]]


@pytest.mark.parametrize("index", range(len(GRAMMARS)))
def test_each_stack_reads_long_tokens_as_stepping_does(index: int) -> None:
    grammar = _compile(index)
    automaton = grammar.automaton
    reader = LongTokenReader(VOCAB, automaton)
    entries = VOCAB.long_tokens[1]
    assert VOCAB.long_tokens[0] == 1 and len(entries) == len(LONG) + 3
    for text in _texts(index):
        state = automaton.initial
        for i in range(len(text) + 1):
            for stack in automaton.stacks(state):
                alone = automaton.intern_stacks((stack,))
                bits = reader.readable(stack, (1 << len(entries)) - 1)
                for k, (_, data, _) in enumerate(entries):
                    assert bool(bits >> k & 1) == (automaton.step(alone, data) >= 0), (text[:i], stack, data)
            if i < len(text):
                state = automaton.step(state, text[i:i + 1])
                assert state >= 0, text[:i + 1]


@pytest.mark.parametrize("index", range(len(GRAMMARS)))
def test_masks_with_long_tokens_are_exact(index: int) -> None:
    grammar = _compile(index)
    automaton = grammar.automaton
    for text in _texts(index):
        m = grammar.matcher()
        for i in range(len(text) + 1):
            allowed = set(m.allowed_token_ids().tolist())
            for tid, data in enumerate(TOKENS):
                if tid == EOS:
                    assert (tid in allowed) == m.is_accepting(), text[:i]
                else:
                    assert (tid in allowed) == (automaton.step(m.state, data) >= 0), (text[:i], data)
            if i < len(text):
                assert m.advance(text[i])
