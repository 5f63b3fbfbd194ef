"""Every way a `radixgen` process ends early ends cleanly: one line on stderr, its exit status, no native abort.

Each case runs in a subprocess (`python -m radixgen ...`, an example script, or a few lines of Python around
the same entry point when a fault has to be injected) and checks the status and the last line of stderr; none
may print a traceback or abort in native code ("terminate called without an active exception", exit 134).
Cases that need no model come first; the others load the default model once each.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 120  # seconds any one process may take; none comes near it


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}


def run(args: list[str], **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT,
                          env=_env(**extra_env), check=False)


def radixgen(*args: str, **extra_env: str) -> subprocess.CompletedProcess:
    return run(["-m", "radixgen", *args], **extra_env)


def injected(setup: str, *args: str) -> subprocess.CompletedProcess:
    """`radixgen ARGS` after `setup` ran in the same interpreter (to inject a fault)."""
    code = setup + "\nimport sys\nfrom radixgen.__main__ import main\nsys.exit(main(sys.argv[1:]))\n"
    return run(["-c", code, *args])


def assert_clean(proc: subprocess.CompletedProcess, status: int, last_line: str) -> None:
    """Exit `status`, stderr's last line starts with `last_line`, and nothing crashed on the way."""
    err = proc.stderr
    assert "terminate called" not in err and "Fatal Python error" not in err, err
    assert "Traceback" not in err, err
    assert proc.returncode == status, (proc.returncode, err)
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith(last_line), err


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------ refused before any model loads
@pytest.mark.parametrize("args,status,last_line", [
    (["serve", "--host", "999.1.1.1"], 1, "radixgen: error: cannot listen on 999.1.1.1:30000: "),
    (["serve", "--port", "70000"], 1, "radixgen: error: --port must be in 0..65535, got 70000"),
    (["generate", "hi", "--temperature", "-1"], 1, "radixgen: error: --temperature must be >= 0.0, got -1.0"),
    (["generate", "hi", "--max-new-tokens", "0"], 1, "radixgen: error: --max-new-tokens must be >= 1, got 0"),
    (["generate", "hi", "--device", "gpu"], 1, "radixgen: error: --device gpu: the GPU device is called 'cuda'"),
    (["serve", "--device", "gpu"], 1, "radixgen: error: --device gpu: the GPU device is called 'cuda'"),
    (["generate", "hi", "--bogus"], 2, "radixgen generate: error: unrecognized arguments: --bogus"),
    (["serve", "--max-total-tokens", "many"], 2, "radixgen serve: error: argument --max-total-tokens"),
])
def test_bad_values_are_refused_before_the_model_loads(args, status, last_line):
    proc = radixgen(*args)
    assert_clean(proc, status, last_line)
    if status == 2:  # a bad flag prints the subcommand's usage
        assert proc.stderr.startswith(f"usage: radixgen {args[0]} ")
    assert "loading" not in proc.stderr


def test_a_port_in_use_is_one_line(busy_port):
    assert_clean(radixgen("serve", "--port", str(busy_port)), 1,
                 f"radixgen: error: cannot listen on 127.0.0.1:{busy_port}: Address already in use")


def test_a_program_file_that_raises_is_one_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('broken program file')\n")
    assert_clean(radixgen("serve", "--programs", str(bad)), 1,
                 "radixgen: error: RuntimeError: broken program file (--debug for details)")


def test_a_hub_id_outside_the_cache_is_one_line(tmp_path):
    proc = radixgen("generate", "hi", "--model", "SomeOrg/NoSuchModel", HF_HUB_CACHE=str(tmp_path))
    assert_clean(proc, 1, "radixgen: error: SomeOrg/NoSuchModel is not a local path and not in the Hugging Face "
                          f"cache ({tmp_path}): hub ids are looked up in the local cache only")


