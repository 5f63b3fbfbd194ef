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
    "generate": "radixgen.runtime.cli:GENERATE",
    "download": "radixgen.runtime.cli:DOWNLOAD",
    "serve": "radixgen.runtime.server.launch:SERVE",
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


class TextStream:
    """Turns a growing list of token ids into text deltas, holding back an incomplete UTF-8 character."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # a multi-byte character not complete yet
            return ""
        delta, self.emitted = text[self.emitted:], len(text)
        return delta


def _run_generate(args: argparse.Namespace) -> int:
    from radixgen.runtime.engine_config import EngineConfig
    from radixgen.runtime.model_runner import ModelRunner, resolve_model_path
    from radixgen.runtime.simple_generate import generate_ids
    from radixgen.runtime.tokenizer import Tokenizer

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    config = EngineConfig(model_path=args.model, device=args.device, dtype=args.dtype, max_running_requests=1)
    model_path = resolve_model_path(config)  # downloads the default model on first use
    tokenizer = Tokenizer.from_file(model_path)
    text = args.prompt
    if args.chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    prompt_ids = tokenizer.encode(text, add_special_tokens=not args.chat)
    config.model_path = str(model_path)
    config.max_total_tokens = len(prompt_ids) + args.max_new_tokens
    runner = ModelRunner(config)
    stop_ids = set(runner.model_config.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        stop_ids.add(tokenizer.eos_token_id)
    stream = TextStream(tokenizer)
    for token in generate_ids(runner, prompt_ids, args.max_new_tokens, args.temperature, args.seed, stop_ids):
        if token in stop_ids:
            break
        sys.stdout.write(stream.push(token))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixgen", description="radixgen: structured LLM programs, fast.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, spec in COMMAND_TABLE.items():
        command = _load_command(spec)
        p = sub.add_parser(name, help=command.help, description=command.help, parents=[common])
        command.add_arguments(p)
        p.set_defaults(_run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
