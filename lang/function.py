"""`@function`: a Python function whose first parameter is the program state, runnable, batchable, traceable.

`fn.run(**kwargs)` runs one program eagerly; `fn.run_batch([...])` many at once; `fn.trace()` records its IR
graph; `fn.compile()` turns that graph into a plan (see compiler.py). Calling a program from inside another
(`other(s, x=1)`) runs its body on the same state.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, overload

from radixgen.lang.backend import Backend
from radixgen.lang.runner import run_many, run_program
from radixgen.lang.spec import GenSpec, stop_strings, token_ids
from radixgen.lang.state import ProgramState

if TYPE_CHECKING:
    from radixgen.lang.compiler import CompiledFunction
    from radixgen.lang.ir import Graph

_default_backend: Backend | None = None


def as_backend(backend: Any) -> Backend:
    """Accept a `Backend`, or a `radixgen.Engine` (wrapped in an `EngineBackend`)."""
    if isinstance(backend, Backend):
        return backend
    if hasattr(backend, "generate") and hasattr(backend, "tokenizer"):
        from radixgen.lang.engine_backend import EngineBackend

        return EngineBackend(backend)
    raise TypeError(f"expected a radixgen backend or Engine, got {type(backend).__name__}")


def set_default_backend(backend: Any | None) -> None:
    """The backend programs use when `run` is not given one (None clears it)."""
    global _default_backend
    _default_backend = None if backend is None else as_backend(backend)


def get_default_backend() -> Backend | None:
    return _default_backend


def resolve_backend(backend: Any | None) -> Backend:
    if backend is not None:
        return as_backend(backend)
    if _default_backend is None:
        raise RuntimeError(
            "no backend: call radixgen.set_default_backend(radixgen.Engine(...)) or pass backend= to run()"
        )
    return _default_backend


def run_defaults(
    max_new_tokens: int | None = 128,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    top_logprobs_num: int | None = None,
) -> GenSpec:
    """Run-level sampling defaults; every `gen` inherits those it does not set itself."""
    return GenSpec(
        max_new_tokens=max_new_tokens, stop=stop_strings(stop), stop_token_ids=token_ids(stop_token_ids),
        temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty, ignore_eos=ignore_eos, return_logprob=return_logprob,
        top_logprobs_num=top_logprobs_num,
    )


_RUN_OPTIONS = tuple(inspect.signature(run_defaults).parameters)


class SglFunction:
    """A decorated program. Keyword arguments of `run` that name sampling options are run-level defaults."""

    def __init__(self, func: Callable[..., Any], bound: dict[str, Any] | None = None) -> None:
        params = list(inspect.signature(func).parameters)
        if not params:
            raise TypeError(f"@function {func.__name__} must take the program state as its first parameter")
        self.func = func
        self.bound = dict(bound or {})
        self.arg_names = params[1:]
        functools.update_wrapper(self, func)

    def _kwargs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if len(args) > len(self.arg_names):
            raise TypeError(f"{self.func.__name__} takes {len(self.arg_names)} program arguments, got {len(args)}")
        merged = {**self.bound, **dict(zip(self.arg_names, args)), **kwargs}
        return merged

    def _split_options(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], GenSpec]:
        """Separate run-level sampling options from program arguments (a program argument wins a name clash)."""
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in _RUN_OPTIONS and k not in self.arg_names}
        return kwargs, run_defaults(**options)

    def bind(self, **kwargs: Any) -> SglFunction:
        """A copy with some arguments fixed."""
        unknown = set(kwargs) - set(self.arg_names)
        if unknown:
            raise TypeError(f"{self.func.__name__} has no argument(s) {sorted(unknown)}")
        return SglFunction(self.func, {**self.bound, **kwargs})

    @overload  # a list of argument dicts is a batch (`__batch`: positional only); any other call is one run
    def run(self, __batch: list[dict[str, Any]], *, backend: Any | None = None, **options: Any
            ) -> list[ProgramState]: ...

    @overload
    def run(self, *args: Any, backend: Any | None = None, stream: bool = False, **kwargs: Any) -> ProgramState: ...

    def run(self, *args: Any, backend: Any | None = None, stream: bool = False,
            **kwargs: Any) -> ProgramState | list[ProgramState]:
        """Run one program; errors are kept in the returned state (`state.error()`). Given one list of argument
        dicts instead (SGLang's sglang#6122 idiom), it is `run_batch` on that list and returns its list."""
        if self._is_batch(args) and not stream:
            return self.run_batch(args[0], backend=backend, **kwargs)
        kwargs, defaults = self._split_options(kwargs)
        return run_program(self.func, resolve_backend(backend), defaults, self._kwargs(args, kwargs), stream)

    def _is_batch(self, args: tuple[Any, ...]) -> bool:
        """One positional list of dicts whose keys are all argument names: a batch, not a program argument."""
        if len(args) != 1 or not isinstance(args[0], list) or not args[0]:
            return False
        names = set(self.arg_names)
        return all(isinstance(kw, dict) and set(kw) <= names for kw in args[0])

    def run_batch(
        self,
        batch_kwargs: Sequence[dict[str, Any]],
        *,
        backend: Any | None = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        **options: Any,
    ) -> list[ProgramState]:
        """Run one program per dict of arguments, concurrently; one failure does not stop the others."""
        _, defaults = self._split_options(dict(options))
        unknown = set(options) - set(_RUN_OPTIONS)
        if unknown:
            raise TypeError(f"run_batch got unknown option(s) {sorted(unknown)}; known: {list(_RUN_OPTIONS)}")
        batch = [self._kwargs((), dict(kw)) for kw in batch_kwargs]
        return run_many(self.func, resolve_backend(backend), defaults, batch, num_threads, progress_bar)

    def trace(self, **kwargs: Any) -> Graph:
        """Record the program's IR graph; arguments not given become placeholders."""
        from radixgen.lang.tracer import trace

        return trace(self, {**self.bound, **kwargs})

    def compile(self, backend: Any | None = None) -> CompiledFunction:
        """A plan that prefills the shared constant prefix once and batches independent calls (compiler.py)."""
        from radixgen.lang.compiler import CompiledFunction

        return CompiledFunction(self, backend)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Inside a program, `other(s, ...)` runs `other`'s body on state `s`; outside, it is `run`."""
        if args and isinstance(args[0], ProgramState):
            state, rest = args[0], args[1:]
            call = getattr(state, "call_program", None)
            if call is not None:  # a tracing state records the call as a node
                return call(self, self._kwargs(rest, kwargs))
            return self.func(state, **self._kwargs(rest, kwargs))
        return self.run(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<radixgen function {self.func.__name__}({', '.join(self.arg_names)})>"


def function(func: Callable[..., Any] | None = None, **_options: Any) -> Any:
    """Decorator: `@function` or `@function()` turns `def prog(s, ...)` into a runnable program."""
    if func is None:
        return lambda f: SglFunction(f)
    return SglFunction(func)
