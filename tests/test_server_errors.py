"""Malformed and hostile requests: each gets the right 4xx naming the field, and the server keeps serving."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from lang_engine_cache import shared_engine

from radixgen.server.launch import BackgroundServer
from radixgen.server.programs import ProgramRegistry
from radixgen.server.state import ServerSettings

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
BODY_LIMIT = 64 * 1024
CONTEXT = 8192  # SmolLM2's context; checked against the engine in the fixture

SP = "sampling_params"
# (case, method, path, body: dict | bytes | None, status, param the error names (None: no param))
CASES = [
    ("invalid json", "POST", "/generate", b'{"text": ', 400, "body"),
    ("json array body", "POST", "/generate", b"[1, 2]", 400, "body"),
    ("empty body", "POST", "/generate", b"", 400, "body"),
    ("NaN literal", "POST", "/generate", b'{"text": "a", "sampling_params": {"temperature": NaN}}', 400, "body"),
    ("deep nesting", "POST", "/generate", b"[" * 5000 + b"]" * 5000, 400, "body"),
    ("text and input_ids", "POST", "/generate", {"text": "a", "input_ids": [1]}, 400, "text"),
    ("no prompt", "POST", "/generate", {"sampling_params": {}}, 400, "text"),
    ("text not a string", "POST", "/generate", {"text": 5}, 400, "text"),
    ("empty text batch", "POST", "/generate", {"text": []}, 400, "text"),
    ("negative token id", "POST", "/generate", {"input_ids": [1, -3]}, 400, "input_ids[1]"),
    ("token id past vocab", "POST", "/generate", {"input_ids": [10 ** 9]}, 400, "input_ids[0]"),
    ("sampling_params not object", "POST", "/generate", {"text": "a", SP: "hot"}, 400, SP),
    ("unknown sampling key", "POST", "/generate", {"text": "a", SP: {"temprature": 1}}, 400, SP),
    ("temperature string", "POST", "/generate", {"text": "a", SP: {"temperature": "hot"}}, 400, f"{SP}.temperature"),
    ("top_p zero", "POST", "/generate", {"text": "a", SP: {"top_p": 0}}, 400, f"{SP}.top_p"),
    ("negative max_new_tokens", "POST", "/generate", {"text": "a", SP: {"max_new_tokens": -1}}, 400,
     f"{SP}.max_new_tokens"),
    ("seed float", "POST", "/generate", {"text": "a", SP: {"seed": 1.5}}, 400, f"{SP}.seed"),
    ("invalid regex", "POST", "/generate", {"text": "a", SP: {"regex": "(("}}, 400, f"{SP}.regex"),
    ("invalid json schema", "POST", "/generate", {"text": "a", SP: {"json_schema": {"type": "nonsense"}}}, 400,
     f"{SP}.json_schema"),
    ("invalid ebnf", "POST", "/generate", {"text": "a", SP: {"ebnf": "root ::= ("}}, 400, f"{SP}.ebnf"),
    ("two constraints", "POST", "/generate", {"text": "a", SP: {"regex": "a", "ebnf": 'root ::= "a"'}}, 400,
     f"{SP}.ebnf"),
    ("prompt longer than context", "POST", "/generate", {"input_ids": [1] * CONTEXT}, 400, "input_ids"),
    ("max_new_tokens past context", "POST", "/generate", {"text": "a", SP: {"max_new_tokens": CONTEXT}}, 400,
     f"{SP}.max_new_tokens"),
    ("unknown top-level field", "POST", "/generate", {"text": "a", "temperature": 0}, 400, "temperature"),
    ("stream not bool", "POST", "/generate", {"text": "a", "stream": "yes"}, 400, "stream"),
    ("fan-out too large", "POST", "/generate", {"text": ["a"] * 100, SP: {"n": 64}}, 400, f"{SP}.n"),
    ("top_logprobs_num huge", "POST", "/generate", {"text": "a", "top_logprobs_num": 10 ** 6}, 400,
     "top_logprobs_num"),
    ("completion without prompt", "POST", "/v1/completions", {"model": "m"}, 400, "prompt"),
    ("temperature above 2", "POST", "/v1/completions", {"prompt": "a", "temperature": 5}, 400, "temperature"),
    ("n zero", "POST", "/v1/completions", {"prompt": "a", "n": 0}, 400, "n"),
    ("n huge", "POST", "/v1/completions", {"prompt": "a", "n": 100000}, 400, "n"),
    ("max_tokens past context", "POST", "/v1/completions", {"prompt": "a", "max_tokens": CONTEXT}, 400,
     "max_tokens"),
    ("logit_bias bad key", "POST", "/v1/completions", {"prompt": "a", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ("logit_bias out of range", "POST", "/v1/completions", {"prompt": "a", "logit_bias": {"5": 1000}}, 400,
     "logit_bias"),
    ("stop not strings", "POST", "/v1/completions", {"prompt": "a", "stop": [1, 2]}, 400, "stop"),
    ("stream_options without stream", "POST", "/v1/completions",
     {"prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("unknown openai field", "POST", "/v1/completions", {"prompt": "a", "frobnicate": 1}, 400, "frobnicate"),
    ("regex extra invalid", "POST", "/v1/completions", {"prompt": "a", "regex": "[z-a]"}, 400, "regex"),
    ("empty messages", "POST", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("bad role", "POST", "/v1/chat/completions", {"messages": [{"role": "root", "content": "x"}]}, 400,
     "messages[0].role"),
    ("image part", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "messages[0].content[0]"),
    ("response_format bogus", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}, 400,
     "response_format.type"),
    ("json_schema not object", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": "nope"}}}, 400,
     "response_format.json_schema.schema"),
    ("top_logprobs without logprobs", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400, "top_logprobs"),
    ("tools", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, 400, "tools"),
    ("max_completion_tokens zero", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("unknown program", "POST", "/v1/programs/os.system", {"args": {}}, 400, "name"),
    ("missing program argument", "POST", "/v1/programs/few_shot_qa", {"args": {}}, 400, "args.question"),
    ("unknown program argument", "POST", "/v1/programs/few_shot_qa", {"args": {"question": "q", "evil": 1}}, 400,
     "args.evil"),
    ("code as arguments", "POST", "/v1/programs/few_shot_qa", {"args": "__import__('os').system('id')"}, 400,
     "args"),
    ("unknown run option", "POST", "/v1/programs/few_shot_qa",
     {"args": {"question": "q"}, "options": {"backend": "x"}}, 400, "options.backend"),
    ("bad run option value", "POST", "/v1/programs/few_shot_qa",
     {"args": {"question": "q"}, "options": {"temperature": -3}}, 400, "options.temperature"),
    ("tokenize non-string", "POST", "/tokenize", {"text": 3}, 400, "text"),
    ("detokenize bad ids", "POST", "/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("abort without rid", "POST", "/abort_request", {}, 400, "rid"),
    ("body over the limit", "POST", "/generate", {"text": "a" * (BODY_LIMIT + 10)}, 413, "body"),
    ("no such route", "GET", "/admin", None, 404, None),
    ("wrong method", "GET", "/generate", None, 405, None),
]


@pytest.fixture(scope="module")
def server(default_model_path):
    engine = shared_engine(str(default_model_path))
    assert engine.context_length == CONTEXT
    settings = ServerSettings(port=0, owns_engine=False, warmup=False, max_body_bytes=BODY_LIMIT)
    srv = BackgroundServer(engine, settings, ProgramRegistry.from_files([EXAMPLES / "quickstart.py"])).start()
    yield srv
    srv.stop()


def send(server, method: str, path: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_table_is_big_enough():
    assert len(CASES) >= 25 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case,method,path,body,status,param", CASES, ids=[c[0] for c in CASES])
def test_bad_request(server, case, method, path, body, status, param):
    got, reply = send(server, method, path, body)
    assert got == status, reply
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
        assert param.split(".")[-1].split("[")[0] in error["message"], error


def test_still_serving_after_the_table(server):
    status, out = send(server, "POST", "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    assert status == 200 and out["meta_info"]["completion_tokens"] == 2
    stats = server.state.engine.get_stats()
    assert stats["running"] == 0 and stats["waiting"] == 0
