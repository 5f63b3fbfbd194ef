"""Speculative decoding (runtime/speculative, the engine's verify step): drafts never change what is generated.
Greedy and seeded outputs equal those with speculation off, token for token; sampled outputs keep the target
distribution (a chi-square bound); rejected drafts leave no KV behind. Counts and equalities only."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixgen.runtime.engine import Engine
from radixgen.runtime.speculative import SpeculationPolicy, accepted_lengths, ngram_lookup

GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}

PROMPTS = [
    "Copy this list exactly: apple, banana, cherry, date, elderberry, fig, grape. Copy: apple, banana,",
    "The capital of France is Paris. The capital of Italy is",
    "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n    return",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "1, 2, 3, 4, 5, 6, 7, 8,",
]

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 130},
                                           "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
          "required": ["name", "age", "city"], "additionalProperties": False}


# ---------------------------------------------------------------- units

def test_ngram_lookup_takes_the_longest_suffix_match_and_its_latest_full_continuation():
    tokens = np.array([1, 2, 3, 4, 1, 2, 3, 9, 1, 2])
    assert ngram_lookup(tokens, 3, 1, 3).tolist() == [3, 9, 1]  # "1 2" recurs; the later one is followed by 3 9 1
    assert ngram_lookup(np.array([5, 6, 7, 8]), 3, 1, 3).tolist() == []  # nothing recurs
    assert ngram_lookup(np.array([7, 1, 2, 7]), 4, 1, 3).tolist() == [1, 2, 7]  # only a shorter run follows
    assert ngram_lookup(np.array([7]), 2, 1, 3).tolist() == []


def _ngram_reference(tokens, k, min_n, max_n):
    """Every window compared with the suffix, longest n first."""
    from numpy.lib.stride_tricks import sliding_window_view

    L = len(tokens)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        hits = np.flatnonzero((sliding_window_view(tokens[: L - 1], n) == tokens[L - n :]).all(axis=1))
        if len(hits):
            full = hits[L - (hits + n) >= k]
            start = int(full[-1] if len(full) else hits[0]) + n
            return tokens[start : start + k].tolist()
    return []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=40), st.integers(1, 6), st.integers(1, 3), st.integers(0, 3))
def test_ngram_lookup_equals_comparing_every_window(tokens, k, min_n, extra):
    tokens = np.asarray(tokens, dtype=np.int64)
    assert ngram_lookup(tokens, k, min_n, min_n + extra).tolist() == _ngram_reference(tokens, k, min_n, min_n + extra)


def _accepted_reference(sampled, drafts, counts):
    out, s, d = [], 0, 0
    for c in counts:
        a = 0
        while a < c - 1 and sampled[s + a] == drafts[d + a]:
            a += 1
        out.append(a)
        s, d = s + c, d + c - 1
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), max_size=5), min_size=1, max_size=6),
       st.lists(st.integers(0, 2), min_size=6, max_size=6))
def test_accepted_lengths_equal_a_loop(rows, bonus):
    counts = np.array([len(r) + 1 for r in rows])
    drafts = np.array([d for r in rows for d, _ in r], dtype=np.int64)
    sampled = np.array([t for r, b in zip(rows, bonus) for t in [*(s for _, s in r), b]], dtype=np.int64)
    assert accepted_lengths(sampled, drafts, counts).tolist() == _accepted_reference(sampled, drafts, counts)


def _positions_reference(sb, counts):
    """What `SamplingBatch.positions` stands for: the rows repeated, each copy one output index further."""
    owner = np.repeat(np.arange(len(counts)), counts)
    out = sb.filter(owner.tolist())
    out.output_lens += torch.from_numpy(np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts))
    return out


@pytest.mark.parametrize("penalized", [False, True])
def test_verify_positions_equal_repeated_rows_as_the_batch_counts_tokens(penalized):
    """Kept results (the same counts again) and new ones, as the batch counts tokens in between, equal the
    repeated rows built afresh; with penalty state (which counting changes) nothing is kept."""
    from dataclasses import fields

    from radixgen.runtime.sampling_batch import SamplingBatch
    from radixgen.runtime.sampling_params import SamplingParams

    params = [SamplingParams(temperature=0.0, seed=3), SamplingParams(temperature=0.7, seed=5, min_new_tokens=4),
              SamplingParams(temperature=0.0, frequency_penalty=0.5 if penalized else 0.0)]
    sb = SamplingBatch.build(params, 50, eos_token_ids=[2], output_ids=[[1, 4], [], [7]])
    seen = []
    for step, counts in enumerate([[3, 1, 2], [3, 1, 2], [1, 4, 1], [3, 1, 2], [2, 2, 2], [1, 4, 1]]):
        counts = np.array(counts, dtype=np.int64)
        got, want = sb.positions(counts), _positions_reference(sb, counts)
        seen.append(got)
        for f in fields(SamplingBatch):
            a, b = getattr(got, f.name), getattr(want, f.name)
            assert (a.equal(b) if isinstance(a, torch.Tensor) else a == b), (step, f.name)
        if step % 2:
            sb.append(torch.tensor([5, 6, 7]))
        else:
            sb.output_lens += torch.tensor([2, 1, 3])
    assert (seen[1] is seen[0] and seen[3] is seen[0] and seen[5] is seen[2]) != penalized


def test_policy_follows_the_measured_throughput_and_probes_the_other_mode():
    policy = SpeculationPolicy(4, max_batch=32, step_cost=lambda bs, k: 1.0 + 0.02 * (k - 1))
    assert policy.draft_tokens(33) == 0  # above the speculative batch limit
    modes = []
    for _ in range(3 * policy.PROBE_EVERY):
        k = policy.draft_tokens(8)
        modes.append(k > 0)
        policy.observe_step(8, k > 0, tokens=8 if k == 0 else 4, seconds=1.0)  # drafting halves the throughput
    settled = modes[2 * policy.WARMUP :]
    assert 0 < sum(settled) <= len(settled) // policy.PROBE_EVERY + 1  # off, but probed now and then
    fast = SpeculationPolicy(4, max_batch=32, step_cost=lambda bs, k: 1.0)
    for _ in range(20):
        k = fast.draft_tokens(1)
        fast.observe_step(1, k > 0, tokens=3 if k else 1, seconds=1.0)
    assert fast.draft_tokens(1) == 4
    fast.observe(drafted=4, accepted=0)
    assert fast.acceptance < 0.6


def test_bad_speculative_options_are_refused_with_the_option_name():
    from radixgen.runtime.engine_config import EngineConfig

    with pytest.raises(ValueError, match="speculative_algorithm"):
        EngineConfig.from_options(speculative_algorithm="eagle9")
    with pytest.raises(ValueError, match="draft_model_path"):
        EngineConfig.from_options(speculative_algorithm="draft_model")
    with pytest.raises(ValueError, match="speculative_num_draft_tokens"):
        EngineConfig.from_options(speculative_algorithm="ngram", speculative_num_draft_tokens=0)


# ------------------------------------------------------------- engine

@pytest.fixture(scope="module")
def plain(default_model_path):
    eng = Engine(str(default_model_path), chunked_prefill_size=16, max_prefill_tokens=64, enable_jump_forward=False)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def ngram(default_model_path):
    eng = Engine(str(default_model_path), chunked_prefill_size=16, max_prefill_tokens=64,
                 speculative_algorithm="ngram", speculative_num_draft_tokens=4, speculative_max_batch=32)
    yield eng
    eng.shutdown()


def _ids(outs):
    return [o["output_ids"] for o in outs]


def _no_leak(eng):
    assert eng.flush_cache()
    stats = eng.get_stats()
    assert stats["kv_slots_free"] == stats["kv_slots_total"]


def test_greedy_ngram_speculation_gives_the_same_tokens_and_accepts_drafts(plain, ngram):
    want = _ids(plain.generate(PROMPTS, GREEDY))
    before = ngram.get_stats()
    got = ngram.generate(PROMPTS, GREEDY)
    after = ngram.get_stats()
    assert _ids(got) == want
    assert after["spec_verify_steps"] > before["spec_verify_steps"]
    assert after["spec_accepted_tokens"] > before["spec_accepted_tokens"]
    copy = got[0]["meta_info"]
    assert copy["spec_accepted_tokens"] > 0 and copy["spec_draft_tokens"] >= copy["spec_accepted_tokens"]
    # one request alone (batch 1) and again with the prompts cached: the same tokens
    assert ngram.generate(PROMPTS[0], GREEDY)["output_ids"] == want[0]
    assert _ids(ngram.generate(PROMPTS, GREEDY)) == want
    _no_leak(ngram)


def test_seeded_sampling_draws_the_same_tokens_with_speculation(plain, ngram):
    params = [{"temperature": 0.8, "top_p": 0.95, "max_new_tokens": 20, "seed": 7 + i, "ignore_eos": True}
              for i in range(len(PROMPTS))]
    assert _ids(ngram.generate(PROMPTS, params)) == _ids(plain.generate(PROMPTS, params))


def test_mixed_batch_with_penalties_stops_and_logprobs(plain, ngram):
    """Some requests speculate, some cannot (penalties), some stop early inside accepted drafts; logprobs of
    kept tokens are the target's."""
    params = [
        GREEDY,
        {**GREEDY, "repetition_penalty": 1.3},
        {"temperature": 0, "max_new_tokens": 30, "stop": [", grape"]},
        {"temperature": 0.7, "max_new_tokens": 16, "seed": 3, "frequency_penalty": 0.5},
        {"temperature": 0, "max_new_tokens": 5},
    ]
    want = plain.generate(PROMPTS, params, return_logprob=True, top_logprobs_num=2)
    got = ngram.generate(PROMPTS, params, return_logprob=True, top_logprobs_num=2)
    assert _ids(got) == _ids(want)
    assert [o["text"] for o in got] == [o["text"] for o in want]
    lp_got = [lp for lp, _ in got[0]["meta_info"]["output_token_logprobs"]]
    lp_want = [lp for lp, _ in want[0]["meta_info"]["output_token_logprobs"]]
    assert np.allclose(lp_got, lp_want, atol=1e-3)
    assert len(got[0]["meta_info"]["output_top_logprobs"]) == len(got[0]["output_ids"])
    assert "spec_verify_steps" not in got[1]["meta_info"]  # a penalty: one token per step
    _no_leak(ngram)


