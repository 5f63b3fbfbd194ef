"""The `radixgen` command line: a table of subcommands, each a small `Command`.

To add a subcommand, define `COMMAND = Command(...)` in your module and add one line to `COMMAND_TABLE`
("name": "module:attribute"). Modules are imported when the parser is built, so keep heavy imports inside
`run`. Errors a user can fix print as one line (`radixgen: error: ...`) and exit 1; `--debug` shows the
traceback instead. A bad flag prints the subcommand's usage (exit 2); Ctrl-C exits 130 and SIGTERM 143, each
with one line, after the engine has shut down.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

from radixgen.grammars.backend import GRAMMAR_BACKENDS
from radixgen.runtime.errors import RadixgenError
from radixgen.runtime.quant.options import QUANTIZATION_CHOICES

EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, the shell's code for a process ended by Ctrl-C
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


class Terminated(BaseException):
    """SIGTERM reached a command; it unwinds like KeyboardInterrupt, so `with Engine(...)` shuts the engine down."""


class GenerationFailed(RadixgenError):
    """The engine ended the request without a stop condition (it failed or shut down)."""


# Exceptions whose message alone is the report (bad input, missing files); others also name their type.
_USER_ERRORS = (RadixgenError, ValueError, FileNotFoundError)

# name -> "module:attribute" of a Command. One line per subcommand.
COMMAND_TABLE: dict[str, str] = {
    "generate": "radixgen.cli:GENERATE",
    "download": "radixgen.cli:DOWNLOAD",
    "serve": "radixgen.server.launch:SERVE",
    "run": "radixgen.program_command:RUN",
}


# ---------------------------------------------------------------------------------------------- checks
# Values the engine would refuse only after loading the model are checked first, each with a one-line message.
def check_device(device: str) -> None:
    kind, _, index = device.partition(":")
    if kind in ("gpu", "nvidia"):
        raise ValueError(f"--device {device}: the GPU device is called 'cuda' (or 'cuda:N'); use --device cuda")
    if kind not in ("auto", "cpu", "cuda") or (index and not (kind == "cuda" and index.isdigit())):
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")


def check_at_least(flag: str, value: float, low: float) -> None:
    if not value >= low:  # also refuses NaN
        raise ValueError(f"{flag} must be >= {low}, got {value}")


# ---------------------------------------------------------------------------------------------- generate
def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """The model and device flags of every command that builds an in-process engine (generate, run)."""
    p.add_argument("--model", default=None, help="HF model folder, .gguf file or a Hugging Face hub id in the local "
                                                 "HF cache (default: SmolLM2-135M-Instruct)")
    p.add_argument("--tokenizer-path", default=None,
                   help="tokenizer.json (or its folder) or .gguf file, when the model folder has none")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--threads", dest="cpu_threads", type=int, default=None,
                   help="torch threads of a CPU engine (default: one per core; fewer on a busy machine)")
    p.add_argument("--grammar-backend", default="radixgen", choices=GRAMMAR_BACKENDS,
                   help="the engine that enforces constraints (xgrammar and llguidance through their extras, "
                        "pip install 'radixgen[xgrammar]')")
    p.add_argument("--quantization", default="auto", choices=QUANTIZATION_CHOICES,
                   help="the layer linears: auto (as the checkpoint is), none (dense), int4 or fp8 (quantize a "
                        "dense checkpoint at load)")


def check_engine_arguments(args: argparse.Namespace) -> None:
    """Refuse bad values of `add_engine_arguments`' flags before a model loads."""
    check_device(args.device)
    if args.cpu_threads is not None:
        check_at_least("--threads", args.cpu_threads, 1)


def _generate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="the prompt text")
    add_engine_arguments(p)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampler when temperature > 0")
    template = p.add_mutually_exclusive_group()
    template.add_argument("--raw", action="store_true",
                          help="plain completion of the prompt (default: the model's chat template when it has one)")
    template.add_argument("--chat", action="store_true", help=argparse.SUPPRESS)  # the default now; still accepted
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")


