"""`radixgen serve` as a real process: ready only after warm-up, SIGTERM drains in-flight work and exits 0."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from radixgen.cli import build_parser
from radixgen.server.launch import engine_options, settings_from


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_arguments_map_to_engine_and_server():
    args = build_parser().parse_args(["serve", "--port", "1234", "--max-total-tokens", "512", "--schedule-policy",
                                      "fcfs", "--disable-radix-cache", "--no-enable-jump-forward", "--api-key", "k"])
    opts = engine_options(args)
    assert opts["max_total_tokens"] == 512 and opts["schedule_policy"] == "fcfs"
    assert opts["disable_radix_cache"] is True and opts["enable_jump_forward"] is False
    settings = settings_from(args)
    assert (settings.host, settings.port, settings.api_key) == ("127.0.0.1", 1234, "k")


def _health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def test_sigterm_drains_in_flight_and_exits_zero(default_model_path, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "server.log", "w") as log:
        _run_and_terminate(default_model_path, port, url, log, tmp_path)


def _run_and_terminate(default_model_path, port: int, url: str, log, tmp_path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "radixgen", "serve", "--model", str(default_model_path), "--port",
                             str(port), "--max-total-tokens", "4096", "--shutdown-grace", "60"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while _health(url) != 200:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline, "server never became ready"
            time.sleep(0.25)
        events: list[str] = []
        first = threading.Event()

        def stream() -> None:
            body = {"text": "Count:", "stream": True,
                    "sampling_params": {"max_new_tokens": 24, "ignore_eos": True, "temperature": 0}}
            req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(), method="POST")
            with urllib.request.urlopen(req, timeout=120) as resp:
                for raw in resp:
                    line = raw.decode().strip()
                    if line.startswith("data:"):
                        events.append(line[5:].strip())
                        first.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert first.wait(60)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert _health(url) is None  # no longer accepting connections
        reader.join(120)
        assert proc.wait(120) == 0
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert last["finished"] and last["meta_info"]["finish_reason"]["type"] == "length"
        assert last["meta_info"]["completion_tokens"] == 24
        text = (tmp_path / "server.log").read_text()
        assert "completion=24" in text and "stopped" in text  # the per-request INFO line, then a clean stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ctrl_c_while_serving_stops_cleanly(default_model_path, tmp_path):
    """Ctrl-C is a server's ordinary stop: no new connections, drain, shut the engine down, exit 0."""
    port = free_port()
    with open(tmp_path / "server.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "radixgen", "serve", "--model", str(default_model_path),
                                 "--port", str(port), "--max-total-tokens", "1024"],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 180
            while _health(f"http://127.0.0.1:{port}") != 200:
                assert proc.poll() is None, (tmp_path / "server.log").read_text()
                assert time.monotonic() < deadline, "server never became ready"
                time.sleep(0.25)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(120) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = (tmp_path / "server.log").read_text()
    assert text.rstrip().endswith("stopped"), text
    assert "Traceback" not in text and "terminate called" not in text


class _SlowWarmupEngine:
    """Just enough engine for /health: its first generate waits until the test lets it finish."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.tokenizer = type("Tok", (), {"encode": staticmethod(lambda text, add_special_tokens=True: [1])})()

    async def async_generate(self, **kwargs):
        import asyncio

        while not self.release.is_set():
            await asyncio.sleep(0.01)
        return {"text": "", "output_ids": [], "meta_info": {}}

    def shutdown(self) -> None:
        pass


def test_health_is_503_until_warmup_ran():
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from radixgen.server import ServerSettings, create_app

    engine = _SlowWarmupEngine()

    async def scenario() -> list[int]:
        async with TestClient(TestServer(create_app(engine, ServerSettings()))) as client:
            before = (await client.get("/health")).status
            engine.release.set()
            for _ in range(200):
                after = (await client.get("/health")).status
                if after == 200:
                    break
                await asyncio.sleep(0.01)
            return [before, after]

    assert asyncio.run(scenario()) == [503, 200]