def test_grammar_drafts_equal_constrained_decoding_token_for_token(default_model_path, plain):
    """With speculation, a constraint's forced text is drafted (and verified) instead of jumped over: outputs
    are exactly constrained decoding's, with fewer steps."""
    prompts = [f"Extract: {who} is {age} and lives in {city}.\nJSON:"
               for who, age, city in (("John", 31, "Paris"), ("Ada", 36, "Oslo"), ("Li", 7, "Rome"))]
    params = [{"temperature": 0, "max_new_tokens": 60, "json_schema": json.dumps(SCHEMA)}] * 3
    params += [{"temperature": 0, "max_new_tokens": 20, "regex": r"(yes|no), because [a-z ]{1,30}\."},
               # text the model would not write: most unmasked greedy choices are refused and masked again
               {"temperature": 0, "max_new_tokens": 24, "regex": r"ID [A-Z]{3}-[0-9]{4}; ID [A-Z]{3}-[0-9]{4}"}]
    prompts += ["Is the sky blue? Answer:", "Once upon a time"]
    want = plain.generate(prompts, params, return_logprob=True)
    for algorithm in ("grammar", "ngram"):
        with Engine(str(default_model_path), chunked_prefill_size=16, max_prefill_tokens=64,
                    speculative_algorithm=algorithm) as eng:
            got = eng.generate(prompts, params, return_logprob=True)
            stats = eng.get_stats()
            assert _ids(got) == _ids(want), algorithm
            for g, w in zip(got, want):  # the target's logprobs, whether a row was masked up front or after
                lp_g = [lp for lp, _ in g["meta_info"]["output_token_logprobs"]]
                lp_w = [lp for lp, _ in w["meta_info"]["output_token_logprobs"]]
                assert np.allclose(lp_g, lp_w, atol=1e-3), algorithm
            assert stats["spec_accepted_tokens"] > 0
            assert stats["jump_forward_tokens"] == 0  # one way to append tokens in bulk: verified drafts
            for out in got[:3]:
                assert set(json.loads(out["text"])) == {"name", "age", "city"}
            _no_leak(eng)


