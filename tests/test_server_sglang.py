"""The native API speaks SGLang's protocol as its 0.4/0.5 clients use it: stop_regex, return_text_in_logprobs
triples, streaming with the text so far and meta_info on every event (the delta form behind stream_delta),
SGLang's routes, "not supported" 400s for SGLang fields radixgen lacks, and disconnects counted as 499."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import aiohttp
import pytest
from lang_engine_cache import shared_engine
from test_server import _wait_idle as wait_idle
from test_server import http, leave_a_stream_after_two_events, sse_events

from radixgen.server.launch import BackgroundServer
from radixgen.server.state import ServerSettings

GREEDY = {"temperature": 0}
PROMPT = "1, 2, 3, 4,"
META_KEYS = {"id", "prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason"}


@pytest.fixture(scope="module")
def engine(default_model_path):
    return shared_engine(str(default_model_path))


@pytest.fixture(scope="module")
def server(engine):
    srv = BackgroundServer(engine, ServerSettings(port=0, owns_engine=False)).start()
    yield srv
    srv.stop()


def generate(server, **body):
    status, out = http(server, "POST", "/generate", body)
    assert status == 200, out
    return out


# ------------------------------------------------------------------------------------------------ stop_regex
def test_stop_regex_stops_at_the_first_match(server):
    base = generate(server, text=PROMPT, sampling_params={"max_new_tokens": 8, **GREEDY})
    empty = generate(server, text=PROMPT, sampling_params={"max_new_tokens": 8, "stop_regex": [], **GREEDY})
    assert empty["text"] == base["text"] and empty["output_ids"] == base["output_ids"]
    match = re.search(r"\d", base["text"])
    assert match is not None, base  # the model continues the count
    params = {"max_new_tokens": 8, "stop_regex": [r"\d", r"zzz+"], **GREEDY}
    out = generate(server, text=PROMPT, sampling_params=params)
    assert out["text"] == base["text"][:match.start()]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": r"\d"}  # SGLang's: the pattern
    events = sse_events(http(server, "POST", "/generate", {"text": PROMPT, "sampling_params": params,
                                                          "stream": True})[1])
    assert events[-1]["text"] == out["text"] and events[-1]["meta_info"]["finish_reason"]["matched"] == r"\d"
    status, err = http(server, "POST", "/generate", {"text": PROMPT, "sampling_params": {"stop_regex": "("}})
    assert status == 400 and err["error"]["param"] == "sampling_params.stop_regex"


# ------------------------------------------------------------------------------------------------ streaming
def test_stream_sends_text_so_far_and_meta_info_on_every_event(server):
    params = {"max_new_tokens": 10, "ignore_eos": True, **GREEDY}
    whole = generate(server, text="The sky is", sampling_params=params)
    events = sse_events(http(server, "POST", "/generate", {"text": "The sky is", "sampling_params": params,
                                                          "stream": True})[1])
    assert len(events) > 1
    pos, rebuilt = 0, ""
    for i, event in enumerate(events):
        assert event["text"].startswith(rebuilt)  # the text so far: SGLang's client slices text[pos:]
        rebuilt += event["text"][pos:]
        pos = len(event["text"])
        meta = event["meta_info"]
        assert meta.keys() >= META_KEYS
        assert meta["completion_tokens"] == len(event["output_ids"])
        last = i == len(events) - 1
        assert (meta["finish_reason"] is None) != last and event["finished"] == last
    assert rebuilt == whole["text"] and events[-1]["output_ids"] == whole["output_ids"]
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "matched": None}


def test_stream_delta_keeps_our_form(server):
    params = {"max_new_tokens": 6, **GREEDY}
    whole = generate(server, text="Water is", sampling_params=params)
    events = sse_events(http(server, "POST", "/generate", {"text": "Water is", "sampling_params": params,
                                                          "stream": True, "stream_delta": True})[1])
    assert "".join(e["text"] for e in events) == whole["text"]
    assert all(e["meta_info"] is None for e in events[:-1]) and events[-1]["meta_info"]["completion_tokens"] > 0


def test_endpoint_stream_uses_the_delta_form(server):
    from radixgen.lang.endpoint import Endpoint
    from radixgen.lang.spec import GenSpec

    backend = Endpoint(server.url)
    spec = GenSpec(max_new_tokens=6, temperature=0.0)
    whole = backend.generate("Water is", spec).text
    assert "".join(d.text for d in backend.stream("Water is", spec)) == whole


# ------------------------------------------------------------------------------------------------ logprobs
def test_return_text_in_logprobs_gives_triples(server, engine):
    body = {"text": ["Paris is", "Rome is"], "sampling_params": {"max_new_tokens": 2, **GREEDY},
            "return_logprob": True, "logprob_start_len": 1, "top_logprobs_num": 2}
    pairs = generate(server, **body)
    triples = generate(server, **body, return_text_in_logprobs=True)
    tok = engine.tokenizer
    for plain, texted in zip(pairs, triples):
        for key in ("input_token_logprobs", "output_token_logprobs"):
            assert all(len(e) == 2 for e in plain["meta_info"][key])
            assert [e[:2] for e in texted["meta_info"][key]] == plain["meta_info"][key]
            assert all(e[2] == tok.decode([e[1]]) for e in texted["meta_info"][key])
        for row in texted["meta_info"]["output_top_logprobs"]:
            assert all(len(e) == 3 and e[2] == tok.decode([e[1]]) for e in row)
    events = sse_events(http(server, "POST", "/generate", {**body, "text": "Paris is", "stream": True,
                                                          "return_text_in_logprobs": True})[1])
    streamed = events[-1]["meta_info"]["output_token_logprobs"]
    assert [e[1:] for e in streamed] == [e[1:] for e in triples[0]["meta_info"]["output_token_logprobs"]]


# ------------------------------------------------------------------------------------------------ routes
def test_sglang_routes(server, engine):
    for path in ("/server_info", "/get_server_info"):
        status, info = http(server, "GET", path)
        assert status == 200 and info["model_path"] == info["tokenizer_path"]
        assert info["context_length"] == engine.context_length and info["version"]
        assert info["internal_states"][0]["kv_slots_total"] > 0 and "api_key" not in info
    status, model = http(server, "GET", "/get_model_info")
    assert status == 200 and model["is_generation"] and "preferred_sampling_params" in model
    assert http(server, "GET", "/health_generate") == (200, {"status": "ok"})
    for method in ("GET", "POST"):
        assert http(server, method, "/flush_cache") == (200, {"flushed": True})
    status, out = http(server, "POST", "/concate_and_append_request", {"src_rids": ["a", "b"], "dst_rid": "c"})
    assert status == 200 and out["success"]
    assert http(server, "POST", "/concate_and_append_request", {"src_rids": "a"})[0] == 400
    status, err = http(server, "GET", "/start_profile")
    assert status == 400 and "not supported" in err["error"]["message"]
    status, out = http(server, "PUT", "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 1}})
    assert status == 200 and out["meta_info"]["completion_tokens"] == 1


def test_sglang_fields_radixgen_lacks_are_not_supported(server):
    base = {"text": "Hi", "sampling_params": {"max_new_tokens": 1}}
    for extra in ({"lora_path": "adapter"}, {"return_hidden_states": True}, {"custom_logit_processor": "x"}):
        status, err = http(server, "POST", "/generate", {**base, **extra})
        (name,) = extra
        assert status == 400 and err["error"]["message"] == f"{name}: not supported by radixgen", err
    status, err = http(server, "POST", "/generate", {**base, "sampling_params": {"structural_tag": "{}"}})
    assert status == 400 and err["error"]["param"] == "sampling_params.structural_tag"
    assert "not supported" in err["error"]["message"]
    # Sent switched off (as SGLang's clients do when unused) they are accepted; unknown fields stay unknown.
    off = {"lora_path": None, "return_hidden_states": False, "image_data": None, "log_metrics": True}
    assert http(server, "POST", "/generate", {**base, **off})[0] == 200
    status, err = http(server, "POST", "/generate", {**base, "lora_pth": "x"})
    assert status == 400 and "unknown field" in err["error"]["message"]


# ------------------------------------------------------------------------------------------------ metrics
def metric(server, series: str) -> float:
    """The value of one series (`name{labels}`) in the server's /metrics; 0 when it has none yet."""
    text = http(server, "GET", "/metrics")[1]
    return next((float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(series + " ")), 0.0)


