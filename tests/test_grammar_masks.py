"""Masks from the cached frame walks (grammars/masks.py) equal a plain walk of the whole configuration.

The mask cache splits each parser stack into frames, walks each frame alone from the trie nodes where the
frame above it ends, keys those walks by lookahead representatives, reuses terminal walks across grammars
and fixes the few long tokens separately. The reference here does none of that: one walk of the vocabulary
trie from the real configuration (`walk_trie` without handoff), EOS where accepting. Every position visited
by real instances and by seeded random walks over allowed tokens must give the same row bit for bit.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from grammar_vocabs import VOCABS

from radixgen.grammars import Grammar, Vocabulary, clear_cache, compile_grammar, load_builtin_grammar
from radixgen.grammars.automaton import PdaAutomaton
from radixgen.grammars.json_schema import compile_json_schema
from radixgen.grammars.lru import ByteLru
from radixgen.grammars.pda import called_states
from radixgen.grammars.token_walk import nodes_to_mask, walk_trie

ITEM = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 40}}},
        "required": ["id"], "additionalProperties": False}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 50},  # one fused terminal (counted.py)
        "kind": {"enum": ["alpha", "beta", "gamma"]},
        "items": {"type": "array", "items": ITEM, "maxItems": 4},
        "nested": {"$ref": "#/$defs/node"},
        "when": {"type": "string", "format": "date"},
        "either": {"anyOf": [{"type": "number"}, {"type": "boolean"}, {"type": "null"}]},
    },
    "required": ["name"],
    "additionalProperties": {"type": "string"},  # keys other than the declared names
    "$defs": {"node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"},
                                                        "v": {"type": "string"}}}},
}
INSTANCES = [
    {"name": "example-package", "kind": "beta", "items": [{"id": 7, "tags": ["a", "b c"]}, {"id": 999}],
     "nested": {"child": {"child": {"v": "deep"}, "v": "x"}}, "when": "2026-11-30", "either": 1.5,
     "extra": "value", "another key": "é"},
    {"name": "x" * 50, "items": [], "either": None},
    {"name": "ÃÂ" * 20 + "-" * 10, "nested": {}},
]
BOUNDED = {  # strings with bounds (fused into one terminal up to 256 characters, counted rules beyond) and keys
    "type": "object",
    "properties": {
        "a": {"type": "string", "maxLength": 17},
        "b": {"type": "string", "minLength": 3, "maxLength": 40},
        "c": {"type": "string", "minLength": 20, "maxLength": 24},
        "d": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 256}},
        "e": {"type": "string", "maxLength": 300},
        "f": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 20}},
    },
    "additionalProperties": {"type": "integer"},  # free-form keys other than a..f
}
BOUNDED_INSTANCES = [
    {"a": "x" * 17, "b": "abc", "c": "é" * 20, "d": ["a", "\\n\"" * 30, "🎉" * 256], "e": "y" * 300,
     "f": {"": "", "key with spaces": "v" * 20, "é": "\u0001"}, "g": 1, "aa": 2, "\"": 3},
    {"b": "Ã" * 40, "c": "c" * 24, "d": [], "f": {}},
]
EBNF_BOUNDED = r'''
root ::= item ( "," item )*
item ::= "\"" [a-zé]{2,30} "\"" | "'" [^'\\]{0,12} "'" | [0-9]{1,3} ";"
'''
EBNF = r'''
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")" | "-" factor
'''
GRAMMARS = {
    "json-schema": lambda vocab: compile_json_schema(SCHEMA, vocab),
    "lark-json": lambda vocab: compile_grammar(load_builtin_grammar("json"), vocab),
    "ebnf-arithmetic": lambda vocab: compile_grammar(EBNF, vocab, syntax="ebnf"),
    "json-schema-bounded": lambda vocab: compile_json_schema(BOUNDED, vocab),
    "ebnf-bounded": lambda vocab: compile_grammar(EBNF_BOUNDED, vocab, syntax="ebnf"),
}
TEXTS = {
    "json-schema": [json.dumps(x, ensure_ascii=False) for x in INSTANCES],
    "lark-json": ['{"a": [1, 2.5, {"b": [[[]]], "c": null}], "d": "e\\"f", "g": {"h": {"i": {"j": true}}}}'],
    "ebnf-arithmetic": ["((1+2)*(3-(4/5)))-(((6)))", "-(7*-8)+9"],
    "json-schema-bounded": [json.dumps(x, ensure_ascii=False) for x in BOUNDED_INSTANCES],
    "ebnf-bounded": ['"ab",\'hello world!\',7;,"éééééééééééééééééééééééééééééé",\'\',"zz",123;'],
}


def plain_mask(grammar: Grammar, vocab: Vocabulary, state: int) -> np.ndarray:
    """The reference: one walk of the trie from the whole configuration."""
    out = nodes_to_mask(vocab, walk_trie(grammar.automaton, state, vocab.trie).alive_nodes)
    if grammar.automaton.accepting(state):
        out |= vocab.eos_mask
    return out


def check_along(grammar: Grammar, vocab: Vocabulary, tokens: list[int]) -> int:
    """Compare the masks at every position of `tokens` (which must be accepted); returns positions."""
    m = grammar.matcher()
    for i, tid in enumerate(tokens + [None]):
        np.testing.assert_array_equal(grammar.mask(m.state), plain_mask(grammar, vocab, m.state),
                                      err_msg=f"position {i}")
        if tid is not None:
            assert m.advance(tid), f"token {i} refused"
    return len(tokens) + 1


def random_tokens(grammar: Grammar, seed: int, steps: int) -> list[int]:
    """A seeded walk over allowed tokens (EOS excluded), stopping where only EOS is left."""
    rng = random.Random(seed)
    m = grammar.matcher()
    eos = set(grammar.vocab.eos_token_ids)
    out: list[int] = []
    for _ in range(steps):
        choices = [t for t in m.allowed_token_ids().tolist() if t not in eos]
        if not choices:
            break
        # Prefer short tokens half of the time, so walks also stop inside keys, strings and numbers.
        if rng.random() < 0.5:
            short = [t for t in choices if len(grammar.vocab.token_bytes[t]) <= 2]
            choices = short or choices
        tid = rng.choice(choices)
        out.append(tid)
        assert m.advance(tid)
    return out


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_masks_equal_plain_walk_on_instances(name: str) -> None:
    vocab, encode = VOCABS["gpt2"]()
    clear_cache()
    grammar = GRAMMARS[name](vocab)
    assert sum(check_along(grammar, vocab, encode(text)) for text in TEXTS[name]) > 20


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_masks_equal_plain_walk_on_random_walks(name: str) -> None:
    vocab, _ = VOCABS["gpt2"]()
    clear_cache()
    grammar = GRAMMARS[name](vocab)
    for seed in range(3):
        check_along(grammar, vocab, random_tokens(grammar, seed, 30))


def test_masks_equal_plain_walk_without_precompute() -> None:
    """The same tables with every walk done on first use (no compile-time precompute): same rows."""
    vocab, encode = VOCABS["gpt2"]()
    clear_cache()
    compiled = compile_json_schema(SCHEMA, vocab)
    lazy = Grammar("json_schema", "lazy", vocab, PdaAutomaton(compiled.automaton.pda))
    for text in TEXTS["json-schema"]:
        tokens = encode(text)
        check_along(lazy, vocab, tokens)
        m, n = lazy.matcher(), compiled.matcher()
        for tid in tokens:
            np.testing.assert_array_equal(lazy.mask(m.state), compiled.mask(n.state))
            assert m.advance(tid) and n.advance(tid)


def test_precompute_budget_is_a_vocabulary_option() -> None:
    """`precompute_s=0` leaves every position for first use (fewer configurations interned at compile time);
    the masks are the same either way; a negative budget is refused."""
    vocab, encode = VOCABS["gpt2"]()
    lazy_vocab = Vocabulary(vocab.token_bytes, vocab.eos_token_ids, vocab.special_ids, precompute_s=0.0)
    clear_cache()
    eager, lazy = compile_json_schema(SCHEMA, vocab), compile_json_schema(SCHEMA, lazy_vocab)
    assert lazy.automaton.num_states < eager.automaton.num_states
    for text in TEXTS["json-schema"]:
        m, n = lazy.matcher(), eager.matcher()
        for tid in encode(text):
            np.testing.assert_array_equal(lazy.mask(m.state), eager.mask(n.state))
            assert m.advance(tid) and n.advance(tid)
    with pytest.raises(ValueError, match="precompute_s"):
        Vocabulary(vocab.token_bytes, vocab.eos_token_ids, precompute_s=-1.0)


def test_only_called_rules_can_be_top_frames() -> None:
    """Precompute skips rules nobody calls: their states only sit in root frames of a configuration."""
    vocab, _ = VOCABS["gpt2"]()
    grammar = compile_grammar('root ::= "a" x "b" x\nx ::= "c" | "d" x', vocab, syntax="ebnf")
    automaton = grammar.automaton
    called = called_states(automaton.pda)
    assert called.any() and not called.all() and not called[automaton.pda.start]
    for text in (b"acb", b"adcbc", b"addcbddc"):
        state = automaton.initial
        for byte in text:
            state = automaton.step(state, bytes([byte]))
            assert state >= 0
            assert all(called[frame] for stack in automaton.stacks(state) for frame in stack[1:])


def test_long_tokens_inside_counted_repetitions() -> None:
    """A tiny vocabulary whose long tokens (runs of 'a' up to 24 bytes) cross a maxLength chain: positions
    far from the end share frame walks and only the long tokens are stepped."""
    tokens = [bytes([b]) for b in range(32, 127)] + [b"a" * n for n in range(2, 25)] + [b'a"', b'",', b"<eos>"]
    vocab = Vocabulary(tokens, eos_token_ids=[len(tokens) - 1])
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 30},
                                               "t": {"type": "array", "items": {"type": "string",
                                                                                 "maxLength": 20}}},
              "required": ["s", "t"], "additionalProperties": False}
    clear_cache()
    grammar = compile_json_schema(schema, vocab)
    index = {tok: i for i, tok in enumerate(tokens)}
    for value in ("a" * 30, "a" * 7, "", "b" * 12 + "a" * 18):
        text = json.dumps({"s": value, "t": ["a" * 20, "a" * 3]}).encode()
        check_along(grammar, vocab, [index[bytes([b])] for b in text])
    for seed in range(4):
        check_along(grammar, vocab, random_tokens(grammar, seed, 40))


def test_masks_equal_plain_walk_with_evicting_walk_cache() -> None:
    """A walk cache far too small for the walks (each evicts others): same rows, walked again when evicted."""
    vocab, encode = VOCABS["gpt2"]()
    saved = vocab.terminal_walks
    vocab.terminal_walks = ByteLru(64 << 10)
    try:
        clear_cache()
        for name in ("json-schema", "json-schema-bounded"):
            grammar = GRAMMARS[name](vocab)
            for text in TEXTS[name]:
                check_along(grammar, vocab, encode(text))
        assert vocab.terminal_walks.evictions > 0
        assert vocab.terminal_walks.nbytes <= 64 << 10 or len(vocab.terminal_walks) == 1
    finally:
        vocab.terminal_walks = saved
        clear_cache()
