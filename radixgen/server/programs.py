"""Registered programs: every `@function` of the files given to `--programs`, run on the server's engine.

A program file is the operator's code, imported once at startup; a request only names a registered program
and gives JSON argument values, which reach the function as plain values (nothing in a request is ever
executed). Programs run eagerly on worker threads through the in-process `EngineBackend` (radixgen.lang is
imported only when a program file is loaded).
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixgen.lang.engine_backend import EngineBackend

_module_ids = itertools.count()


@dataclass(frozen=True)
class ProgramParam:
    name: str
    required: bool
    default: Any = None
    annotation: str | None = None


@dataclass(frozen=True)
class Program:
    name: str
    function: Any  # radixgen.lang.SglFunction
    params: tuple[ProgramParam, ...]
    doc: str
    source: str

    def describe(self) -> dict:
        return {"name": self.name, "doc": self.doc, "source": self.source,
                "parameters": [{"name": p.name, "required": p.required, "default": p.default,
                                "annotation": p.annotation} for p in self.params]}


def _json_default(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None), list, dict)) else repr(value)


def _params(fn) -> tuple[ProgramParam, ...]:
    sig = inspect.signature(fn.func)
    out = []
    for name in fn.arg_names:
        if name in fn.bound:
            continue
        p = sig.parameters[name]
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        required = p.default is inspect.Parameter.empty
        annotation = None if p.annotation is inspect.Parameter.empty else (
            p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", repr(p.annotation)))
        out.append(ProgramParam(name, required, None if required else _json_default(p.default), annotation))
    return tuple(out)


def import_program_file(path: Path, module_name: str) -> ModuleType:
    """Run the file `path` as the module `module_name`, registered in sys.modules before it runs as an import
    would be: @dataclass (with `from __future__ import annotations`), typing.get_type_hints and pickle look a
    class's module up there, while the file runs and afterwards."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def load_program_file(path: str | Path) -> list[Program]:
    """Import `path` under a private module name and return its `@function` programs by attribute name."""
    from radixgen.lang import SglFunction

    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"--programs: no such file {path}")
    module = import_program_file(path, f"radixgen_programs_{path.stem}_{next(_module_ids)}")
    found = [Program(name, value, _params(value), (inspect.getdoc(value.func) or "").split("\n")[0], str(path))
             for name, value in vars(module).items() if isinstance(value, SglFunction) and not name.startswith("_")]
    if not found:
        raise ValueError(f"--programs: {path} defines no @function programs")
    return found


class ProgramRegistry:
    """Programs by name, and the engine backend plus worker threads they run on."""

    def __init__(self, programs: list[Program] | None = None, max_workers: int = 32) -> None:
        self.programs: dict[str, Program] = {}
        for program in programs or []:
            self.add(program)
        self.pool = ThreadPoolExecutor(max_workers, thread_name_prefix="rg-program")
        self._backend: EngineBackend | None = None

    @classmethod
    def from_files(cls, paths: list[str | Path]) -> ProgramRegistry:
        return cls([p for path in paths for p in load_program_file(path)])

    def add(self, program: Program) -> None:
        if program.name in self.programs:
            raise ValueError(f"--programs: program {program.name!r} is defined twice "
                             f"({self.programs[program.name].source} and {program.source})")
        self.programs[program.name] = program

    def names(self) -> list[str]:
        return sorted(self.programs)

    def get(self, name: str) -> Program | None:
        return self.programs.get(name)

    def backend(self, engine: Any) -> EngineBackend:
        if self._backend is None:
            from radixgen.lang.engine_backend import EngineBackend

            self._backend = EngineBackend(engine)
        return self._backend

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def run_options() -> tuple[str, ...]:
    """Names of the run-level sampling defaults a program run accepts (`fn.run(temperature=0, ...)`)."""
    from radixgen.lang.function import run_defaults

    return tuple(inspect.signature(run_defaults).parameters)


def state_result(name: str, state: Any) -> dict:
    """What a finished program run reports: variables, text, per-variable meta info, messages, error."""
    error = state.error()
    variables = state.variables()
    return {"name": name, "variables": variables, "text": state.text(),
            "meta_info": {var: state.get_meta_info(var) for var in variables},
            "messages": state.messages(), "return_value": _json_default(state.ret_value),
            "error": None if error is None else f"{type(error).__name__}: {error}"}