def test_small_pool_preempts_and_speculation_changes_no_token(default_model_path, plain):
    want = _ids(plain.generate(PROMPTS * 2, GREEDY))
    with Engine(str(default_model_path), max_total_tokens=160, chunked_prefill_size=16, max_prefill_tokens=32,
                speculative_algorithm="ngram", speculative_num_draft_tokens=6) as eng:
        got = eng.generate(PROMPTS * 2, GREEDY)
        stats = eng.get_stats()
        assert _ids(got) == want
        assert stats["spec_verify_steps"] > 0
        _no_leak(eng)


# Upper 0.1% points of the chi-square distribution, by degrees of freedom.
_CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12}


def test_sampled_tokens_at_drafted_positions_keep_the_target_distribution(ngram):
    """Many seeded draws of a prompt the model copies: the second token is the verify step's first row and the
    third, when the second equals the n-gram draft, comes from its drafted position. The third token's
    distribution given the first two is the model's (a chi-square bound against its own probabilities there)."""
    core = ngram.core
    text = "Repeat: the quick brown fox jumps over the lazy dog. " * 3 + "Repeat: the quick brown"
    ids = ngram.tokenizer.encode(text)
    t1 = int(ngram_lookup(np.asarray(ids, dtype=np.int64), 4, 1, 4)[0])  # " fox"
    d1 = int(ngram_lookup(np.asarray(ids + [t1], dtype=np.int64), 4, 1, 4)[0])  # the verify step's first draft
    k, temperature = 4, 2.5  # a flat enough distribution that the third token varies
    params = {"temperature": temperature, "top_k": k, "max_new_tokens": 3}
    # the model's distribution of the third token after (t1, d1), with the same temperature and top-k
    ref = ngram.generate(input_ids=ids + [t1, d1], sampling_params={"temperature": 0, "max_new_tokens": 1},
                         return_logprob=True, top_logprobs_num=k)
    top = ref["meta_info"]["output_top_logprobs"][0]
    probs = np.exp(np.array([lp for lp, _ in top]) / temperature)
    probs /= probs.sum()
    support = [t for _, t in top]
    n = 256
    before = core.counters.spec_accepted_tokens
    batch = core.config.speculative_max_batch  # larger batches would not speculate
    outs = [o for lo in range(0, n, batch)
            for o in ngram.generate(input_ids=[ids] * batch, sampling_params=[{**params, "seed": s}
                                                                              for s in range(lo, lo + batch)])]
    assert core.counters.spec_accepted_tokens > before
    third = [o["output_ids"][2] for o in outs if o["output_ids"][:2] == [t1, d1]]
    assert len(third) > n // 4
    counts = np.array([third.count(t) for t in support], dtype=np.float64)
    assert counts.sum() == len(third)  # never outside the top-k
    expected = probs * len(third)
    big = expected >= 5  # pool the rare tokens into one bin
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    assert chi2 < _CHI2_999[max(len(obs) - 1, 1)], (chi2, obs, exp)