def requests_total(route: str, status: int) -> str:
    return f'radixgen_http_requests_total{{route="{route}",status="{status}"}}'


CANCELLED_GENERATIONS = 'radixgen_generations_total{reason="cancelled"}'


def wait_for_metric(server, series: str, at_least: float) -> float:
    value = 0.0
    for _ in range(400):  # the server notices the disconnect at its next write or read
        value = metric(server, series)
        if value >= at_least:
            break
        asyncio.run(asyncio.sleep(0.05))
    return value


def test_client_disconnect_is_counted_as_499(server):
    cancelled = metric(server, CANCELLED_GENERATIONS)
    leave_a_stream_after_two_events(server.url)
    assert wait_for_metric(server, requests_total("/generate", 499), 1) >= 1
    assert metric(server, requests_total("/generate", 500)) == 0
    assert wait_for_metric(server, CANCELLED_GENERATIONS, cancelled + 1) == cancelled + 1


def leave_a_request_while_it_runs(url: str, engine, path: str, body: dict) -> None:
    """Send a non-streamed request, wait until the engine runs it, then close the connection unanswered."""
    async def send_and_leave():
        async with aiohttp.ClientSession() as session:
            pending = asyncio.ensure_future(session.post(url + path, json=body))
            while not engine.get_stats()["running"]:
                assert not pending.done(), "the request ended before the engine ran it"
                await asyncio.sleep(0.02)
            pending.cancel()  # closes the connection before the answer
            with contextlib.suppress(asyncio.CancelledError):
                await pending

    asyncio.run(send_and_leave())


LONG = {"max_new_tokens": 400, "ignore_eos": True, **GREEDY}


