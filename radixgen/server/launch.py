"""`radixgen serve`: load the engine (and program files), serve until SIGTERM/SIGINT, drain, exit 0.

Also `BackgroundServer`, the same server on a thread with its own event loop (tests, benchmarks, notebooks).
On SIGTERM the listening socket closes at once, requests in flight get `--shutdown-grace` seconds to finish
(then they are cancelled, which aborts them in the engine), and the engine shuts down. The flags, the program
files and the listening address are checked before the model loads; whatever fails later, the engine is shut
down before the command returns.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from radixgen.grammars.tool_formats import TOOL_FORMATS
from radixgen.runtime.engine_config import EngineConfig
from radixgen.runtime.errors import RadixgenError
from radixgen.server.app import create_app
from radixgen.server.state import DEFAULT_MAX_BODY_BYTES, DEFAULT_PORT, STATE, ServerSettings

log = logging.getLogger("radixgen.server")

# EngineConfig fields with no command-line flag (set through the model or Python only).
_NO_FLAG = {"model_path", "dummy_config"}


class ListenError(RadixgenError):
    """The server cannot listen on the address asked for (unknown host, port in use, no permission)."""


def _engine_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(EngineConfig) if f.name not in _NO_FLAG]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF model folder, .gguf file or a Hugging Face hub id in the local "
                                                 "HF cache (default: SmolLM2-135M-Instruct)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--api-key", default=os.environ.get("RADIXGEN_API_KEY"),
                   help="require `Authorization: Bearer KEY` on every route but /health (env RADIXGEN_API_KEY)")
    p.add_argument("--programs", nargs="+", action="extend", default=[], metavar="FILE.py",
                   help="register every @function in these files under /v1/programs")
    p.add_argument("--served-model-name", default=None, help="model name in /v1/models (default: file name)")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="request body size limit")
    p.add_argument("--shutdown-grace", type=float, default=30.0,
                   help="seconds in-flight requests get to finish after SIGTERM")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template replacing the model's own on /v1/chat/completions")
    p.add_argument("--tool-call-format", default=None, choices=TOOL_FORMATS,
                   help="how the model writes tool calls (default: read from the chat template, else hermes)")
    engine = p.add_argument_group("engine options (radixgen.Engine's keyword options)")
    defaults = EngineConfig()
    for f in _engine_fields():
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            if default:
                engine.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name, action="store_false",
                                    help=f"turn {f.name} off")
            else:
                engine.add_argument(flag, dest=f.name, action="store_true")
            continue
        kind = type(default) if isinstance(default, (int, float)) else int if "int" in str(f.type) else str
        aliases = ["--threads"] if f.name == "cpu_threads" else []
        engine.add_argument(flag, *aliases, dest=f.name, type=kind, default=default, help=f"default: {default}")
    p.set_defaults(log_level="info")  # the per-request log lines are INFO


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    return {f.name: getattr(args, f.name) for f in _engine_fields() if hasattr(args, f.name)}


def settings_from(args: argparse.Namespace) -> ServerSettings:
    return ServerSettings(host=args.host, port=args.port, api_key=args.api_key or None,
                          max_body_bytes=args.max_body_bytes, served_model_name=args.served_model_name,
                          shutdown_grace=args.shutdown_grace, chat_template=read_chat_template(args.chat_template),
                          tool_call_format=args.tool_call_format)


def read_chat_template(path: str | None) -> str | None:
    """The text of `--chat-template FILE` (checked to compile), or None."""
    if path is None:
        return None
    from radixgen.tokenizer.chat_template import compile_chat_template

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"--chat-template {path}: {exc.strerror or exc}") from None
    try:
        compile_chat_template(text)
    except Exception as exc:
        raise ValueError(f"--chat-template {path}: not a valid Jinja template: {exc}") from None
    return text


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse flag values the server would trip on only after loading the model, each with a one-line message."""
    from radixgen.cli import check_at_least, check_device

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    check_at_least("--shutdown-grace", args.shutdown_grace, 0.0)
    check_at_least("--max-body-bytes", args.max_body_bytes, 1)
    check_device(args.device)
    read_chat_template(args.chat_template)


def _listen_error(host: str, port: int, exc: OSError) -> ListenError:
    return ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}")


def check_listen_address(host: str, port: int) -> None:
    """Bind (and release) every address `host` resolves to, so an unknown host or a port in use is reported
    before the model loads; the real bind reports the same way if the address is taken in between."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise _listen_error(host, port, exc) from None
    for family, kind, proto, _name, address in infos:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:  # an address family this machine lacks; asyncio skips it the same way
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's server sockets do
            try:
                sock.bind(address)
            except OSError as exc:
                raise _listen_error(host, port, exc) from None


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    from radixgen.runtime.engine import Engine
    from radixgen.server.programs import ProgramRegistry

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    programs = ProgramRegistry.from_files(args.programs) if args.programs else None  # fail before the model loads
    check_listen_address(args.host, args.port)
    log.info("loading %s ...", args.model or "the default model")
    engine = Engine(args.model, **engine_options(args))
    try:
        asyncio.run(serve(engine, settings_from(args), programs))
    finally:  # also when start-up failed before the app took the engine over
        engine.shutdown()
        if programs is not None:
            programs.close()
    return 0


async def start_site(app: web.Application, settings: ServerSettings) -> web.AppRunner:
    """Set the app up and listen; on failure the app is cleaned up again (its engine too, when it owns it)."""
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=settings.shutdown_grace,
                           access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, settings.host, settings.port).start()
    except OSError as exc:
        await runner.cleanup()
        raise _listen_error(settings.host, settings.port, exc) from None
    except BaseException:
        await runner.cleanup()
        raise
    return runner


async def serve(engine, settings: ServerSettings, programs=None) -> None:
    """Serve until SIGTERM or SIGINT, then stop accepting, drain in-flight requests, shut the engine down."""
    runner = await start_site(create_app(engine, settings, programs), settings)
    host, port = runner.addresses[0][:2]
    log.info("listening on http://%s:%d (warming up; /health turns 200 when ready)", host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: no new connections; in-flight requests get %.0f s", settings.shutdown_grace)
    await runner.cleanup()
    log.info("stopped")


class BackgroundServer:
    """The server on a daemon thread with its own event loop: `start()`, `url`, `state`, `stop()`.

    `port=0` in the settings picks a free port. The engine is shut down on stop only when
    `settings.owns_engine` is set.
    """

    def __init__(self, engine, settings: ServerSettings | None = None, programs=None) -> None:
        self.app = create_app(engine, settings or ServerSettings(port=0), programs)
        self.settings = self.app[STATE].settings
        self.loop = asyncio.new_event_loop()
        self.runner: web.AppRunner | None = None
        self.url = ""
        self._thread = threading.Thread(target=self.loop.run_forever, name="radixgen-server", daemon=True)

    @property
    def state(self):
        return self.app[STATE]

    def start(self, wait_ready: float = 120.0) -> BackgroundServer:
        self._thread.start()
        self.runner = asyncio.run_coroutine_threadsafe(start_site(self.app, self.settings), self.loop).result(60)
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        deadline = self.loop.time() + wait_ready
        while not self.state.ready and self.loop.time() < deadline:
            threading.Event().wait(0.05)
        if not self.state.ready:
            raise RuntimeError("the server did not become ready (warm-up failed or timed out)")
        return self

    def stop(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(self.settings.shutdown_grace + 30)
            self.runner = None
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _command():
    from radixgen.cli import Command

    return Command("serve", "serve the native and OpenAI-compatible HTTP APIs (and registered programs)",
                   add_arguments, run)


SERVE = _command()
