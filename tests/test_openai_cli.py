"""The command-line surface OpenAI clients meet: `radixgen --version`, `radixgen serve --chat-template FILE
--tool-call-format F` (checked before the model loads), and a real `radixgen serve` process answering the
official `openai` client with the template and the format it was given."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import pytest

import radixgen
from radixgen.cli import build_parser
from radixgen.server.launch import settings_from

QWEN3_TEMPLATE = Path("/work/shared/vocabs/chat-templates/Qwen-Qwen3-0.6B.jinja")
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone.",
                                         "parameters": {"type": "object", "properties": {
                                             "tz": {"type": "string", "maxLength": 16}}, "required": ["tz"]}}}


def _radixgen(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "radixgen", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_version():
    proc = _radixgen("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"radixgen {radixgen.__version__}"


def test_chat_template_and_tool_call_format_flags(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    args = build_parser().parse_args(["serve", "--chat-template", str(template), "--tool-call-format", "pythonic"])
    settings = settings_from(args)
    assert settings.chat_template == template.read_text() and settings.tool_call_format == "pythonic"
    assert settings_from(build_parser().parse_args(["serve"])).tool_call_format is None  # read from the template


@pytest.mark.parametrize("flags, code, message", [
    (["--tool-call-format", "xml"], 2, "invalid choice: 'xml'"),
    (["--chat-template", "/nonexistent/t.jinja"], 1, "--chat-template /nonexistent/t.jinja: No such file"),
    (["--chat-template", "{bad}"], 1, "not a valid Jinja template"),
])
def test_bad_flags_fail_before_the_model_loads(tmp_path, flags, code, message):
    if flags[-1] == "{bad}":
        bad = tmp_path / "bad.jinja"
        bad.write_text("{% for m in messages %}")  # never closed
        flags = [flags[0], str(bad)]
    proc = _radixgen("serve", "--model", str(tmp_path / "no-model"), *flags)
    assert proc.returncode == code and message in proc.stderr, proc.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def test_a_served_template_and_format_reach_the_openai_client(default_model_path, tmp_path):
    openai = pytest.importorskip("openai")
    if not QWEN3_TEMPLATE.exists():
        pytest.skip("the shared Qwen3 chat template is not here")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 (closed below, after the process)
    proc = subprocess.Popen([sys.executable, "-m", "radixgen", "serve", "--model", str(default_model_path), "--port",
                             str(port), "--max-total-tokens", "4096", "--served-model-name", "smol",
                             "--chat-template", str(QWEN3_TEMPLATE), "--tool-call-format", "pythonic"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while not _ready(url):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.25)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        assert client.models.retrieve("smol").id == "smol"
        r = client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "What time is it in Paris?"}], tools=[TIME],
            tool_choice="required", parallel_tool_calls=False, max_tokens=40, temperature=0,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        call = r.choices[0].message.tool_calls[0]
        assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_time"
        jsonschema.validate(json.loads(call.function.arguments), TIME["function"]["parameters"])
        tokens = client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "What time is it in Paris?"}], tools=[TIME],
            tool_choice="required", parallel_tool_calls=False, max_tokens=40, temperature=0, logprobs=True,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}}).choices[0].logprobs.content
        assert "".join(t.token for t in tokens).startswith("[get_time(")  # pythonic, as --tool-call-format says
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        log.close()
