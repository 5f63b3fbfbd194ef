"""Matcher API: masks (layout, EOS, specials), advance, rollback, forced_suffix, caching, real vocabs."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from grammar_vocabs import VOCABS, allowed_ids, is_allowed

from radixgen.grammars import (
    GrammarError,
    Vocabulary,
    bitmask_words,
    compile,
    compile_grammar,
    compile_regex,
    load_builtin_grammar,
    pack_bitmask,
    unpack_bitmask,
)

TOKENS = [bytes([b]) for b in range(256)] + [b'{"', b'"}', b"true", b"<eos>", b"<special>", b""]
EOS, SPECIAL, EMPTY = 259, 260, 261
VOCAB = Vocabulary(TOKENS, eos_token_ids=[EOS], special_ids=[SPECIAL])


def test_bitmask_layout_matches_the_logits_kernel() -> None:
    torch = pytest.importorskip("torch")
    from radixgen.kernels import apply_token_bitmask_reference

    rng = np.random.default_rng(0)
    for vocab_size in (1, 31, 32, 33, 100):
        allowed = rng.random(vocab_size) < 0.5
        row = pack_bitmask(allowed)
        assert row.dtype == np.int32 and row.shape == (bitmask_words(vocab_size),)
        assert (unpack_bitmask(row, vocab_size) == allowed).all()
        logits = torch.zeros(1, vocab_size)
        apply_token_bitmask_reference(logits, torch.from_numpy(row[None, :]))
        assert (torch.isfinite(logits[0]).numpy() == allowed).all()


def test_fill_mask_zeroes_padding_words() -> None:
    m = compile_regex(r"a", VOCAB).matcher()
    row = np.full(VOCAB.mask_words + 3, -1, dtype=np.int32)
    m.fill_mask(row)
    assert list(allowed_ids(row, (VOCAB.mask_words + 3) * 32)) == [ord("a")]


def test_eos_only_when_accepting_and_specials_never() -> None:
    m = compile_regex(r"ab?", VOCAB).matcher()
    row = VOCAB.new_mask()
    m.fill_mask(row)
    assert list(allowed_ids(row, VOCAB.size)) == [ord("a")]
    assert not m.advance(EOS) and not m.advance(SPECIAL) and not m.advance(EMPTY)
    assert m.advance(ord("a")) and m.is_accepting() and not m.is_terminated()
    m.fill_mask(row)
    assert list(allowed_ids(row, VOCAB.size)) == [ord("b"), EOS]
    assert m.advance(ord("b")) and m.is_terminated()  # accepting, nothing can follow
    m.fill_mask(row)
    assert list(allowed_ids(row, VOCAB.size)) == [EOS]
    assert m.advance(EOS) and m.is_terminated()
    assert not m.advance(ord("b"))


def test_advance_rejects_without_changing_state() -> None:
    m = compile_grammar(load_builtin_grammar("json"), VOCAB).matcher()
    assert m.advance(256)  # {"
    state = m.state
    assert not m.advance(1)  # a raw control character inside a string
    assert m.state == state and m.num_advanced == 1


def test_rollback_restores_state_and_mask() -> None:
    grammar = compile_grammar(load_builtin_grammar("json"), VOCAB)
    m = grammar.matcher()
    rng = random.Random(0)
    row, states, masks = VOCAB.new_mask(), [], []
    for _ in range(25):
        m.fill_mask(row)
        states.append(m.state)
        masks.append(row.copy())
        ids = [i for i in allowed_ids(row, VOCAB.size) if i != EOS]
        assert m.advance(int(rng.choice(ids)))
    for n in (1, 5, 19):
        m.rollback(n)
        m.fill_mask(row)
        assert m.state == states[m.num_advanced]
        assert (row == masks[m.num_advanced]).all()
    with pytest.raises(ValueError):
        m.rollback(m.num_advanced + 1)
    m.rollback(m.num_advanced)
    assert m.state == states[0]


def test_forced_suffix_for_jump_forward() -> None:
    text = 'root ::= "{\\"name\\": \\"" [a-z]+ "\\", \\"ok\\": " ("true" | "false") "}"'
    grammar = compile_grammar(text, VOCAB, syntax="ebnf")
    m = grammar.matcher()
    assert m.forced_suffix() == b'{"name": "'
    assert m.advance_bytes(b'{"name": "bob')
    assert m.forced_suffix() == b""  # a letter or the closing quote
    assert m.advance_bytes(b'"')
    assert m.forced_suffix() == b', "ok": '
    assert m.advance_bytes(b', "ok": t')
    assert m.forced_suffix() == b"rue}"
    assert m.advance_bytes(b"rue}") and m.is_accepting() and m.forced_suffix() == b""


def test_compile_is_cached_and_dispatches() -> None:
    a = compile_regex(r"x+", VOCAB)
    assert compile_regex(r"x+", VOCAB) is a
    assert compile({"regex": r"x+"}, VOCAB) is a
    assert compile(("regex", r"x+"), VOCAB) is a
    other_vocab = Vocabulary(TOKENS, eos_token_ids=[EOS])
    assert compile_regex(r"x+", other_vocab) is not a
    ebnf = compile({"ebnf": 'root ::= "x"+'}, VOCAB)
    lark_grammar = compile({"grammar": 'start: "x"+'}, VOCAB)
    for g in (ebnf, lark_grammar):
        m = g.matcher()
        assert m.advance_bytes(b"xxx") and m.is_accepting()
    with pytest.raises(GrammarError):
        compile({"regex": "a", "ebnf": "root ::= \"a\""}, VOCAB)
    with pytest.raises(GrammarError):
        compile({"sql": "x"}, VOCAB)
    with pytest.raises(GrammarError):
        compile_regex(r"[^\s\S]", VOCAB)  # matches nothing


def test_matchers_of_one_grammar_are_independent() -> None:
    grammar = compile_regex(r"(ab)+", VOCAB)
    m1, m2 = grammar.matcher(), grammar.matcher()
    assert m1.advance(ord("a"))
    assert m2.state == grammar.automaton.initial and not m2.advance(ord("b"))


JSON_DOCS = [
    {"name": "Zoë Ålund", "age": 31, "tags": ["a", "b c"], "address": {"city": "Zürich", "zip": "8001"}},
    [1, -2.5, 3e10, True, False, None, "日本語のテキスト", {"nested": [[[]]]}],
    {"emoji": "😀 ok", "escaped": "line\nbreak \"quoted\" \\ back", "empty": {}},
]


@pytest.mark.parametrize("vocab_name", ["gpt2", "qwen3", "smollm2"])
def test_json_grammar_accepts_real_tokenizations(vocab_name: str) -> None:
    vocab, encode = VOCABS[vocab_name]()
    grammar = compile_grammar(load_builtin_grammar("json"), vocab)
    row = vocab.new_mask()
    for doc in JSON_DOCS:
        for indent in (None, 2):
            text = json.dumps(doc, ensure_ascii=False, indent=indent)
            m = grammar.matcher()
            for tid in encode(text):
                m.fill_mask(row)
                assert is_allowed(row, tid), (text, vocab.token_bytes[tid])
                assert m.advance(tid)
            assert m.is_accepting()
            m.fill_mask(row)
            assert all(is_allowed(row, e) for e in vocab.eos_token_ids)
            assert not any(is_allowed(row, s) for s in vocab.special_ids - set(vocab.eos_token_ids))


@pytest.mark.parametrize("vocab_name", ["gpt2", "qwen3"])
def test_invalid_json_is_rejected_token_by_token(vocab_name: str) -> None:
    vocab, encode = VOCABS[vocab_name]()
    grammar = compile_grammar(load_builtin_grammar("json"), vocab)
    for text in ['{"a": 1,}', '{"a" 1}', "[1 2]", '{"a": tru}', '"unterminated', "01", '{"a": "\x01"}']:
        m = grammar.matcher()
        ok = all(m.advance(tid) for tid in encode(text)) and m.is_accepting()
        assert not ok, text


def test_mask_matches_per_token_check_on_real_vocab() -> None:
    """The trie walk agrees with stepping every token's bytes through the automaton one by one."""
    vocab, _ = VOCABS["gpt2"]()
    grammar = compile_grammar(load_builtin_grammar("json"), vocab)
    m = grammar.matcher()
    row = vocab.new_mask()
    for prefix in [b"", b'{"a": [1, {"b": "x', b'{"a": [1, {"b": "x"}', b"[[1.5e", b'{"k": tr']:
        m.reset()
        assert m.advance_bytes(prefix) or not prefix
        m.fill_mask(row)
        allowed = set(allowed_ids(row, vocab.size).tolist())
        for tid in range(vocab.size):
            if tid in vocab.special_ids:
                continue
            expect = grammar.automaton.step(m.state, vocab.token_bytes[tid]) >= 0
            assert (tid in allowed) == expect, (prefix, vocab.token_bytes[tid])
