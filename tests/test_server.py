"""The HTTP server against a live instance on loopback: OpenAI client conformance, the native API, programs,
concurrency, disconnects, aborts, metrics, auth. One server per module over the suite's shared engine."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import jsonschema
import pytest
from lang_engine_cache import shared_engine

from radixgen.server import openai_api
from radixgen.server.launch import BackgroundServer
from radixgen.server.programs import ProgramRegistry
from radixgen.server.state import ServerSettings

openai = pytest.importorskip("openai")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def engine(default_model_path):
    return shared_engine(str(default_model_path))


@pytest.fixture(scope="module")
def server(engine):
    programs = ProgramRegistry.from_files([EXAMPLES / "quickstart.py"])
    srv = BackgroundServer(engine, ServerSettings(port=0, owns_engine=False), programs).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def http(server, method: str, path: str, body=None, headers=None) -> tuple[int, object]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def sse_events(text: str) -> list:
    payloads = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def engine_text(engine, ids, max_new_tokens: int) -> str:
    return engine.generate(input_ids=ids, sampling_params={"max_new_tokens": max_new_tokens, **GREEDY})["text"]


# ------------------------------------------------------------------------------------------------ info
def test_health_and_info(server, engine):
    assert http(server, "GET", "/health") == (200, {"status": "ok"})
    status, info = http(server, "GET", "/get_model_info")
    assert status == 200 and info["context_length"] == engine.context_length
    assert info["chat_template"] == engine.tokenizer.chat_template and info["model_path"].endswith(".gguf")
    status, info = http(server, "GET", "/get_server_info")
    assert status == 200 and info["ready"] and info["programs"] == ["few_shot_qa"]
    assert info["stats"]["kv_slots_total"] > 0 and "api_key" not in info["server"]


def test_models(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == [server.state.model_name]


# ------------------------------------------------------------------------------------------------ OpenAI
def test_completion_matches_engine(client, server, engine):
    out = client.completions.create(model="m", prompt="The capital of France is", max_tokens=6, temperature=0)
    ids = engine.tokenizer.encode("The capital of France is")
    assert out.choices[0].text == engine_text(engine, ids, 6)
    assert out.choices[0].finish_reason in ("length", "stop")
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens <= 6
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_chat_and_stream_agree(client, engine):
    messages = [{"role": "user", "content": "Name a color."}]
    whole = client.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0)
    text = whole.choices[0].message.content
    ids = engine.tokenizer.encode(engine.tokenizer.apply_chat_template(messages), add_special_tokens=False)
    assert text == engine_text(engine, ids, 8) and whole.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # The second identical prompt reuses the cached prefix.
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_json_schema_response_format_validates(client, engine):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    out = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Describe a person as JSON."}], max_tokens=48,
        temperature=0, response_format={"type": "json_schema",
                                        "json_schema": {"name": "person", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)
    obj = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Any JSON object."}], max_tokens=48, temperature=0,
        extra_body={"regex": r"\{\"a\": [0-9]\}"})
    assert json.loads(obj.choices[0].message.content).keys() == {"a"}


def test_logprobs(client):
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                          temperature=0, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert item.top_logprobs[0].logprob == pytest.approx(item.logprob, abs=1e-4)  # greedy took the best
    comp = client.completions.create(model="m", prompt="1, 2, 3,", max_tokens=3, temperature=0, logprobs=2)
    lp = comp.choices[0].logprobs
    assert "".join(lp.tokens) == comp.choices[0].text and len(lp.top_logprobs[0]) <= 2
    assert lp.text_offset == sorted(lp.text_offset)
    echo = client.completions.create(model="m", prompt="1, 2, 3,", max_tokens=2, temperature=0, logprobs=1,
                                     echo=True)
    choice = echo.choices[0]
    assert choice.text == "1, 2, 3," + comp.choices[0].text[: len(choice.text) - len("1, 2, 3,")]
    assert len(choice.logprobs.tokens) == echo.usage.prompt_tokens + echo.usage.completion_tokens
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.token_logprobs[1] <= 0


def test_n_samples_seeded(client, engine):
    kw = {"model": "m", "prompt": "Once upon a time", "max_tokens": 6, "temperature": 1.0, "n": 3, "seed": 7}
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]  # seeded: reproducible
    assert a.usage.prompt_tokens == len(engine.tokenizer.encode("Once upon a time"))  # once, not once per sample


def test_stop_and_logit_bias(client, engine):
    base = client.completions.create(model="m", prompt="1, 2, 3, 4,", max_tokens=8, temperature=0).choices[0].text
    stopped = client.completions.create(model="m", prompt="1, 2, 3, 4,", max_tokens=8, temperature=0, stop=[","])
    assert stopped.choices[0].text == base.split(",")[0] and stopped.choices[0].finish_reason == "stop"
    first = engine.tokenizer.encode(base, add_special_tokens=False)[0]
    banned = client.completions.create(model="m", prompt="1, 2, 3, 4,", max_tokens=2, temperature=0,
                                       logit_bias={str(first): -100})
    assert engine.tokenizer.encode(banned.choices[0].text, add_special_tokens=False)[0] != first


def test_internal_error_is_500_for_that_request_only(client, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("formatter bug")

    monkeypatch.setattr(openai_api, "chat_logprobs", broken)
    with pytest.raises(openai.InternalServerError, match="formatter bug"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                       logprobs=True)
    ok = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert ok.choices[0].finish_reason in ("length", "stop")


# ------------------------------------------------------------------------------------------------ native
def test_native_generate_batch_and_stream(server, engine):
    body = {"text": ["The sky is", "Water is"], "sampling_params": {"max_new_tokens": 5, **GREEDY}}
    status, outs = http(server, "POST", "/generate", body)
    assert status == 200 and len(outs) == 2
    for prompt, out in zip(body["text"], outs):
        assert out["text"] == engine_text(engine, engine.tokenizer.encode(prompt), 5)
        assert out["meta_info"]["completion_tokens"] == len(out["output_ids"])
    delta = {"stream": True, "stream_delta": True}
    status, raw = http(server, "POST", "/generate", {**body, "text": "The sky is", **delta})
    events = sse_events(raw)
    assert "".join(e["text"] for e in events) == outs[0]["text"]
    assert events[-1]["finished"] and events[-1]["meta_info"]["prompt_tokens"] > 0
    status, raw = http(server, "POST", "/generate", {**body, **delta})
    events = sse_events(raw)
    for i in (0, 1):
        assert "".join(e["text"] for e in events if e["index"] == i) == outs[i]["text"]


def test_native_ids_logprobs_tokenize(server, engine):
    status, tok = http(server, "POST", "/tokenize", {"text": "Hello world"})
    assert status == 200 and tok["tokens"] == engine.tokenizer.encode("Hello world")
    status, detok = http(server, "POST", "/detokenize", {"tokens": tok["tokens"]})
    assert detok["text"] == "Hello world"
    status, out = http(server, "POST", "/generate", {
        "input_ids": tok["tokens"], "sampling_params": {"max_new_tokens": 2, **GREEDY}, "return_logprob": True,
        "logprob_start_len": 0, "top_logprobs_num": 2})
    meta = out["meta_info"]
    assert status == 200 and len(meta["input_token_logprobs"]) == len(tok["tokens"])
    assert len(meta["output_token_logprobs"]) == 2 and len(meta["output_top_logprobs"][0]) == 2


def load_example(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"radixgen_server_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_endpoint_backend_runs_examples(server, engine):
    from radixgen.lang.endpoint import Endpoint

    backend = Endpoint(server.url)
    out = load_example("quickstart").run(backend, max_tokens=8)
    assert "Tokyo" in out["answer"] and len(out["batch"]) == 2
    out = load_example("chat").run(backend, max_tokens=8)  # roles rendered from /get_model_info's template
    assert [m["role"] for m in out["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert out["text"] == engine.tokenizer.apply_chat_template(out["messages"], add_generation_prompt=False)
    module = load_example("regex_constraints")
    out = module.run(backend, max_tokens=16)
    assert re.fullmatch(module.IPV4, out["dns"]) and re.fullmatch(module.ISO_DATE, out["moon"])


# ------------------------------------------------------------------------------------------------ programs
def test_programs(server):
    status, listing = http(server, "GET", "/v1/programs")
    (prog,) = listing["data"]
    assert prog["name"] == "few_shot_qa"
    assert [(p["name"], p["required"]) for p in prog["parameters"]] == [("question", True), ("max_tokens", False)]
    args = {"question": "What is the capital of Japan?", "max_tokens": 6}
    status, one = http(server, "POST", "/v1/programs/few_shot_qa", {"args": args, "options": {"temperature": 0}})
    assert status == 200 and one["error"] is None and "Tokyo" in one["variables"]["answer"]
    assert one["text"].endswith(one["variables"]["answer"]) and one["meta_info"]["answer"]["completion_tokens"] > 0
    status, raw = http(server, "POST", "/v1/programs/few_shot_qa",
                       {"args": args, "options": {"temperature": 0}, "stream": True})
    events = sse_events(raw)
    assert events[-1]["finished"] and events[-1]["variables"] == one["variables"]
    assert "".join(e.get("text", "") for e in events[:-1]) == one["text"]
    status, batch = http(server, "POST", "/v1/programs/few_shot_qa",
                         {"batch": [args, {"question": "Who wrote Hamlet?"}], "options": {"max_new_tokens": 4}})
    assert status == 200 and [r["error"] for r in batch["results"]] == [None, None]


# ------------------------------------------------------------------------------------------------ load
def test_concurrent_streams_equal_sequential(server, engine):
    prompts = [f"Item {i}: the word for number {i} is" for i in range(16)]
    expected = {p: engine_text(engine, engine.tokenizer.encode(p), 4) for p in prompts}

    async def one(session, prompt):
        body = {"model": "m", "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True}
        async with session.post(server.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            return prompt, sse_events(await resp.text())

    async def run_all():
        async with aiohttp.ClientSession() as session:
            return await asyncio.gather(*(one(session, p) for p in prompts * 4))

    results = asyncio.run(run_all())
    assert len(results) == 64
    for prompt, events in results:
        assert "".join(e["choices"][0]["text"] for e in events) == expected[prompt]


def leave_a_stream_after_two_events(url: str) -> None:
    """Start a long streamed /generate, read two events, then close the connection mid-stream."""
    async def read_two_and_leave():
        body = {"text": "Count forever:", "stream": True,
                "sampling_params": {"max_new_tokens": 400, "ignore_eos": True, **GREEDY}}
        async with aiohttp.ClientSession() as session, session.post(url + "/generate", json=body) as resp:
            seen = 0
            async for line in resp.content:
                seen += line.startswith(b"data:")
                if seen == 2:
                    break  # leaving the block closes the connection mid-stream

    asyncio.run(read_two_and_leave())


def test_disconnect_mid_stream_frees_kv(server, engine):
    aborted_before = engine.get_stats()["aborted"]
    leave_a_stream_after_two_events(server.url)
    stats = _wait_idle(engine)
    assert stats["aborted"] == aborted_before + 1 and stats["generated_tokens"] > 0
    assert stats["kv_slots_free"] + stats["kv_slots_cached"] == stats["kv_slots_total"]  # no slot leaked
    assert engine.flush_cache() and engine.get_stats()["kv_slots_free"] == stats["kv_slots_total"]


def _wait_idle(engine, timeout: float = 30.0) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = engine.get_stats()
        if stats["running"] == 0 and stats["waiting"] == 0:
            return stats
        time.sleep(0.05)
    raise AssertionError(f"engine still busy: {stats}")


def test_abort_request_by_rid(server):
    async def run():
        body = {"text": "Count:", "rid": "to-abort",
                "sampling_params": {"max_new_tokens": 400, "ignore_eos": True, **GREEDY}}
        async with aiohttp.ClientSession() as session:
            pending = asyncio.ensure_future(session.post(server.url + "/generate", json=body))
            for _ in range(200):
                await asyncio.sleep(0.05)
                async with session.post(server.url + "/abort_request", json={"rid": "to-abort"}) as r:
                    if (await r.json())["aborted"]:
                        break
            resp = await pending
            return resp.status, await resp.json()

    status, out = asyncio.run(run())
    assert status == 200 and out["meta_info"]["finish_reason"]["type"] == "abort"
    assert out["meta_info"]["completion_tokens"] < 400


def test_metrics(server):
    http(server, "POST", "/generate", {"text": "x", "sampling_params": {"temperature": -1}})
    status, text = http(server, "GET", "/metrics")
    assert status == 200
    assert 'radixgen_http_requests_total{route="/generate",status="400"}' in text
    for name in ("radixgen_time_to_first_token_seconds_count", "radixgen_inter_token_latency_seconds_count",
                 "radixgen_generated_tokens_total", "radixgen_cache_hit_rate", "radixgen_kv_usage",
                 "radixgen_running_requests", "radixgen_grammar_compile_seconds_count"):
        line = next(ln for ln in text.splitlines() if ln.startswith(name))
        assert float(line.split()[-1]) >= 0
    assert float(next(ln for ln in text.splitlines()
                      if ln.startswith("radixgen_time_to_first_token_seconds_count")).split()[-1]) > 0


# ------------------------------------------------------------------------------------------------ auth
def test_auth(engine):
    key = "s3cret-key"
    with BackgroundServer(engine, ServerSettings(port=0, api_key=key, owns_engine=False, warmup=False)) as srv:
        assert http(srv, "GET", "/health")[0] == 200
        assert http(srv, "GET", "/v1/models")[0] == 401
        assert http(srv, "GET", "/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401
        assert http(srv, "GET", "/metrics", headers={"Authorization": key})[0] == 401
        status, body = http(srv, "POST", "/generate", {"text": "x"})
        assert status == 401 and body["error"]["type"] == "authentication_error"
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0)
        assert good.completions.create(model="m", prompt="Hi", max_tokens=1).usage.completion_tokens == 1
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0).models.list()
