"""The `radixgen` command line: a table of subcommands, each a small `Command`.

To add a subcommand, define `COMMAND = Command(...)` in your module and add one line to `COMMAND_TABLE`
("name": "module:attribute"). Modules are imported when the parser is built, so keep heavy imports inside
`run`. Errors a user can fix print as one line (`radixgen: error: ...`) and exit 1; `--debug` shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

from radixgen.runtime.errors import RadixgenError


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# Exceptions whose message alone is the report (bad input, missing files); others also name their type.
_USER_ERRORS = (RadixgenError, ValueError, FileNotFoundError)

# name -> "module:attribute" of a Command. One line per subcommand.
COMMAND_TABLE: dict[str, str] = {
    "generate": "radixgen.cli:GENERATE",
    "download": "radixgen.cli:DOWNLOAD",
    "serve": "radixgen.server.launch:SERVE",
    "run": "radixgen.program_command:RUN",
}


# ---------------------------------------------------------------------------------------------- generate
def _generate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--model", default=None, help="HF model folder or .gguf file (default: SmolLM2-135M-Instruct)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampler when temperature > 0")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")


def _run_generate(args: argparse.Namespace) -> int:
    from radixgen.runtime.engine import Engine

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    # The engine fetches the default model on first use (with a progress line) when --model is not given.
    with Engine(args.model, device=args.device, dtype=args.dtype, max_running_requests=4,
                cuda_graph=False) as engine:
        tokenizer = engine.tokenizer
        if args.chat:
            text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}],
                                                 add_generation_prompt=True)
            ids = tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = tokenizer.encode(args.prompt)
        params = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
        if args.temperature > 0:
            params["seed"] = args.seed
        for chunk in engine.generate(input_ids=ids, sampling_params=params, stream=True):
            sys.stdout.write(chunk["text"])
            sys.stdout.flush()
    sys.stdout.write("\n")
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
    parser = argparse.ArgumentParser(prog="radixgen", description="radixgen: structured LLM programs, fast.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, spec in (COMMAND_TABLE if table is None else table).items():
        command = _load_command(spec)
        p = sub.add_parser(name, help=command.help, description=command.help, parents=[common])
        command.add_arguments(p)
        p.set_defaults(_run=command.run)
    return parser


def main(argv: list[str] | None = None, table: dict[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after a bare `--` passes through untouched (e.g. to the script of `radixgen run`).
    cut = argv.index("--") if "--" in argv else len(argv)
    args = build_parser(table).parse_args(argv[:cut])
    args.passthrough = argv[cut + 1 :]
    try:
        return args._run(args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # one clear line unless --debug
        if args.debug:
            raise
        message = str(e) if isinstance(e, _USER_ERRORS) else f"{type(e).__name__}: {e} (--debug for details)"
        print(f"radixgen: error: {message}", file=sys.stderr)
        return 1
