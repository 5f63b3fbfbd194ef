"""Every installed grammar backend (radixgen's own, XGrammar, llguidance) through the same table of checks.

Generation runs a small engine (a random dummy model over SmolLM2's shipped tokenizer, greedy) and checks the
output against an oracle (`re.fullmatch`, `jsonschema`); masks, forced text and termination are compared with
radixgen's matcher on the same vocabulary, token by token along a valid text. A backend whose package is not
installed is skipped.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from grammar_vocabs import smollm2

from radixgen import cli
from radixgen.grammars import Constraint, unpack_bitmask
from radixgen.grammars.backend import (
    GRAMMAR_BACKENDS,
    GrammarBackend,
    GrammarBackendUnavailable,
    grammar_backend_factory,
    installed_grammar_backends,
)
from radixgen.runtime.engine import Engine

TOKENIZER = Path(__file__).resolve().parent / "fixtures" / "tokenizers" / "smollm2-135m-instruct.tokenizer.gguf"
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False}

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "ok", "n"], "additionalProperties": False}
# kind -> (source, a valid text, the oracle regex of the texts it accepts; None: JSON Schema validation)
CASES: dict[str, tuple[str, str, str | None]] = {
    "regex": (r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}", "(555) 123-4567", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
    "json_schema": (json.dumps(SCHEMA), '{"name": "bob", "ok": true, "n": 42}', None),
    "ebnf": ('root ::= "(" [a-z]{1,6} ("," [a-z]{1,6}){0,3} ")"', "(abc,de)", r"\([a-z]{1,6}(,[a-z]{1,6}){0,3}\)"),
    "grammar": ('start: "[" WORD ("," WORD)~0..3 "]"\nWORD: /[a-z]{1,6}/', "[abc,de]",
                r"\[[a-z]{1,6}(,[a-z]{1,6}){0,3}\]"),
}
# Kinds whose masks match radixgen's exactly at every position (JSON strings differ in details between engines,
# and llguidance allows only the canonical token where text is forced).
EXACT_MASKS = ("regex", "ebnf", "grammar")

BACKENDS = [pytest.param(name, marks=pytest.mark.skipif(name not in installed_grammar_backends(),
                                                        reason=f"{name} is not installed"))
            for name in GRAMMAR_BACKENDS]


@pytest.fixture(scope="module", params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def backend(backend_name: str) -> GrammarBackend:
    vocab, encode = smollm2()
    return grammar_backend_factory(backend_name)(vocab, encode)


@pytest.fixture(scope="module")
def reference() -> GrammarBackend:
    vocab, encode = smollm2()
    return grammar_backend_factory("radixgen")(vocab, encode)


def _engine(backend_name: str, **options) -> Engine:
    return Engine(load_format="dummy", dummy_config=TINY, tokenizer_path=str(TOKENIZER), device="cpu", cpu_threads=1,
                  grammar_backend=backend_name, **options)


@pytest.fixture(scope="module")
def engine(backend_name: str):
    with _engine(backend_name) as eng:
        yield eng


def _mask(matcher, words: int) -> np.ndarray:
    row = np.full(words + 3, -1, dtype=np.int32)  # wider than the vocabulary, as a padded model's rows are
    matcher.fill_mask(row)
    assert not row[words:].any(), "padding words are zeroed"
    return row[:words]


def _check(kind: str, text: str) -> None:
    _, _, oracle = CASES[kind]
    if oracle is not None:
        assert re.fullmatch(oracle, text), (kind, text)
        return
    import jsonschema

    jsonschema.validate(json.loads(text), SCHEMA)


def _generate_every_kind(engine: Engine) -> None:
    kinds = list(CASES)
    params = [{"max_new_tokens": 64, "temperature": 0, kind: CASES[kind][0]} for kind in kinds]
    outs = engine.generate(["Fill in:"] * len(kinds), params)
    for kind, out in zip(kinds, outs):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", (kind, out)
        _check(kind, out["text"])


def test_constrained_generation_gives_valid_text(engine, backend_name: str):
    """With jump-forward (the forced JSON keys appended without decode steps) and without; the outputs may
    differ, since a jump re-tokenizes the forced text together with the sampled token."""
    _generate_every_kind(engine)
    assert engine.get_stats()["jump_forward_tokens"] > 0
    with _engine(backend_name, enable_jump_forward=False) as stepping:
        _generate_every_kind(stepping)
        assert stepping.get_stats()["jump_forward_tokens"] == 0


def test_a_bad_constraint_is_a_value_error_naming_its_field(engine):
    for kind, source in [("regex", "(ab"), ("ebnf", "root ::= ( "), ("grammar", "start: ( "),
                         ("json_schema", '{"type": 3}')]:
        with pytest.raises(ValueError, match=f"^{kind}: "):
            engine.generate("x", {"max_new_tokens": 4, kind: source})


@pytest.mark.parametrize("kind", EXACT_MASKS)
def test_masks_and_forced_text_agree_with_radixgen(backend, reference, kind: str):
    vocab, encode = smollm2()
    source, text, _ = CASES[kind]
    ours, theirs = reference.compile(Constraint(kind, source)).matcher(), backend.compile(Constraint(kind, source))
    peer = theirs.matcher()
    for step, token in enumerate([*encode(text), vocab.eos_token_ids[0]]):
        expected = unpack_bitmask(_mask(ours, vocab.mask_words), vocab.size)
        got = unpack_bitmask(_mask(peer, vocab.mask_words), vocab.size)
        differ = [vocab.token_bytes[i] for i in np.flatnonzero(expected != got)[:5]]
        assert not differ, (step, differ)
        assert peer.forced_suffix() == ours.forced_suffix(), step
        assert peer.is_terminated() == ours.is_terminated(), step
        assert peer.advance(token) and ours.advance(token), step
    assert peer.is_terminated()
    assert theirs.relaxations == ()


def test_json_masks_allow_the_valid_text_and_refuse_what_breaks_it(backend):
    vocab, encode = smollm2()
    source, text, _ = CASES["json_schema"]
    matcher = backend.compile(Constraint("json_schema", source)).matcher()
    wrong = encode("}")[0]
    for token in encode(text):
        allowed = unpack_bitmask(_mask(matcher, vocab.mask_words), vocab.size)
        assert not any(allowed[s] for s in vocab.special_ids if s not in vocab.eos_token_ids)
        assert not matcher.is_terminated()
        if not allowed[wrong]:
            assert not matcher.advance(wrong)  # refused, and the state is unchanged
        assert matcher.advance(token)
    assert matcher.is_terminated()
    assert matcher.advance(vocab.eos_token_ids[0]) and matcher.is_terminated()


def test_rollback_returns_to_earlier_masks(backend):
    vocab, encode = smollm2()
    source, text, _ = CASES["ebnf"]
    matcher = backend.compile(Constraint("ebnf", source)).matcher()
    ids = encode(text)
    masks = []
    for token in ids:
        masks.append(_mask(matcher, vocab.mask_words).copy())
        assert matcher.advance(token)
    assert matcher.advance(vocab.eos_token_ids[0]) and not matcher.advance(vocab.eos_token_ids[0])
    matcher.rollback(1)  # the EOS: it may come again
    assert matcher.advance(vocab.eos_token_ids[0])
    matcher.rollback(1)
    for back in (2, len(ids) - 2):
        matcher.rollback(back)
        ids_left = len(ids) - back
        assert (_mask(matcher, vocab.mask_words) == masks[ids_left]).all()
        for token in ids[ids_left:]:
            assert matcher.advance(token)
    with pytest.raises(ValueError, match="cannot roll back"):
        matcher.rollback(len(ids) + 1)
    matcher.rollback(len(ids))
    assert (_mask(matcher, vocab.mask_words) == masks[0]).all()


def test_a_text_that_may_go_on_is_not_terminated(backend):
    vocab, encode = smollm2()
    matcher = backend.compile(Constraint("regex", "a+")).matcher()
    assert matcher.advance(encode("a")[0])
    allowed = unpack_bitmask(_mask(matcher, vocab.mask_words), vocab.size)
    assert allowed[vocab.eos_token_ids[0]] and allowed[encode("a")[0]]
    assert not matcher.is_terminated()
    assert matcher.advance(vocab.eos_token_ids[0]) and matcher.is_terminated()


def test_a_kind_the_installed_xgrammar_lacks_is_refused(monkeypatch):
    pytest.importorskip("xgrammar")
    import xgrammar

    vocab, encode = smollm2()
    backend = grammar_backend_factory("xgrammar")(vocab, encode)
    monkeypatch.delattr(xgrammar.Grammar, "from_lark", raising=False)
    with pytest.raises(ValueError, match="xgrammar grammar backend does not support 'grammar' constraints"):
        backend.compile(Constraint("grammar", CASES["grammar"][0]))


@pytest.mark.parametrize("name", ["xgrammar", "llguidance"])
def test_a_missing_package_is_refused_at_engine_start_naming_the_extra(monkeypatch, name: str):
    monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError
    monkeypatch.delitem(sys.modules, f"radixgen.grammars.backends.{name}_backend", raising=False)
    with pytest.raises(GrammarBackendUnavailable, match=re.escape(f"pip install 'radixgen[{name}]'")):
        Engine(load_format="dummy", dummy_config=TINY, tokenizer_path=str(TOKENIZER), device="cpu",
               grammar_backend=name)


def test_an_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="grammar_backend must be"):
        Engine(load_format="dummy", dummy_config=TINY, tokenizer_path=str(TOKENIZER), grammar_backend="outlines")
    with pytest.raises(GrammarBackendUnavailable, match=re.escape("grammar_backend must be one of radixgen|xgrammar")):
        grammar_backend_factory("outlines")


def test_the_commands_take_grammar_backend(capsys):
    parser = cli.build_parser()
    for argv in (["generate", "hi"], ["run", "p.py"], ["serve"]):
        assert parser.parse_args(argv).grammar_backend == "radixgen"
        assert parser.parse_args([*argv, "--grammar-backend", "llguidance"]).grammar_backend == "llguidance"
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "hi", "--grammar-backend", "outlines"])
    assert "invalid choice" in capsys.readouterr().err
