"""A forked matcher (`fork()`, what a beam continuing another beam takes) stands exactly where a fresh matcher fed
the same tokens stands: same masks, termination and forced text along random token walks, independent of the
matcher it came from, and able to roll back as far. On every installed grammar backend."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from grammar_vocabs import allowed_ids, smollm2

from radixgen.grammars import Constraint
from radixgen.grammars.backend import (
    GRAMMAR_BACKENDS,
    CompiledGrammar,
    GrammarBackend,
    GrammarMatcher,
    grammar_backend_factory,
    installed_grammar_backends,
)
from radixgen.runtime.engine import Engine

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "tags": {"type": "array", "items": {"enum": ["a", "bc", "d"]},
                                                    "maxItems": 3},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["name", "n"], "additionalProperties": False}
CONSTRAINTS = {
    "regex": Constraint("regex", r"[a-z]{1,4}( [a-z]{1,4}){0,5}(\.|!)"),
    "json_schema": Constraint("json_schema", json.dumps(SCHEMA)),
    "ebnf": Constraint("ebnf", 'root ::= "(" item ("," item){0,4} ")"\nitem ::= [a-z]{1,3} | [0-9]{1,2}'),
}
BACKENDS = [pytest.param(name, marks=pytest.mark.skipif(name not in installed_grammar_backends(),
                                                        reason=f"{name} is not installed"))
            for name in GRAMMAR_BACKENDS]


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> GrammarBackend:
    vocab, encode = smollm2()
    return grammar_backend_factory(str(request.param))(vocab, encode)


def _mask(m: GrammarMatcher) -> np.ndarray:
    row = np.zeros(smollm2()[0].mask_words + 1, dtype=np.int32)  # a padded row: the extra word is zeroed
    row[-1] = -1
    m.fill_mask(row)
    return row


def _same(a: GrammarMatcher, b: GrammarMatcher, where: str) -> None:
    assert np.array_equal(_mask(a), _mask(b)), f"masks differ {where}"
    assert a.is_terminated() == b.is_terminated(), f"termination differs {where}"
    assert a.forced_suffix() == b.forced_suffix(), f"forced text differs {where}"


def _replayed(grammar: CompiledGrammar, tokens: list[int]) -> GrammarMatcher:
    m = grammar.matcher()
    for t in tokens:
        assert m.advance(t)
    return m


def _pick(rng: np.random.Generator, m: GrammarMatcher, eos: frozenset[int], eos_chance: float) -> int | None:
    """A random allowed token (EOS only now and then), None where nothing may follow."""
    ids = allowed_ids(_mask(m), smollm2()[0].size)
    text = [int(i) for i in ids if int(i) not in eos]
    ends = [int(i) for i in ids if int(i) in eos]
    if ends and (not text or rng.random() < eos_chance):
        return ends[0]
    return text[int(rng.integers(0, len(text)))] if text else None


@pytest.mark.parametrize("kind", list(CONSTRAINTS))
def test_a_forked_matcher_equals_a_replayed_one_along_random_walks(backend: GrammarBackend, kind: str):
    grammar = backend.compile(CONSTRAINTS[kind])
    eos = frozenset(smollm2()[0].eos_token_ids)
    rng = np.random.default_rng(list(CONSTRAINTS).index(kind))
    forks = 0
    for _walk in range(8):
        walker, tokens = grammar.matcher(), list[int]()
        for _ in range(40):
            if rng.random() < 0.4:  # a beam forked here goes its own way for a few tokens
                fork, replay = walker.fork(), _replayed(grammar, tokens)
                _same(fork, replay, f"at the fork after {tokens}")
                before = _mask(walker)
                own = list(tokens)
                for _ in range(int(rng.integers(1, 5))):
                    t = _pick(rng, fork, eos, 0.2)
                    if t is None:
                        break
                    assert fork.advance(t) and replay.advance(t)
                    own.append(t)
                    _same(fork, replay, f"after {own}")
                    if t in eos:
                        break
                assert np.array_equal(_mask(walker), before), "the fork moved the matcher it came from"
                back = int(rng.integers(0, len(own) + 1))
                fork.rollback(back)
                _same(fork, _replayed(grammar, own[: len(own) - back]), f"after rolling {own} back by {back}")
                forks += 1
            t = _pick(rng, walker, eos, 0.05)
            if t is None:
                break
            assert walker.advance(t)
            tokens.append(t)
            if t in eos:
                _same(walker.fork(), _replayed(grammar, tokens), "after EOS")
                break
    assert forks >= 10


def test_a_fork_of_a_fork_and_its_parent_go_separate_ways(backend: GrammarBackend):
    grammar = backend.compile(CONSTRAINTS["regex"])
    vocab, encode = smollm2()
    parent, start = grammar.matcher(), encode("ab cd")
    for t in start:
        assert parent.advance(t)
    child = parent.fork()
    grandchild = child.fork()
    eos = vocab.eos_token_ids[0]
    for m, text in ((parent, " x."), (child, "e!"), (grandchild, " yz zy.")):
        tokens = list(start)
        for t in encode(text):
            assert m.advance(t), text
            tokens.append(t)
            _same(m, _replayed(grammar, tokens), f"after {text!r}")
        assert m.advance(eos)
        _same(m, _replayed(grammar, [*tokens, eos]), f"after {text!r} and EOS")


TOKENIZER = Path(__file__).resolve().parent / "fixtures" / "tokenizers" / "smollm2-135m-instruct.tokenizer.gguf"
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False}


@pytest.mark.parametrize("name", BACKENDS)
def test_constrained_beams_fork_their_matchers_and_agree_across_backends(name: str):
    """Beam search under a regex (whose masks every backend computes alike): the beams' matchers are forks of
    their parents', and each backend returns radixgen's beams."""
    params = {"temperature": 0, "max_new_tokens": 16, "num_beams": 3, "num_return_sequences": 3,
              "regex": CONSTRAINTS["regex"].source}
    outs = {}
    for backend_name in ("radixgen", name):
        with Engine(load_format="dummy", dummy_config=TINY, tokenizer_path=str(TOKENIZER), device="cpu",
                    cpu_threads=1, grammar_backend=backend_name) as eng:
            got = eng.generate("Say:", params)
        assert all(re.fullmatch(CONSTRAINTS["regex"].source, o["text"]) for o in got), got
        outs[backend_name] = [o["output_ids"] for o in got]
    assert outs[name] == outs["radixgen"]
    assert min(len(ids) for ids in outs[name]) > 4  # the search ran steps enough to refork its beams
