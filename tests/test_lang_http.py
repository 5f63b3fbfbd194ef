"""The HTTP backends (`Endpoint`, `OpenAICompatible`) against the real server on loopback (radixgen.server,
in a background thread over the shared engine): the same programs give the same text as in-process."""

from __future__ import annotations

import re

import pytest
from lang_engine_cache import shared_engine

import radixgen as sgl
from radixgen.lang.backend import ModelCallError
from radixgen.lang.chat_template import CHATML

IPV4 = r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"


@pytest.fixture(scope="module")
def server(default_model_path):
    from radixgen.server import launch
    from radixgen.server.state import ServerSettings

    settings = ServerSettings(port=0, owns_engine=False)  # the engine is shared with the other test modules
    srv = launch.BackgroundServer(shared_engine(str(default_model_path)), settings).start()
    yield srv.url
    srv.stop()


@sgl.function
def qa_chat(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=12))


@sgl.function
def sky(s):
    s += "The color of a clear sky during the day is"
    s += sgl.select("color", choices=[" blue", " green", " purple"])


def test_endpoint_runs_programs_with_roles_select_and_stream(server, default_model_path):
    local = sgl.EngineBackend(shared_engine(str(default_model_path)))
    remote = sgl.Endpoint(server)
    here = qa_chat.run(question="What is the capital of France?", backend=local, temperature=0)
    there = qa_chat.run(question="What is the capital of France?", backend=remote, temperature=0)
    assert there.error() is None and there.text() == here.text()
    @sgl.function
    def pick(s, method):
        s += "The color of a clear sky during the day is"
        s += sgl.select("color", choices=[" blue", " green", " purple"], choices_method=method)

    for method in ("token_length_normalized", "unconditional_likelihood_normalized"):
        a, b = pick.run(method=method, backend=local), pick.run(method=method, backend=remote)
        assert b.error() is None and a["color"] == b["color"]
        assert b.get_meta_info("color")["normalized_prompt_logprobs"] == pytest.approx(
            a.get_meta_info("color")["normalized_prompt_logprobs"], abs=1e-3)
    streamed = qa_chat.run(question="What is the capital of France?", backend=remote, temperature=0, stream=True)
    assert "".join(streamed.text_iter()) == here.text()
    batch = qa_chat.compile().run_batch([{"question": "Name a fruit."}, {"question": "Name a color."}],
                                        backend=remote, temperature=0)
    assert all(s.error() is None and s["answer"] for s in batch)


def test_openai_compatible_generates_and_selects_by_echoed_logprobs(server):
    backend = sgl.OpenAICompatible(server + "/v1", model="default")
    state = sky.run(backend=backend)
    assert state.error() is None and state["color"] == " blue"

    @sgl.function
    def plain(s):
        s += "Q: What is the capital of France?\nA:" + sgl.gen("a", max_tokens=6, stop="\n")

    out = plain.run(backend=backend, temperature=0)
    assert "Paris" in out["a"] and out.get_meta_info("a")["prompt_tokens"] > 5
    streamed = plain.run(backend=backend, temperature=0, stream=True)
    assert "".join(streamed.text_iter("a")) == out["a"]
    assert streamed.get_meta_info("a")["completion_tokens"] == out.get_meta_info("a")["completion_tokens"]


def test_openai_compatible_passes_constraints_and_reports_what_it_cannot_do(server):
    backend = sgl.OpenAICompatible(server + "/v1", model="default")
    state = qa_chat.run(question="hi", backend=backend)
    assert isinstance(state.error(), ModelCallError) and "role_template=" in str(state.error())

    @sgl.function
    def constrained(s):
        s += "Q: What is the IP address of the Google DNS servers?\nA: " + sgl.gen("ip", max_tokens=16, regex=IPV4)

    state = constrained.run(backend=backend, temperature=0)
    assert state.error() is None and re.fullmatch(IPV4, state["ip"])
    with_roles = sgl.OpenAICompatible(server + "/v1", model="default", role_template=CHATML)
    state = qa_chat.run(question="What is the capital of France?", backend=with_roles, temperature=0)
    assert state.error() is None and state.text().startswith("<|im_start|>user\n")
    assert "Paris" in state["answer"]


def test_endpoint_reports_unreachable_server():
    state = qa_chat.run(question="hi", backend=sgl.Endpoint("http://127.0.0.1:9"))
    assert isinstance(state.error(), ModelCallError) and "failed" in str(state.error())
