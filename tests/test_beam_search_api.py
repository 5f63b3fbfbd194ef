"""Beam search everywhere a user looks: the native `/generate`, OpenAI's `/v1/completions` and
`/v1/chat/completions` (vLLM's `use_beam_search`), and the language's `gen(num_beams=...)` on every backend.
Each surface returns what `Engine.generate` returns for the same prompt and options (the engine side itself is
tests/test_beam_search.py's), and refuses what beam search cannot do with a 400 naming the field."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from model_fixtures import write_tiny_checkpoint

import radixgen as sgl
from radixgen.lang.chat_template import CHATML
from radixgen.runtime.engine import Engine
from radixgen.runtime.sampling_params import SamplingParamsError
from radixgen.server.launch import BackgroundServer
from radixgen.server.state import ServerSettings

TOKENIZER = Path(__file__).parent / "fixtures" / "tokenizers" / "smollm2-135m-instruct.tokenizer.gguf"
VOCAB = 49152
PROMPT = "The three most important rivers of Europe are"
BEAMS = {"temperature": 0, "max_new_tokens": 10, "num_beams": 4, "num_return_sequences": 3}
# What each returned beam must share with the engine's (ids and latencies differ from call to call).
SAME = ("completion_tokens", "finish_reason", "beam_score", "cumulative_logprob", "finished_beams")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = write_tiny_checkpoint(tmp_path_factory.mktemp("llama"), "llama", seed=1, overrides={"vocab_size": VOCAB})
    # No radix cache: every call prefills its whole prompt, so a surface's numbers are the engine's exactly.
    eng = Engine(str(folder), tokenizer_path=str(TOKENIZER), device="cpu", max_running_requests=16,
                 disable_radix_cache=True)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def server(engine):
    srv = BackgroundServer(engine, ServerSettings(port=0, owns_engine=False)).start()
    yield srv
    srv.stop()


def post(server, path: str, body: dict) -> tuple[int, object]:
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def as_list(out) -> list[dict]:
    return out if isinstance(out, list) else [out]


def beams_of(engine, prompt: str | list[int], params: dict) -> list[dict]:
    key = "input_ids" if isinstance(prompt, list) else "prompt"
    return as_list(engine.generate(**{key: prompt}, sampling_params=params))


def assert_same_beams(got: list[dict], want: list[dict]) -> None:
    assert [o["text"] for o in got] == [o["text"] for o in want]
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    for g, w in zip(got, want):
        assert {k: g["meta_info"].get(k) for k in SAME} == {k: w["meta_info"].get(k) for k in SAME}


def stop_token(engine, prompt: str) -> int:
    """A token the random model often writes, so that some beams stop before the length limit."""
    out = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 30})["output_ids"]
    return max(set(out), key=out.count)


# ------------------------------------------------------------------------------------------------ native
@pytest.mark.parametrize("options", [
    {},
    {"num_return_sequences": None, "n": 2},
    {"length_penalty": 0.5, "early_stopping": True, "no_repeat_ngram_size": 2},
    {"length_penalty": -1.0, "early_stopping": "never", "num_return_sequences": 4},
])
def test_native_generate_returns_the_engines_beams(server, engine, options):
    params = {**BEAMS, **options, "stop_token_ids": [stop_token(engine, PROMPT)]}
    want = beams_of(engine, PROMPT, params)
    status, got = post(server, "/generate", {"text": PROMPT, "sampling_params": params})
    assert status == 200, got
    assert isinstance(got, list) and len(got) == len(want) == (params["num_return_sequences"] or params["n"])
    assert_same_beams(got, want)
    assert all(b["output_ids"] == g["output_ids"] for b, g in zip(got[0]["meta_info"]["finished_beams"], got))


def test_native_batch_mixes_beam_searches_and_plain_requests(server, engine):
    prompts = [PROMPT, "Once upon a time", [5, 99, 250, 1000]]
    params = [{**BEAMS, "num_return_sequences": 2}, {"temperature": 0, "max_new_tokens": 6},
              {"temperature": 0, "max_new_tokens": 8, "num_beams": 3}]
    ids = [engine.tokenizer.encode(p) if isinstance(p, str) else p for p in prompts]
    want = engine.generate(input_ids=ids, sampling_params=params)
    status, got = post(server, "/generate", {"input_ids": ids, "sampling_params": params})
    assert status == 200, got
    assert len(got) == 4  # two beams, one sample, one best beam
    assert_same_beams(got, want)
    assert "beam_score" not in got[2]["meta_info"] and "beam_score" in got[3]["meta_info"]
    status, one = post(server, "/generate", {"input_ids": ids[2], "sampling_params": params[2]})
    assert status == 200 and isinstance(one, dict)  # one prompt, one beam returned: the engine's dict
    assert_same_beams([one], want[3:])


@pytest.mark.parametrize("body, param, words", [
    ({"stream": True}, "sampling_params.num_beams", "stream"),
    ({"return_logprob": True}, "return_logprob", "beam search"),
    ({"logprob_start_len": 0}, "logprob_start_len", "beam search"),
    ({"sampling_params": {"num_beams": 2, "max_new_tokens": 4}}, "sampling_params.num_beams", "temperature 0"),
    ({"sampling_params": {**BEAMS, "stop": ["x"]}}, "sampling_params.stop", "not supported with beam search"),
    ({"sampling_params": {**BEAMS, "repetition_penalty": 1.3}}, "sampling_params.repetition_penalty", "beam search"),
    ({"sampling_params": {**BEAMS, "best_of": 4}}, "sampling_params.best_of", "best_of"),
    ({"sampling_params": {**BEAMS, "early_stopping": "soon"}}, "sampling_params.early_stopping", "never"),
    ({"sampling_params": {**BEAMS, "no_repeat_ngram_size": -1}}, "sampling_params.no_repeat_ngram_size", ">= 0"),
    ({"sampling_params": {**BEAMS, "num_beams": 64, "num_return_sequences": 1}}, "sampling_params.num_beams",
     "max_running_requests"),
])
def test_native_refusals_are_400s_naming_the_field(server, body, param, words):
    status, out = post(server, "/generate", {"text": PROMPT, "sampling_params": BEAMS, **body})
    assert status == 400, out
    assert out["error"]["param"] == param and words in out["error"]["message"], out


def test_native_abort_ends_a_beam_search_and_frees_its_beams(server, engine):
    core = engine.core
    midway = threading.Event()
    gate = threading.Event()

    def hold(batch):  # each step waits, once the search is midway, until the abort has been sent
        beams = [it.req for it in batch.items if it.req.beam_group is not None]
        if beams and len(beams[0].output_ids) >= 3:
            midway.set()
            gate.wait(30)

    answer: list = []
    body = {"text": PROMPT, "rid": "beam-abort",
            "sampling_params": {**BEAMS, "max_new_tokens": 100, "ignore_eos": True}}
    worker = threading.Thread(target=lambda: answer.append(post(server, "/generate", body)))
    core.on_step = hold
    try:
        worker.start()
        assert midway.wait(60)
        status, aborted = post(server, "/abort_request", {"rid": "beam-abort"})
        gate.set()
        worker.join(60)
    finally:
        gate.set()
        core.on_step = None
    assert status == 200 and aborted == {"aborted": 1}
    status, out = answer[0]
    assert status == 200 and out["meta_info"]["finish_reason"]["type"] == "abort"
    for _ in range(200):
        stats = engine.get_stats()
        if stats["running"] == 0 and not core.beams.runs:
            break
        threading.Event().wait(0.05)
    assert stats["running"] == 0 and not core.beams.runs
    assert stats["kv_slots_free"] + stats["kv_slots_cached"] == stats["kv_slots_total"]


# ------------------------------------------------------------------------------------------------ OpenAI
@pytest.mark.parametrize("fields, engine_params", [
    ({"use_beam_search": True, "n": 3}, {"num_beams": 3, "n": 3}),  # vLLM today: width n, all returned
    ({"use_beam_search": True, "best_of": 4, "n": 2}, {"num_beams": 4, "n": 2}),  # vLLM before 0.6.3
    ({"num_beams": 4, "n": 2, "length_penalty": 0.5, "early_stopping": True}, {"num_beams": 4, "n": 2,
                                                                                 "length_penalty": 0.5,
                                                                                 "early_stopping": True}),
    ({"use_beam_search": True, "n": 2, "num_beams": 2, "no_repeat_ngram_size": 2, "temperature": 0},
     {"num_beams": 2, "n": 2, "no_repeat_ngram_size": 2}),
])
def test_completions_choices_are_the_engines_beams(server, engine, fields, engine_params):
    want = beams_of(engine, PROMPT, {"temperature": 0, "max_new_tokens": 10, **engine_params})
    status, out = post(server, "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": 10, **fields})
    assert status == 200, out
    assert [c["text"] for c in out["choices"]] == [w["text"] for w in want]
    assert [c["index"] for c in out["choices"]] == list(range(len(want)))
    assert [c["finish_reason"] for c in out["choices"]] == [w["meta_info"]["finish_reason"]["type"] for w in want]
    assert out["usage"]["completion_tokens"] == sum(w["meta_info"]["completion_tokens"] for w in want)
    assert out["usage"]["prompt_tokens"] == len(engine.tokenizer.encode(PROMPT))


def test_completions_of_several_prompts_and_echo(server, engine):
    prompts = [PROMPT, "Once upon a time"]
    want = [w for p in prompts for w in beams_of(engine, p, {"temperature": 0, "max_new_tokens": 6, "num_beams": 3,
                                                             "n": 2})]
    status, out = post(server, "/v1/completions", {"model": "m", "prompt": prompts, "max_tokens": 6,
                                                   "use_beam_search": True, "best_of": 3, "n": 2, "echo": True})
    assert status == 200, out
    assert [c["text"] for c in out["choices"]] == [p + w["text"] for p, w in zip([prompts[0]] * 2 + [prompts[1]] * 2,
                                                                                    want)]


def test_chat_choices_are_the_engines_beams(server, engine):
    messages = [{"role": "user", "content": "Name a river."}]
    text = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    want = beams_of(engine, ids, {"temperature": 0, "max_new_tokens": 8, "num_beams": 3, "n": 3})
    status, out = post(server, "/v1/chat/completions", {"model": "m", "messages": messages, "max_tokens": 8,
                                                        "use_beam_search": True, "n": 3})
    assert status == 200, out
    assert [c["message"]["content"] for c in out["choices"]] == [w["text"] for w in want]


def test_the_openai_client_asks_for_beams_through_extra_body(server, engine):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    out = client.completions.create(model="m", prompt=PROMPT, max_tokens=10, n=2,
                                    extra_body={"use_beam_search": True, "length_penalty": 0.5})
    want = beams_of(engine, PROMPT, {"temperature": 0, "max_new_tokens": 10, "num_beams": 2, "n": 2,
                                     "length_penalty": 0.5})
    assert [c.text for c in out.choices] == [w["text"] for w in want]


@pytest.mark.parametrize("path, fields, param", [
    ("/v1/completions", {"temperature": 0.7}, "temperature"),
    ("/v1/completions", {"stream": True}, "stream"),
    ("/v1/completions", {"logprobs": 1}, "logprobs"),
    ("/v1/chat/completions", {"logprobs": True}, "logprobs"),
    ("/v1/chat/completions", {"stream": True}, "stream"),
    ("/v1/completions", {"num_beams": 3}, "num_beams"),  # the width is best_of (else n) = 2
    ("/v1/completions", {"best_of": 2, "n": 3}, "n"),
    ("/v1/completions", {"stop": ["\n"]}, "stop"),
    ("/v1/completions", {"early_stopping": "soon"}, "early_stopping"),
    ("/v1/completions", {"presence_penalty": 0.5}, "presence_penalty"),
])
def test_openai_refusals_are_400s_naming_the_field(server, path, fields, param):
    body = {"model": "m", "max_tokens": 4, "use_beam_search": True, "n": 2, **fields}
    body.update({"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": PROMPT})
    status, out = post(server, path, body)
    assert status == 400, out
    assert out["error"]["param"] == param, out
    assert param in out["error"]["message"]


def test_openai_temperature_above_zero_is_refused_even_for_one_beam(server):
    status, out = post(server, "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": 4,
                                                   "use_beam_search": True, "temperature": 1.0})
    assert status == 400 and out["error"]["param"] == "temperature"
    status, out = post(server, "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": 4,
                                                   "use_beam_search": True})
    assert status == 200 and len(out["choices"]) == 1  # width 1: greedy, temperature 0 by default


# ------------------------------------------------------------------------------------------------ language
@sgl.function
def rivers(s, k):
    s += PROMPT
    s += sgl.gen("answer", max_tokens=10, num_beams=4, num_return_sequences=k, length_penalty=0.5)
    s += "."


def _backends(server, engine):
    return {"engine": sgl.EngineBackend(engine), "endpoint": sgl.Endpoint(server.url),
            "openai": sgl.OpenAICompatible(server.url + "/v1", "m", role_template=CHATML)}


@pytest.mark.parametrize("backend", ["engine", "endpoint", "openai"])
def test_gen_holds_the_beams_on_every_backend(server, engine, backend):
    program_backend = _backends(server, engine)[backend]
    want = beams_of(engine, PROMPT, {**BEAMS, "length_penalty": 0.5})
    state = rivers.run(k=3, backend=program_backend, temperature=0.9)  # the run's temperature is not the beams'
    assert state.error() is None, state.error()
    assert state["answer"] == [w["text"] for w in want]
    assert state.text() == PROMPT + want[0]["text"] + "."
    one = rivers.run(k=1, backend=program_backend)
    assert one.error() is None and one["answer"] == want[0]["text"]
    if backend != "openai":  # an OpenAI server gives the beams without their scores
        metas = state.get_meta_info("answer")["n_meta_info"]
        assert [m["beam_score"] for m in metas] == [w["meta_info"]["beam_score"] for w in want]
        assert one.get_meta_info("answer")["beam_score"] == want[0]["meta_info"]["beam_score"]


def test_gen_beams_stream_compile_and_n(server, engine):
    backend = sgl.EngineBackend(engine)
    want = beams_of(engine, PROMPT, {**BEAMS, "length_penalty": 0.5})
    streamed = rivers.run(k=2, backend=backend, stream=True)
    assert "".join(streamed.text_iter()) == PROMPT + want[0]["text"] + "."
    assert streamed["answer"] == [w["text"] for w in want[:2]]

    @sgl.function
    def best_river(s):
        s += PROMPT + sgl.gen("answer", max_tokens=10, num_beams=4, length_penalty=0.5)

    batch = best_river.compile().run_batch([{}, {}], backend=backend)  # one beam: a compiled plan's gen
    assert [s["answer"] for s in batch] == [want[0]["text"]] * 2

    @sgl.function
    def by_n(s):
        s += PROMPT + sgl.gen("answer", max_tokens=10, num_beams=4, n=2, length_penalty=0.5)

    assert by_n.run(backend=backend)["answer"] == [w["text"] for w in want[:2]]


@pytest.mark.parametrize("kwargs, error, words", [
    ({"num_beams": 2, "temperature": 0.5}, ValueError, "temperature 0"),
    ({"num_beams": 2, "best_of": 3}, ValueError, "best_of"),
    ({"num_beams": 2, "return_logprob": True}, ValueError, "logprobs"),
    ({"num_beams": 2, "n": 2, "num_return_sequences": 1}, ValueError, "disagree"),
    ({"num_beams": 2, "num_return_sequences": 3}, SamplingParamsError, "at most num_beams"),
    ({"num_beams": 2, "stop": "\n"}, SamplingParamsError, "stop is not supported"),
    ({"num_beams": 0}, ValueError, "positive int"),
    ({"length_penalty": 0.5}, ValueError, "num_beams > 1"),
    ({"num_beams": 1, "num_return_sequences": 2}, ValueError, "num_beams > 1"),
])
def test_gen_refuses_beam_options_where_they_make_no_sense(kwargs, error, words):
    with pytest.raises(error, match=words):
        sgl.gen("x", **kwargs)


def test_a_runs_stop_default_is_refused_by_a_beam_gen(engine):
    state = rivers.run(k=2, backend=sgl.EngineBackend(engine), stop="\n")
    assert isinstance(state.error(), SamplingParamsError) and "stop" in str(state.error())
