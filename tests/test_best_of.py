"""`best_of` with `n`: best_of samples per prompt, the n of highest cumulative logprob returned, best first.

Seeds: sample i of a seeded request runs with seed + i (`SamplingParams.expand_n`), so a best_of request with
seed s draws exactly the samples of best_of single requests seeded s, s + 1, ..., s + best_of - 1; the tests
run those themselves and pick the best by hand. Each run starts from an empty radix cache, so the reference and
the best_of run schedule (and compute) the same way.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest
from lang_engine_cache import shared_engine

import radixgen as sgl
from radixgen.lang.engine_backend import EngineBackend
from radixgen.runtime.best_of import SampleGroup, returned_samples
from radixgen.runtime.sampling_params import SamplingParams, SamplingParamsError
from radixgen.server.launch import BackgroundServer
from radixgen.server.state import ServerSettings

PROMPTS = ["The capital of France is", "1, 2, 3,"]
SAMPLING = {"temperature": 1.0, "max_new_tokens": 5, "seed": 11}


@pytest.fixture(scope="module")
def engine(default_model_path):
    return shared_engine(str(default_model_path))


@pytest.fixture(scope="module")
def server(engine):
    srv = BackgroundServer(engine, ServerSettings(port=0, owns_engine=False)).start()
    yield srv
    srv.stop()


def _fresh(engine) -> None:
    """An empty radix cache (the flush waits for the loop to retire the last call's requests)."""
    for _ in range(200):
        if engine.flush_cache():
            return
        time.sleep(0.05)
    raise AssertionError("the engine stayed busy")


def _cumulative(meta: dict) -> float:
    return sum(lp for lp, _ in meta["output_token_logprobs"] if lp is not None)


def _by_hand(engine, prompts: list[str], n: int, best_of: int) -> list[dict]:
    """Each prompt's best_of samples run as single seeded requests (seed + i) in one call, as a best_of call
    submits them; of each prompt, the n best by cumulative logprob."""
    _fresh(engine)
    seeds = [{**SAMPLING, "seed": SAMPLING["seed"] + i} for i in range(best_of)]
    samples = engine.generate([p for p in prompts for _ in range(best_of)], seeds * len(prompts), return_logprob=True)
    best = []
    for p in range(len(prompts)):
        best += sorted(samples[p * best_of : (p + 1) * best_of], key=lambda r: -_cumulative(r["meta_info"]))[:n]
    return best


# ------------------------------------------------------------------------------------------------ options
def test_sampling_params_rules():
    assert SamplingParams(n=2).num_samples == 2 and not SamplingParams(n=2).picks_best
    p = SamplingParams(n=2, best_of=5, seed=3)
    assert p.num_samples == 5 and p.picks_best
    assert [(s.seed, s.n, s.best_of) for s in p.expand_n()] == [(3 + i, 1, None) for i in range(5)]
    assert SamplingParams.from_dict(p.to_dict()) == p
    for bad, message in [({"n": 3, "best_of": 2}, "best_of must be >= n"),
                         ({"best_of": 0}, "best_of must be >= 1"),
                         ({"best_of": 2.5}, "best_of must be an integer"),
                         ({"best_of": 2, "temperature": 0}, "best_of must be 1 with greedy"),
                         ({"best_of": 2, "top_k": 1}, "best_of must be 1 with greedy")]:
        with pytest.raises(SamplingParamsError, match=message):
            SamplingParams.from_dict(bad)
    SamplingParams(best_of=1, temperature=0)  # one sample: nothing to rank


def test_returned_samples_ranks_within_each_prompt():
    groups = [SampleGroup(0, 3, 1), SampleGroup(3, 2, 2), SampleGroup(5, 4, 2)]
    cumulative = [-3.0, -1.0, -2.0, -9.0, -1.0, -5.0, -0.5, -0.5, -7.0]
    assert returned_samples(groups, cumulative) == [(1, True), (3, False), (4, False), (6, True), (7, True)]


# ------------------------------------------------------------------------------------------------ engine
def test_engine_returns_the_best_of_the_samples(engine):
    _fresh(engine)
    got = engine.generate(PROMPTS, {**SAMPLING, "n": 2, "best_of": 4})
    want = _by_hand(engine, PROMPTS, n=2, best_of=4)
    assert len(got) == len(want) == 4  # n per prompt, prompt after prompt
    for result, ref in zip(got, want):
        assert result["output_ids"] == ref["output_ids"] and result["text"] == ref["text"]
        meta = result["meta_info"]
        assert meta["cumulative_logprob"] == pytest.approx(_cumulative(ref["meta_info"]), abs=1e-4)
        assert "output_token_logprobs" not in meta  # ranked with logprobs, returned without: not asked for
    for p in range(len(PROMPTS)):
        assert got[2 * p]["meta_info"]["cumulative_logprob"] >= got[2 * p + 1]["meta_info"]["cumulative_logprob"]


def test_cumulative_logprob_is_the_sum_of_the_returned_logprobs(engine):
    one = engine.generate(PROMPTS[0], {**SAMPLING, "best_of": 3}, return_logprob=True)
    assert isinstance(one, dict)  # n=1: one result, as without best_of
    meta = one["meta_info"]
    assert meta["cumulative_logprob"] == pytest.approx(_cumulative(meta))
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    several = asyncio.run(engine.async_generate(PROMPTS[1], {**SAMPLING, "n": 2, "best_of": 3}, return_logprob=True))
    sums = [r["meta_info"]["cumulative_logprob"] for r in several]
    assert sums == pytest.approx([_cumulative(r["meta_info"]) for r in several]) and sums[0] >= sums[1]
    plain = engine.generate(PROMPTS[1], {**SAMPLING, "n": 2, "best_of": 2})  # best_of == n: every sample as is
    assert all("cumulative_logprob" not in r["meta_info"] for r in plain)


def test_engine_refuses_bad_combinations(engine):
    with pytest.raises(ValueError, match="best_of must be >= n"):
        engine.generate(PROMPTS[0], {"n": 2, "best_of": 1})
    with pytest.raises(ValueError, match="greedy"):
        engine.generate(PROMPTS[0], {"best_of": 3, "temperature": 0})
    with pytest.raises(ValueError, match="stream=True needs best_of == n"):
        engine.generate(PROMPTS[0], {**SAMPLING, "best_of": 2}, stream=True)
    chunks = list(engine.generate(PROMPTS[0], {**SAMPLING, "best_of": 1}, stream=True))
    assert chunks[-1]["finished"]


# ------------------------------------------------------------------------------------------------ server
def _post(server, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_native_generate_best_of(server, engine):
    body = {"text": PROMPTS[0], "sampling_params": {**SAMPLING, "n": 1, "best_of": 3}}
    _fresh(engine)
    status, out = _post(server, "/generate", body)
    assert status == 200 and isinstance(out, dict)
    _fresh(engine)
    want = engine.generate(PROMPTS[0], {**SAMPLING, "best_of": 3})
    assert out["output_ids"] == want["output_ids"]
    assert out["meta_info"]["cumulative_logprob"] == pytest.approx(want["meta_info"]["cumulative_logprob"], abs=1e-4)
    assert "output_token_logprobs" not in out["meta_info"]
    status, err = _post(server, "/generate", {**body, "stream": True})
    assert status == 400 and err["error"]["param"] == "sampling_params.best_of"
    status, err = _post(server, "/generate", {"text": "x", "sampling_params": {"n": 2, "best_of": 1}})
    assert status == 400 and err["error"]["param"] == "sampling_params.best_of"


def test_openai_best_of(server, engine):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    kw = {"model": "m", "prompt": PROMPTS[1], "max_tokens": 5, "temperature": 1.0, "seed": 11}
    _fresh(engine)
    comp = client.completions.create(**kw, n=2, best_of=3, logprobs=0)
    _fresh(engine)
    want = engine.generate(PROMPTS[1], {**SAMPLING, "n": 2, "best_of": 3}, return_logprob=True)
    assert [c.index for c in comp.choices] == [0, 1]
    assert [c.text for c in comp.choices] == [w["text"] for w in want]
    assert comp.choices[0].logprobs.token_logprobs == pytest.approx(
        [lp for lp, _ in want[0]["meta_info"]["output_token_logprobs"]], abs=1e-4)
    assert comp.usage.completion_tokens == sum(w["meta_info"]["completion_tokens"] for w in want)
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                          temperature=1.0, extra_body={"best_of": 2})
    assert len(chat.choices) == 1 and chat.choices[0].logprobs is None
    for bad, param in [({"n": 2, "best_of": 1}, "best_of"), ({"best_of": 2, "stream": True}, "best_of"),
                       ({"best_of": 2, "temperature": 0}, "best_of")]:
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(**{**kw, **bad})
        assert info.value.body["param"] == param


# ------------------------------------------------------------------------------------------------ language
@sgl.function
def answers(s):
    s += "Q: Name a colour.\nA:" + sgl.gen("a", max_tokens=3, n=2, best_of=3, temperature=1.0)


def test_gen_best_of(engine):
    state = answers.run(backend=EngineBackend(engine))
    assert state.error() is None, state.error()
    assert len(state["a"]) == 2
    metas = state.get_meta_info("a")["n_meta_info"]
    sums = [m["cumulative_logprob"] for m in metas]
    assert sums[0] >= sums[1] and all("output_token_logprobs" not in m for m in metas)
    with pytest.raises(ValueError, match="best_of"):
        sgl.gen("a", n=3, best_of=2)

    @sgl.function
    def greedy(s):
        s += "Q:" + sgl.gen("a", max_tokens=2, best_of=2, temperature=0)

    assert "greedy" in str(greedy.run(backend=EngineBackend(engine)).error())
