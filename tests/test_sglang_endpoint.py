"""SGLang's own client against radixgen's server: the functions of SGLang's `sglang/test/test_programs.py` (see
sglang_programs.py) run with the installed sglang (0.4.10.post2, the dev extra) and its `RuntimeEndpoint`
against a radixgen server on the default model, and a streamed run gives the text of a non-streamed one.

Nothing of radixgen's language runs here: the programs are SGLang's, interpreted by SGLang's frontend, which
speaks to the server over HTTP. Every request they send must succeed (no 4xx/5xx in the server's metrics).
Gens are capped at ENDPOINT_MAX_TOKENS tokens on the client side (CappedEndpoint) to keep it quick.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lang_engine_cache import reseed, shared_engine
from sglang_programs import ENDPOINT_SKIPPED, WRONG_ANSWERS, CappedEndpoint, programs, run_program, selected
from sglang_programs import sglang as sgl
from test_server import http
from test_server_sglang import run_client, sglang_frontend_env

from radixgen.server.launch import BackgroundServer
from radixgen.server.state import ServerSettings

SELECTED = selected(ENDPOINT_SKIPPED)
TESTS_DIR = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def server(default_model_path):
    settings = ServerSettings(port=0, owns_engine=False)  # the engine is shared with the other test modules
    srv = BackgroundServer(shared_engine(str(default_model_path)), settings).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def endpoint(server):
    """SGLang's default backend set to a (capped) RuntimeEndpoint of the server, restored afterwards."""
    previous = sgl.global_config.default_backend
    sgl.set_default_backend(CappedEndpoint(server.url))
    yield server
    sgl.global_config.default_backend = previous


def request_counts(server) -> dict[tuple[str, str], float]:
    """(route, status) -> requests the server has answered, from its /metrics."""
    status, text = http(server, "GET", "/metrics")
    assert status == 200
    counts = {}
    for line in text.splitlines():
        if line.startswith("radixgen_http_requests_total{"):
            labels, value = line[len("radixgen_http_requests_total{"):].split("} ")
            fields = dict(part.split("=") for part in labels.split(","))
            counts[(fields["route"].strip('"'), fields["status"].strip('"'))] = float(value)
    return counts


def failed_requests(before: dict, after: dict) -> dict:
    """(route, status) -> how many requests answered other than 200 between two request_counts."""
    return {key: n - before.get(key, 0) for key, n in after.items() if key[1] != "200" and n > before.get(key, 0)}


def test_every_program_is_selected_or_skipped_for_a_reason():
    assert set(WRONG_ANSWERS) <= set(SELECTED)
    assert len(SELECTED) == 14  # of the 19 functions in 0.4.10.post2


@pytest.mark.parametrize("name", SELECTED)
def test_sglang_program_through_runtime_endpoint(endpoint, default_model_path, name):
    reseed(shared_engine(str(default_model_path)))  # programs sample: their tokens must not depend on the order
    before = request_counts(endpoint)
    try:
        run_program(programs, name)
    finally:
        assert failed_requests(before, request_counts(endpoint)) == {}


@sgl.function
def chat_then_word(s, question):
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=16, temperature=0, stop=["\n\n"]))
    s += "\nIn one word, in French:" + sgl.gen("word", max_tokens=6, temperature=0)


def test_streamed_text_equals_non_streamed_text(server):
    backend = sgl.RuntimeEndpoint(server.url)  # not capped: the program's own budgets
    question = "Write 'naïve café ☕' twice."  # the answer repeats characters of several UTF-8 bytes
    plain = chat_then_word.run(question=question, backend=backend)
    streamed = chat_then_word.run(question=question, backend=backend, stream=True)
    pieces = "".join(streamed.text_iter())
    assert plain.text() and pieces == plain.text() and streamed.text() == plain.text()
    streamed = chat_then_word.run(question=question, backend=backend, stream=True)
    assert "".join(streamed.text_iter("answer")) == plain["answer"]
    assert streamed["word"] == plain["word"]


# The same functions through the sglang 0.5 client, unzipped from its wheel and run in a subprocess (it cannot
# share this process with the installed 0.4.10). A slow test: it needs the wheel (see test_server_sglang.py).
PROGRAMS_CLIENT = '''
import json, sys
sys.path.insert(0, sys.argv[2])  # the suite's tests folder, for sglang_programs
import sglang_programs as sp

sp.sglang.set_default_backend(sp.CappedEndpoint(sys.argv[1]))
outcomes = {name: sp.outcome(name) for name in sp.selected(sp.ENDPOINT_SKIPPED)}
print(json.dumps({"version": sp.sglang.__version__, "outcomes": outcomes}))
'''


@pytest.mark.slow
def test_sglang_05_client_runs_sglangs_test_programs(server, tmp_path):
    before = request_counts(server)
    out = run_client(PROGRAMS_CLIENT, sglang_frontend_env("0.5", tmp_path), server.url, str(TESTS_DIR))
    assert out["version"].startswith("0.5.") and set(out["outcomes"]) == set(SELECTED)
    assert {name: o for name, o in out["outcomes"].items() if o not in ("passed", "xfailed")} == {}
    assert failed_requests(before, request_counts(server)) == {}
