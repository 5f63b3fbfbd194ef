"""Fused bounded repetitions (grammars/counted.py) and the walk cache's LRU (grammars/lru.py).

The fused DFA of `item{lo,hi} close` must accept exactly what the regex of the same text accepts (interegular
builds the reference, slowly but independently); grammars with the same bounds must share one DFA object
(so one per-vocabulary walk cache); what cannot be fused stays a counted rule.
"""

from __future__ import annotations

import random

import pytest

from radixgen.grammars import Vocabulary, compile_grammar
from radixgen.grammars.counted import MAX_FUSED_STATES, bounded_repeat, fusable
from radixgen.grammars.ebnf import _class_dfa, _literal_dfa
from radixgen.grammars.json_schema import compile_json_schema
from radixgen.grammars.json_schema_charset import ANY_JSON_CHAR
from radixgen.grammars.lru import ByteLru
from radixgen.grammars.regex import regex_to_dfa

PIECES = ["a", "é", "🎉", "\\n", '\\"', "\\u00e9", "\\ud800", "\\uD83D", '"', "\\", "\\x", "\n"]


def random_texts(seed: int, count: int, longest: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, longest)))
        out.append(text.encode())
        out.append(text.encode()[: rng.randint(0, len(text.encode()))])  # cut anywhere, mid-character too
    return out


@pytest.mark.parametrize(("lo", "hi"), [(0, 1), (2, 5), (3, 3), (0, 12)])
def test_json_string_repetition_matches_the_regex(lo: int, hi: int) -> None:
    item, close = regex_to_dfa(ANY_JSON_CHAR), _literal_dfa('"')
    fused = bounded_repeat(item, lo, hi, close)
    reference = regex_to_dfa(f'{ANY_JSON_CHAR}{{{lo},{hi}}}"')
    texts = random_texts(lo * 31 + hi, 1500, hi + 2) + [b"a" * n + b'"' for n in range(hi + 3)]
    for text in texts:
        assert fused.matches(text) == reference.matches(text), text
    assert fused.matches(b"a" * lo + b'"') and not fused.matches(b"a" * (hi + 1) + b'"')


def test_character_class_repetition_matches_the_regex() -> None:
    item = _class_dfa(((0x61, 0x7A), (0xE9, 0xE9)), False)  # [a-zé]
    fused = bounded_repeat(item, 2, 7, _literal_dfa(";"))
    reference = regex_to_dfa("[a-zé]{2,7};")
    for text in random_texts(7, 1500, 9) + [b"ab;", b"\xc3\xa9" * 7 + b";", b"a;", b"abcdefgh;"]:
        assert fused.matches(text) == reference.matches(text), text


def test_what_is_not_fused() -> None:
    item, quote = regex_to_dfa(ANY_JSON_CHAR), _literal_dfa('"')
    assert fusable(item, quote, 10)
    assert not fusable(regex_to_dfa("a+"), quote, 10)  # accepts, then reads on: not one item
    assert not fusable(item, _literal_dfa("x"), 10)  # `x` could continue the string or close it
    assert not fusable(item, quote, MAX_FUSED_STATES)  # too many rows


def _terminal_sizes(grammar) -> list[int]:  # type: ignore[no-untyped-def]
    return [dfa.num_states for _, dfa in grammar.automaton.pda.terminals]


def test_schemas_with_equal_bounds_share_one_terminal() -> None:
    vocab = Vocabulary([bytes([b]) for b in range(32, 127)] + [b"<eos>"], eos_token_ids=[95])
    one = compile_json_schema({"type": "string", "maxLength": 40}, vocab)
    two = compile_json_schema({"type": "object", "properties": {"k": {"type": "string", "maxLength": 40}}},
                              vocab)
    fused = {id(d) for _, d in one.automaton.pda.terminals} & {id(d) for _, d in two.automaton.pda.terminals}
    assert any(d.num_states == 40 * 16 + 2 and id(d) in fused for _, d in one.automaton.pda.terminals)
    # Beyond the fused size the repetition is read in blocks of 256 characters (one fused DFA) and a tail.
    long = compile_json_schema({"type": "string", "maxLength": 1000}, vocab)
    assert 256 * 16 + 1 in _terminal_sizes(long) and max(_terminal_sizes(long)) <= MAX_FUSED_STATES
    text = b'"' + b"x" * 1000 + b'"'
    m = long.matcher()
    assert m.advance_bytes(text) and m.is_accepting() and not long.matcher().advance_bytes(text[:-1] + b'x"')
    # A grammar's own bounded class repetition is fused too.
    gbnf = compile_grammar('root ::= "<" [a-z]{1,20} ">"', vocab, syntax="ebnf")
    assert 20 + 2 in _terminal_sizes(gbnf)


@pytest.mark.parametrize(("lo", "hi"), [(0, 1000), (300, 700), (256, 512), (511, 513), (0, 256 * 3)])
def test_blocked_repetition_reads_exactly_its_counts(lo: int, hi: int) -> None:
    """A bound too large for one DFA is read in blocks (counted.blocked_repeat): every count from lo to hi
    is accepted, with one- to four-byte characters and escapes, and no other count, at every block edge."""
    vocab = Vocabulary([bytes([b]) for b in range(32, 127)] + [b"<eos>"], eos_token_ids=[95])
    grammar = compile_json_schema({"type": "string", "minLength": lo, "maxLength": hi}, vocab)
    assert max(_terminal_sizes(grammar)) <= MAX_FUSED_STATES
    pieces = ["a", "é", "🎉", "\\n", "\\u00e9", "€"]
    edges = {lo - 1, lo, lo + 1, hi - 1, hi, hi + 1} | {e + d for e in range(256, hi + 2, 256) for d in (-1, 0, 1)}
    for count in sorted(n for n in edges if n >= 0):
        text = ('"' + "".join(pieces[i % len(pieces)] for i in range(count)) + '"').encode()
        m = grammar.matcher()
        accepted = m.advance_bytes(text) and m.is_accepting()
        assert accepted == (lo <= count <= hi), count


def test_byte_lru_evicts_least_recently_used() -> None:
    cache: ByteLru[str] = ByteLru(10)
    assert cache.put("a", "A", 4) == "A" and cache.put("b", "B", 4) == "B"
    assert cache.get("a") == "A"  # now "b" is the oldest
    assert cache.put("c", "C", 4) == "C"
    assert cache.get("b") is None and cache.get("a") == "A" and cache.evictions == 1
    assert cache.put("a", "other", 1) == "A"  # kept unless replaced
    assert cache.put("a", "new", 2, replace=True) == "new" and cache.nbytes == 6
    assert cache.put("big", "X", 100) == "X" and len(cache) == 1  # the newest entry always stays
