"""Masks shared between positions of a bounded repetition (grammars/lookahead.py) stay exact."""

from __future__ import annotations

import json

import numpy as np

from radixgen.grammars import Vocabulary, compile_grammar
from radixgen.grammars.json_schema import compile_json_schema
from radixgen.grammars.long_tokens import automaton_steps, read_frame
from radixgen.grammars.lookahead import lookahead_representatives
from radixgen.grammars.vocabulary import as_run

# Single bytes, runs of 'a' of every length up to 24 (the 16 longest are longer than 9 bytes, so positions
# more than 9 characters from the end of a maxLength share masks and the tokens past 9 bytes are stepped), and
# multi-byte characters.
TOKENS = ([bytes([b]) for b in range(256)] + [b"a" * n for n in range(2, 25)] + [b'"a', b'a"', b'a",',
          "é".encode(), ("é" * 5).encode(), b"\\u00e9", b"<eos>"])
EOS = len(TOKENS) - 1
VOCAB = Vocabulary(TOKENS, eos_token_ids=[EOS])


def _check_masks_along(grammar, text: bytes) -> int:  # type: ignore[no-untyped-def]
    """Walk `text` byte by byte; at every position the mask equals stepping each token. Returns positions."""
    m = grammar.matcher()
    automaton = grammar.automaton
    for i, byte in enumerate(text):
        allowed = set(m.allowed_token_ids().tolist())
        for tid, data in enumerate(VOCAB.token_bytes):
            if tid == EOS:
                assert (tid in allowed) == m.is_accepting(), (i, tid)
            else:
                assert (tid in allowed) == (automaton.step(m.state, data) >= 0), (text[:i], data)
        assert m.advance(byte), text[: i + 1]
    return len(text)


def test_split_leaves_at_most_sixteen_long_tokens() -> None:
    split, long_tokens, bits = VOCAB.long_tokens
    assert split == 9 and len(long_tokens) == 16  # runs of 10..24 and "é" * 5
    assert all(len(data) > split for _, data, _ in long_tokens)
    for _tid, data, prefix in long_tokens:
        assert prefix < 0 or data.startswith(long_tokens[prefix][1])
    assert int(np.unpackbits(bits.view(np.uint8)).sum()) == 16


def test_long_tokens_as_runs_read_like_their_bytes() -> None:
    assert as_run(b" " + b"-" * 32) == (b" ", b"-", 32)
    assert as_run("é".encode() * 5) == (b"", "é".encode(), 5)
    assert as_run(b"abababc") == (b"abababc", b"", 0)
    assert all(head + unit * count == data for (head, unit, count), (_, data, _)
               in zip(VOCAB.long_token_runs, VOCAB.long_tokens[1]))
    # A run stops early at a unit that leaves the state unchanged (an unbounded string), never elsewhere: the
    # same answer as reading every byte.
    for schema in ({"type": "array", "items": {"type": "string", "maxLength": 15}}, {"type": "string"}):
        automaton = compile_json_schema(schema, VOCAB).automaton
        for prefix in (b'["', b'["aaaa', b'["aa", "a', b'"'):
            state = automaton.step(automaton.initial, prefix)
            if state < 0:
                continue
            for run, (_, data, _) in zip(VOCAB.long_token_runs, VOCAB.long_tokens[1]):
                for offset in (0, 3):
                    args = (*automaton_steps(automaton), state, data)
                    assert (read_frame(*args, run, offset, False)
                            == read_frame(*args, (data, b"", 0), offset, False)), (prefix, data, offset)


def test_bounded_string_positions_share_and_stay_exact() -> None:
    grammar = compile_json_schema({"type": "object", "properties": {"s": {"type": "string", "maxLength": 30},
                                                                   "t": {"type": "string", "maxLength": 20}},
                                   "required": ["s", "t"], "additionalProperties": False}, VOCAB)
    reps = lookahead_representatives(grammar.automaton.pda, VOCAB.long_tokens[0])
    assert (reps != np.arange(reps.shape[0])).sum() >= 20  # the chains' early positions merged
    for value in ("a" * 30, "é" * 12 + "a" * 18, "a" * 7, ""):
        text = json.dumps({"s": value, "t": "a" * 20}, ensure_ascii=False).encode()
        _check_masks_along(grammar, text)


def test_nullable_callees_keep_return_states_apart() -> None:
    # `x` may read nothing: an optional rule called inside a bounded repetition.
    grammar = compile_grammar('root ::= ("a" x){0,40} "b"\nx ::= "c"?', VOCAB, syntax="ebnf")
    _check_masks_along(grammar, b"acacac" + b"a" * 20 + b"b")