def test_a_folder_without_a_tokenizer_names_the_flag(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert_clean(radixgen("generate", "hi", "--model", str(tmp_path)), 1,
                 f"radixgen: error: {tmp_path} has no tokenizer.json; pass one with --tokenizer-path")


@pytest.mark.parametrize("flag,value,status,last_line", [
    ("--endpoint", "http://127.0.0.1:{port}", 1,
     "quickstart.py: error: GET http://127.0.0.1:{port}/get_model_info failed: "),
    ("--endpoint", "localhost:{port}", 2,
     "quickstart.py: error: --endpoint must be a URL with its scheme, e.g. http://localhost:{port}"),
    ("--model", "/no/such/model.gguf", 1, "quickstart.py: error: model path /no/such/model.gguf does not exist"),
])
def test_example_scripts_report_a_bad_backend_in_one_line(flag, value, status, last_line):
    port = _closed_port()
    proc = run([str(ROOT / "examples" / "quickstart.py"), flag, value.format(port=port)])
    assert_clean(proc, status, last_line.format(port=port))


# ------------------------------------------------------------------ signals
def _start(args: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=_env(), **kwargs)


def _signal_after(proc: subprocess.Popen, stream, marker: str, sig: int) -> subprocess.CompletedProcess:
    """Read `stream` up to a line holding `marker`, send `sig`, and collect the rest."""
    seen = []
    try:
        for line in stream:
            seen.append(line)
            if marker in line:
                break
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if stream is proc.stderr:
        err = "".join(seen) + err
    else:
        out = "".join(seen) + out
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("sig,status,last_line", [
    (signal.SIGINT, 130, "radixgen: interrupted"),
    (signal.SIGTERM, 143, "radixgen: terminated (SIGTERM)"),
])
def test_a_signal_while_the_model_loads(default_model_path, sig, status, last_line):
    proc = _start(["-m", "radixgen", "generate", "hi", "--model", str(default_model_path)])
    assert_clean(_signal_after(proc, proc.stderr, "radixgen: loading", sig), status, last_line)


@pytest.mark.parametrize("sig,status,last_line", [
    (signal.SIGINT, 130, "radixgen: interrupted"),
    (signal.SIGTERM, 143, "radixgen: terminated (SIGTERM)"),
])
def test_a_signal_while_the_build_thread_reads_weights(default_model_path, sig, status, last_line):
    """The signal lands while the engine's build thread is inside the loader, which cannot be stopped: the
    command still reports and leaves at once, without finalizing around that thread."""
    setup = textwrap.dedent(f"""
        import os
        import radixgen.runtime.model_runner as model_runner
        real_load = model_runner.load_model
        def load_while_signalled(*args, **kwargs):
            os.kill(os.getpid(), {int(sig)})
            return real_load(*args, **kwargs)
        model_runner.load_model = load_while_signalled
    """)
    assert_clean(injected(setup, "generate", "hi", "--model", str(default_model_path)), status, last_line)


LONG_PROGRAM = """
import radixgen as sgl

@sgl.function
def count(s):
    s += "Count: 1, 2, 3," + sgl.gen("more", max_tokens=2000, ignore_eos=True)

if __name__ == "__main__":
    print("program started", flush=True)
    count.run(temperature=0)
"""


@pytest.mark.parametrize("sig,status,last_line", [
    (signal.SIGINT, 130, "radixgen: interrupted"),
    (signal.SIGTERM, 143, "radixgen: terminated (SIGTERM)"),
])
def test_a_signal_while_a_program_runs(default_model_path, tmp_path, sig, status, last_line):
    program = tmp_path / "count.py"
    program.write_text(LONG_PROGRAM)
    proc = _start(["-m", "radixgen", "run", str(program), "--model", str(default_model_path)])
    assert_clean(_signal_after(proc, proc.stdout, "program started", sig), status, last_line)


# ------------------------------------------------------------------ exceptions with the engine running
def test_an_exception_while_a_program_file_starts(default_model_path, tmp_path):
    program = tmp_path / "bad.py"
    program.write_text("raise RuntimeError('the program failed at start')\n")
    assert_clean(radixgen("run", str(program), "--model", str(default_model_path)), 1,
                 "radixgen: error: RuntimeError: the program failed at start (--debug for details)")


def test_the_listening_socket_failing_after_the_model_loaded(default_model_path, busy_port):
    """The port is taken between the early check and the real bind: warm-up has started on the engine."""
    setup = "import radixgen.server.launch as launch\nlaunch.check_listen_address = lambda host, port: None"
    proc = injected(setup, "serve", "--model", str(default_model_path), "--port", str(busy_port))
    assert_clean(proc, 1, f"radixgen: error: cannot listen on 127.0.0.1:{busy_port}: ")
    assert "address already in use" in proc.stderr.splitlines()[-1].lower()


def test_an_exception_during_shutdown(default_model_path):
    setup = textwrap.dedent("""
        from radixgen.runtime.engine import Engine
        clean_shutdown = Engine.shutdown
        def failing_shutdown(self):
            clean_shutdown(self)
            raise RuntimeError("shutdown failed")
        Engine.shutdown = failing_shutdown
    """)
    proc = injected(setup, "generate", "hi", "--model", str(default_model_path), "--max-new-tokens", "2")
    assert_clean(proc, 1, "radixgen: error: RuntimeError: shutdown failed (--debug for details)")


def test_the_interpreter_exits_with_the_engine_busy(default_model_path):
    """A script that leaves while a request is decoding: the engine's exit hook stops and joins its thread."""
    script = textwrap.dedent(f"""
        import threading
        from radixgen import Engine

        engine = Engine({str(default_model_path)!r}, max_total_tokens=4096)
        started = threading.Event()

        def decode():
            for _chunk in engine.generate("Count:", {{"max_new_tokens": 2000, "ignore_eos": True}}, stream=True):
                started.set()

        threading.Thread(target=decode, daemon=True).start()
        started.wait(60)
        raise SystemExit("leaving with the engine busy")
    """)
    assert_clean(run(["-c", script]), 1, "leaving with the engine busy")