def _prompt_ids(tokenizer, prompt: str, raw: bool) -> list[int]:
    """The prompt in the model's chat template (an instruct model), or as plain text (`--raw`, or no template)."""
    if raw or tokenizer.chat_template is None:
        return tokenizer.encode(prompt)
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def _run_generate(args: argparse.Namespace) -> int:
    check_at_least("--max-new-tokens", args.max_new_tokens, 1)
    check_at_least("--temperature", args.temperature, 0.0)
    check_engine_arguments(args)
    from radixgen.runtime.engine import Engine

    print(f"radixgen: loading {args.model or 'the default model'} ...", file=sys.stderr, flush=True)
    # The engine fetches the default model on first use (with a progress line) when --model is not given.
    with Engine(args.model, tokenizer_path=args.tokenizer_path, device=args.device, dtype=args.dtype,
                cpu_threads=args.cpu_threads, grammar_backend=args.grammar_backend, quantization=args.quantization,
                max_running_requests=4,
                cuda_graph=False) as engine:
        ids = _prompt_ids(engine.tokenizer, args.prompt, args.raw)
        params: dict[str, float | int] = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
        if args.temperature > 0:
            params["seed"] = args.seed
        answer: list[str] = []
        finish: dict = {}
        for chunk in engine.generate(input_ids=ids, sampling_params=params, stream=True):
            answer.append(chunk["text"])
            sys.stdout.write(chunk["text"])
            sys.stdout.flush()
            if chunk["finished"]:
                finish = chunk["meta_info"]["finish_reason"]
    sys.stdout.write("\n")
    sys.stdout.flush()
    if finish.get("type") == "abort":
        raise GenerationFailed(f"the generation failed: {finish.get('message')}")
    if not "".join(answer).strip():
        print(f"radixgen: the model's answer is empty: it ended at once (finish reason: {finish.get('type')})",
              file=sys.stderr)
    return 0


GENERATE = Command("generate", "generate text from a prompt, streamed to stdout", _generate_arguments, _run_generate)


# ---------------------------------------------------------------------------------------------- download
def _download_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="download again even when cached")


def _run_download(args: argparse.Namespace) -> int:
    from radixgen.runtime.download import cached_model_path, download_model

    path = None if args.force else cached_model_path()
    if path is None:
        path = download_model()
    print(path)
    return 0


DOWNLOAD = Command("download", "fetch and verify the default model into the cache", _download_arguments, _run_download)


# ---------------------------------------------------------------------------------------------- main
def _load_command(spec: str) -> Command:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def build_parser(table: dict[str, str] | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand in `table` (default COMMAND_TABLE)."""
    from radixgen import __version__

    parser = argparse.ArgumentParser(prog="radixgen", description="radixgen: structured LLM programs, fast.")
    parser.add_argument("--version", action="version", version=f"radixgen {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, spec in (COMMAND_TABLE if table is None else table).items():
        command = _load_command(spec)
        p = sub.add_parser(name, help=command.help, description=command.help, parents=[common])
        command.add_arguments(p)
        p.set_defaults(_run=command.run, _parser=p)
    return parser


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """While a command runs, SIGTERM raises `Terminated` in the main thread (elsewhere signals cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None, table: dict[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after a bare `--` passes through untouched (e.g. to the script of `radixgen run`).
    cut = argv.index("--") if "--" in argv else len(argv)
    args, unknown = build_parser(table).parse_known_args(argv[:cut])
    if unknown:  # reported by the subcommand's parser, so its usage is the one printed
        args._parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.passthrough = argv[cut + 1 :]
    try:
        with _sigterm_unwinds():
            return args._run(args)
    except KeyboardInterrupt:
        print("radixgen: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        print("radixgen: terminated (SIGTERM)", file=sys.stderr)
        return EXIT_TERMINATED
    except Exception as e:  # one clear line unless --debug
        if args.debug:
            raise
        message = str(e) if isinstance(e, _USER_ERRORS) else f"{type(e).__name__}: {e} (--debug for details)"
        print(f"radixgen: error: {message}", file=sys.stderr)
        return 1
