"""`radixgen run PROGRAM.py`: run a program file on an in-process engine.

The file runs as `__main__` with the default backend already set to a fresh `Engine`, so a script that calls
`fn.run(...)` without `backend=` just works; arguments after `--` become its `sys.argv[1:]`. With `--function
NAME`, the file is imported as a module (registered in sys.modules, so its dataclasses resolve their annotations
when the function runs) and the named `@function` is run with `--arg key=value` arguments (values parsed as JSON
when they parse, else kept as strings); its variables are printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from pathlib import Path

from radixgen.cli import Command, add_engine_arguments, check_engine_arguments


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="a Python file of radixgen programs")
    add_engine_arguments(p)
    p.add_argument("--function", default=None, help="run this @function of the file and print its variables")
    p.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                   help="an argument of --function (repeatable; JSON values allowed)")


def _parse_args(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--arg expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _run(args: argparse.Namespace) -> int:
    from radixgen.lang.function import SglFunction, set_default_backend
    from radixgen.runtime.engine import Engine
    from radixgen.server.programs import import_program_file

    path = Path(args.program)
    if not path.is_file():
        raise FileNotFoundError(f"no such program file: {path}")
    kwargs = _parse_args(args.arg)
    check_engine_arguments(args)
    with Engine(args.model, tokenizer_path=args.tokenizer_path, device=args.device,
                cpu_threads=args.cpu_threads, grammar_backend=args.grammar_backend,
                quantization=args.quantization) as engine:
        set_default_backend(engine)
        if args.function is None:
            argv = sys.argv
            sys.argv = [str(path), *args.passthrough]  # what follows `--` on the command line
            try:
                runpy.run_path(str(path), run_name="__main__")
            finally:
                sys.argv = argv
            return 0
        namespace = vars(import_program_file(path.resolve(), f"radixgen_run_{path.stem}"))
        fn = namespace.get(args.function)
        if not isinstance(fn, SglFunction):
            found = sorted(k for k, v in namespace.items() if isinstance(v, SglFunction))
            raise ValueError(f"{path} has no @function named {args.function!r}; it has {found}")
        state = fn.run(**kwargs)
        if state.error() is not None:
            raise RuntimeError(f"{args.function} failed: {state.error()}")
        print(json.dumps(state.variables(), ensure_ascii=False, indent=2, default=str))
    return 0


RUN = Command("run", "run a program file on an in-process engine", _arguments, _run)
