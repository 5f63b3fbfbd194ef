"""SamplingParams: SGLang defaults, normalisation, and refusals whose message names the field."""

from __future__ import annotations

import dataclasses

import pytest

from radixgen.grammars import CONSTRAINT_KINDS, Constraint
from radixgen.runtime.sampling_params import FIELD_NAMES, SamplingParams


def test_defaults_match_sglang():
    p = SamplingParams()
    assert (p.max_new_tokens, p.min_new_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (128, 0, 1.0, 1.0, -1, 0.0)
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.stop == () and p.stop_token_ids == () and p.logit_bias == {}
    assert p.skip_special_tokens and p.spaces_between_special_tokens
    assert not p.ignore_eos and not p.no_stop_trim and p.seed is None and p.n == 1 and p.constraint is None


def test_normalisation():
    p = SamplingParams.from_dict({"stop": "###", "stop_token_ids": [5, 7], "logit_bias": {"12": -3, 4: 2.5},
                                  "top_k": None, "seed": 2**70})
    assert p.stop == ("###",) and p.stop_token_ids == (5, 7)
    assert p.logit_bias == {12: -3.0, 4: 2.5}
    assert p.top_k == -1  # None takes the default
    assert SamplingParams.from_dict({"stop": ["a", "bc"]}).stop == ("a", "bc")
    assert SamplingParams.from_dict({"max_new_tokens": None}).max_new_tokens is None
    assert SamplingParams.from_dict(None) == SamplingParams()


def test_round_trip_through_dict():
    p = SamplingParams(stop=["x"], stop_token_ids=[3], logit_bias={1: 1.0}, seed=9, regex="[a-z]+", top_k=5)
    assert SamplingParams.from_dict(p.to_dict()) == p


def test_greedy_and_constraint_views():
    assert SamplingParams(temperature=0).is_greedy and SamplingParams(top_k=1).is_greedy
    assert not SamplingParams(top_k=0).is_greedy
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    c = SamplingParams(json_schema=schema).constraint
    assert c == Constraint("json_schema", '{"type":"object","properties":{"a":{"type":"integer"}}}')  # order kept
    assert SamplingParams(ebnf='root ::= "a"').constraint == Constraint("ebnf", 'root ::= "a"')


def test_expand_n_gives_distinct_reproducible_seeds():
    samples = SamplingParams(n=3, seed=10, temperature=0.7).expand_n()
    assert [s.seed for s in samples] == [10, 11, 12] and all(s.n == 1 and s.temperature == 0.7 for s in samples)
    assert [s.seed for s in SamplingParams(n=2).expand_n()] == [None, None]


@pytest.mark.parametrize("d, field", [
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"max_new_tokens": 1.5}, "max_new_tokens"),
    ({"min_new_tokens": -2}, "min_new_tokens"),
    ({"min_new_tokens": 10, "max_new_tokens": 5}, "min_new_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 2.0}, "top_k"),
    ({"top_k": True}, "top_k"),
    ({"min_p": 1.1}, "min_p"),
    ({"min_p": -0.1}, "min_p"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": -1.0}, "repetition_penalty"),
    ({"n": 0}, "n"),
    ({"seed": 1.5}, "seed"),
    ({"seed": "7"}, "seed"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"no_stop_trim": "yes"}, "no_stop_trim"),
    ({"skip_special_tokens": None, "spaces_between_special_tokens": 0}, "spaces_between_special_tokens"),
    ({"stop": 5}, "stop"),
    ({"stop": ["ok", 3]}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"stop_token_ids": [1, -1]}, "stop_token_ids"),
    ({"stop_token_ids": "12"}, "stop_token_ids"),
    ({"logit_bias": {"abc": 1.0}}, "logit_bias"),
    ({"logit_bias": {1.5: 1.0}}, "logit_bias"),
    ({"logit_bias": {"-3": 1.0}}, "logit_bias"),
    ({"logit_bias": {3: "big"}}, "logit_bias"),
    ({"logit_bias": {3: float("inf")}}, "logit_bias"),
    ({"logit_bias": [1, 2]}, "logit_bias"),
    ({"regex": "a+", "json_schema": {"type": "string"}}, "json_schema"),
    ({"ebnf": "x", "grammar": "y"}, "grammar"),
    ({"regex": 5}, "regex"),
    ({"json_schema": 5}, "json_schema"),
    ({"temprature": 0.5}, "temprature"),
])
def test_invalid_values_name_the_field(d, field):
    with pytest.raises(ValueError) as err:
        SamplingParams.from_dict(d)
    assert field in str(err.value)


def test_unknown_keys_list_the_known_ones():
    with pytest.raises(ValueError, match=r"known keys: .*max_new_tokens"):
        SamplingParams.from_dict({"max_tokens": 5})


def test_direct_construction_is_validated_too():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=2.0)


def test_logit_bias_accepts_minus_inf_as_a_ban():
    assert SamplingParams(logit_bias={3: float("-inf")}).logit_bias == {3: float("-inf")}


@pytest.mark.parametrize("d, field", [
    ({"stop_token_ids": [99]}, "stop_token_ids"),
    ({"logit_bias": {"100": 1.0}}, "logit_bias"),
])
def test_validate_checks_token_ids_against_the_vocab(d, field):
    p = SamplingParams.from_dict(d)
    with pytest.raises(ValueError, match=field):
        p.validate(vocab_size=99 if field == "stop_token_ids" else 100)
    p.validate(vocab_size=1000)


def test_every_constraint_kind_is_a_field():
    assert set(CONSTRAINT_KINDS) <= FIELD_NAMES
    for kind in CONSTRAINT_KINDS:
        assert SamplingParams(**{kind: "x"}).constraint == Constraint(kind, "x")


def test_a_sampling_params_object_is_taken_as_it_is():
    p = SamplingParams(temperature=0.5, n=2)
    assert SamplingParams.from_dict(p) is p


def test_the_known_key_lists_derive_from_the_fields():
    from radixgen.lang.spec import GenSpec
    from radixgen.server import errors, openai_protocol
    from radixgen.server.programs import run_options

    assert FIELD_NAMES <= errors._ENGINE_FIELDS
    assert set(openai_protocol.SAMPLING_READERS) <= FIELD_NAMES
    lang_only = {"return_logprob", "top_logprobs_num", "constraint"}
    assert {f.name for f in dataclasses.fields(GenSpec)} - lang_only <= FIELD_NAMES
    assert set(run_options()) - lang_only <= FIELD_NAMES


def test_stop_regex():
    assert SamplingParams().stop_regex == ()
    assert SamplingParams.from_dict({"stop_regex": []}).stop_regex == ()  # what SGLang 0.5's client sends
    assert SamplingParams.from_dict({"stop_regex": r"\d+"}).stop_regex == (r"\d+",)
    assert SamplingParams.from_dict({"stop_regex": ["a", "b+"]}).to_dict()["stop_regex"] == ["a", "b+"]
    with pytest.raises(ValueError, match=r"^stop_regex: invalid regex"):
        SamplingParams(stop_regex="(")
    with pytest.raises(ValueError, match=r"^stop_regex: .*empty string"):
        SamplingParams(stop_regex=["ok", "x*"])
    with pytest.raises(ValueError, match=r"^stop_regex must be"):
        SamplingParams(stop_regex=[3])
