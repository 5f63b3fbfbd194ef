"""Regex -> byte DFA -> token masks: exact UTF-8, re.fullmatch as the oracle, refusals before decoding."""

from __future__ import annotations

import random
import re

import pytest
from grammar_vocabs import VOCABS, allowed_ids, is_allowed
from hypothesis import given, settings
from hypothesis import strategies as st

from radixgen.grammars import GrammarError, Vocabulary, compile_regex
from radixgen.grammars.regex import regex_to_dfa

PATTERNS = [
    r"[0-9]{3}-[0-9]{4}",
    r"(ab|cd)*e?",
    r"[a-zé€😀]+",
    r'"([^"\\]|\\.)*"',
    r"(?i:hello) world",
    r"[^a-z]{1,3}",
    r"\d+(\.\d+)?",
    r"[\u0100-\u01ff]x\u00e9",
    r"(true|false|null)",
    r".{2}",
    r"\w+@\w+\.(com|org)",
]

TEXTS = ["123-4567", "12-4567", "abcde", "abab", "e", "", "é€😀a", "éé", '"a\\"b"', '"a"b"', "HeLLo world",
         "hello World", "ÀÁ", "!!!", "abcd", "3.14", "3.", "Āxé", "\uffffxé", "ÿxé", "true", "nul", "a\n",
         "\n\n",
         "😀😀", "bob@example.com", "a b@c.com", "é", "\x00", "\x7f\x80"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_dfa_matches_like_re_fullmatch(pattern: str) -> None:
    dfa = regex_to_dfa(pattern)
    for text in TEXTS:
        expected = re.fullmatch(pattern, text, re.ASCII) is not None
        assert dfa.matches(text.encode()) == expected, (pattern, text)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_dfa_property_against_re(data: st.DataObject) -> None:
    pattern = data.draw(st.sampled_from(PATTERNS))
    dfa = regex_to_dfa(pattern)
    positive = data.draw(st.from_regex(pattern, fullmatch=True))
    expected = re.fullmatch(pattern, positive, re.ASCII) is not None
    assert dfa.matches(positive.encode("utf-8", "surrogatepass")) == expected
    other = data.draw(st.text(alphabet=st.sampled_from("ab0123-.é😀\"\\ xX@"), max_size=8))
    assert dfa.matches(other.encode()) == (re.fullmatch(pattern, other, re.ASCII) is not None)


def test_invalid_utf8_is_never_matched() -> None:
    dfa = regex_to_dfa(r"[^a]*")
    for bad in (b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80"):
        assert not dfa.matches(bad), bad
    assert dfa.matches("€😀".encode())


@pytest.mark.parametrize("pattern", [r"(?<!a)b", r"(a)\1", r"a(?=b)", r"(", r"a{2,1}", r"a\bc", r"a^b"])
def test_unsupported_or_invalid_regex_is_refused(pattern: str) -> None:
    with pytest.raises(GrammarError):
        regex_to_dfa(pattern)


def _tiny_vocab() -> Vocabulary:
    tokens = [bytes([b]) for b in range(256)] + [b"12", b"3-", b"-45", "é".encode(), b"\xc3", b"<eos>"]
    return Vocabulary(tokens, eos_token_ids=[len(tokens) - 1])


def test_token_ending_inside_a_character_is_allowed_exactly() -> None:
    vocab = _tiny_vocab()
    grammar = compile_regex(r"[é€]+", vocab)
    m = grammar.matcher()
    row = vocab.new_mask()
    m.fill_mask(row)
    e_acute, half = 259, 260  # "é" and its first byte alone
    assert all(is_allowed(row, t) for t in (0xC3, 0xE2, e_acute, half))
    assert not is_allowed(row, ord("a")) and not is_allowed(row, 0xA9)
    assert not is_allowed(row, 261)  # EOS: nothing matched yet
    assert m.advance(half)
    m.fill_mask(row)
    assert list(allowed_ids(row, vocab.size)) == [0xA9]  # only the continuation byte of é
    assert not m.is_accepting()
    assert m.advance(0xA9) and m.is_accepting()


@pytest.mark.parametrize("vocab_name", ["gpt2", "qwen3"])
def test_regex_accepts_valid_text_token_by_token(vocab_name: str) -> None:
    vocab, encode = VOCABS[vocab_name]()
    cases = [(r"\d{3}-\d{4}", "555-1234"), (r"[A-Z][a-z]+( [A-Z][a-z]+)*", "Hello World Again"),
             (r'\{"name": "[^"]*", "age": \d+\}', '{"name": "Zoë", "age": 31}')]
    row = vocab.new_mask()
    for pattern, text in cases:
        m = compile_regex(pattern, vocab).matcher()
        for tid in encode(text):
            m.fill_mask(row)
            assert is_allowed(row, tid), (pattern, vocab.token_bytes[tid])
            assert m.advance(tid)
        assert m.is_accepting()
        m.fill_mask(row)
        assert all(is_allowed(row, e) for e in vocab.eos_token_ids)


@pytest.mark.parametrize("vocab_name", ["gpt2", "smollm2"])
def test_random_walks_always_fullmatch(vocab_name: str) -> None:
    vocab, _ = VOCABS[vocab_name]()
    rng = random.Random(0)
    row = vocab.new_mask()
    for pattern in [r"[a-z]{2,6}( [a-z]{2,6}){0,3}", r"-?(0|[1-9]\d{0,5})(\.\d{1,3})?", r"(yes|no|maybe)!"]:
        grammar = compile_regex(pattern, vocab)
        for _ in range(5):
            m = grammar.matcher()
            out = b""
            while True:
                m.fill_mask(row)
                ids = allowed_ids(row, vocab.size)
                assert ids.size > 0
                tid = int(rng.choice(list(ids)))
                if tid in vocab.eos_token_ids:
                    break
                assert m.advance(tid)
                out += vocab.token_bytes[tid]
            assert re.fullmatch(pattern, out.decode()), (pattern, out)