def test_draft_model_drafts_are_all_accepted_from_the_model_itself_and_few_from_a_random_one(
        default_model_path, plain, tmp_path):
    import shutil

    from model_fixtures import write_tiny_checkpoint

    want = _ids(plain.generate(PROMPTS[:3], GREEDY))
    with Engine(str(default_model_path), speculative_algorithm="draft_model",
                draft_model_path=str(default_model_path)) as eng:
        got = eng.generate(PROMPTS[:3], GREEDY)
        assert _ids(got) == want
        for out in got:
            meta = out["meta_info"]
            assert meta["spec_draft_tokens"] > 0 and meta["spec_accepted_tokens"] == meta["spec_draft_tokens"]
        drafter = eng.core.drafter
        assert not drafter.seqs  # every finished request released its draft KV
        assert drafter.runner.slot_allocator.num_free == drafter.runner.slot_allocator.num_slots - 1
        _no_leak(eng)
    vocab = plain.core.runner.model_config.vocab_size
    tiny = write_tiny_checkpoint(tmp_path / "draft", "llama", seed=3,
                                 overrides={"vocab_size": vocab, "max_position_embeddings": 2048})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (default_model_path / name).exists():
            shutil.copy(default_model_path / name, tiny / name)
    with Engine(str(default_model_path), speculative_algorithm="draft_model", draft_model_path=str(tiny)) as eng:
        got = eng.generate(PROMPTS[:3], GREEDY)
        stats = eng.get_stats()
        assert _ids(got) == want
        assert stats["spec_draft_tokens"] > 0
        assert stats["spec_accepted_tokens"] < stats["spec_draft_tokens"] // 4  # a random draft guesses badly
        _no_leak(eng)


def test_a_draft_model_with_another_vocabulary_is_refused(default_model_path, tmp_path):
    from model_fixtures import write_tiny_checkpoint

    tiny = write_tiny_checkpoint(tmp_path / "draft", "llama")
    with pytest.raises(ValueError, match="share the target's tokenizer"):
        Engine(str(default_model_path), speculative_algorithm="draft_model", draft_model_path=str(tiny))