@pytest.mark.parametrize(("path", "body"), [
    ("/generate", {"text": "Count forever:", "sampling_params": LONG}),
    ("/v1/completions", {"prompt": "Count forever:", "max_tokens": 400, "ignore_eos": True, **GREEDY}),
])
def test_non_streamed_client_disconnect_is_counted_as_499(server, engine, path, body):
    before = {status: metric(server, requests_total(path, status)) for status in (200, 499, 500)}
    cancelled = metric(server, CANCELLED_GENERATIONS)
    leave_a_request_while_it_runs(server.url, engine, path, body)
    assert wait_for_metric(server, requests_total(path, 499), before[499] + 1) == before[499] + 1
    assert wait_for_metric(server, CANCELLED_GENERATIONS, cancelled + 1) == cancelled + 1
    assert {status: metric(server, requests_total(path, status)) for status in (200, 500)} == \
        {200: before[200], 500: before[500]}
    stats = wait_idle(engine)
    assert stats["kv_slots_free"] + stats["kv_slots_cached"] == stats["kv_slots_total"]  # no slot leaked


# ------------------------------------------------------------------------------------------------ SGLang's client
# The wheels (`pip download --no-deps sglang==X -d DIR`): where to find each, overridden by the environment.
SGLANG_WHEELS = {"0.4.10.post2": ("RADIXGEN_SGLANG_WHEEL", "/tmp/sgl/sglang-0.4.10.post2-*.whl"),
                 "0.5": ("RADIXGEN_SGLANG5_WHEEL", "/tmp/sgl5/sglang-0.5.*.whl")}
SGLANG_MODULES = ("sglang/__init__.py", "sglang/api.py", "sglang/version.py", "sglang/global_config.py",
                  "sglang/utils.py", "sglang/test/__init__.py", "sglang/test/test_programs.py")
SGLANG_CLIENT = '''
import json, sys
import sglang as sgl

sgl.set_default_backend(sgl.RuntimeEndpoint(sys.argv[1]))

@sgl.function
def qa(s):
    s += "Q: What is the capital of France?\\nA:" + sgl.gen("answer", max_tokens=6, temperature=0, stop="\\n")
    s += "\\nIs that right? " + sgl.select("verdict", choices=["yes", "no"])

@sgl.function
def forked(s):
    s += "Two colours:"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f" colour {i}:" + sgl.gen("c", max_tokens=3, temperature=0)
    forks.join(mode="concate_and_append")
    s += " Done." + sgl.gen("tail", max_tokens=2, temperature=0)

plain = qa.run()
streamed = qa.run(stream=True)
pieces = "".join(streamed.text_iter())
joined = forked.run()
print(json.dumps({"answer": plain["answer"], "verdict": plain["verdict"], "text": plain.text(),
                  "streamed_text": streamed.text(), "pieces": pieces, "joined": joined.text(),
                  "tail": joined["tail"]}))
'''
STUBS = {  # the two modules sglang/utils.py imports that the frontend never uses here
    "pybase64.py": "from base64 import b64decode, b64encode\n",
    "IPython/__init__.py": "",
    "IPython/display.py": "def HTML(*a, **k):\n    return None\n\n\ndef display(*a, **k):\n    return None\n",
}


def sglang_frontend_env(version: str, dest: Path) -> dict[str, str]:
    """The environment of a subprocess that imports sglang `version`'s frontend, unzipped from its wheel into
    `dest` (nothing installed); a test failure naming the wheel when it is missing."""
    variable, pattern = SGLANG_WHEELS[version]
    wheels = [os.environ[variable]] if os.environ.get(variable) else sorted(glob.glob(pattern))
    if not wheels:
        pytest.fail(f"needs the sglang {version} wheel at {pattern} (`pip download --no-deps sglang==...`) "
                    f"or its path in {variable}")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        members = [n for n in wheel.namelist() if n.startswith("sglang/lang/") or n in SGLANG_MODULES]
        wheel.extractall(dest, members)
    for name, text in STUBS.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_text(text)
    return {**os.environ, "PYTHONPATH": str(dest)}


def run_client(script: str, env: dict[str, str], *args: str) -> dict:
    """Run `script` in a subprocess and return the JSON object it printed last."""
    path = Path(env["PYTHONPATH"]) / "client.py"
    path.write_text(script)
    done = subprocess.run([sys.executable, str(path), *args], env=env, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(SGLANG_WHEELS))
def test_sglang_runtime_endpoint_runs_gen_select_stream_join(server, tmp_path, version):
    """SGLang's own frontend (from its wheel, unzipped into a temp dir; nothing installed) as a client."""
    out = run_client(SGLANG_CLIENT, sglang_frontend_env(version, tmp_path), server.url)
    assert out["answer"] and out["verdict"] in ("yes", "no")
    assert out["streamed_text"] == out["text"] and out["pieces"] == out["text"]  # streamed == non-streamed
    assert out["joined"].startswith("Two colours: colour 0:") and " colour 1:" in out["joined"]
    assert out["joined"].endswith(" Done." + out["tail"])
