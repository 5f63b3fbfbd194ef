"""Running programs eagerly: one program per thread, its errors kept in its own state.

`run_program` is the eager interpreter's entry point; `run_many` drives a batch through a thread pool (with a
tqdm bar on request) so that every program's calls reach the engine concurrently and get batched there.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixgen.lang.backend import Backend
from radixgen.lang.executor import StreamExecutor
from radixgen.lang.spec import GenSpec
from radixgen.lang.state import ProgramState

log = logging.getLogger("radixgen.lang")

DEFAULT_MAX_THREADS = 128


def run_program(
    func: Callable[..., Any], backend: Backend, defaults: GenSpec, kwargs: dict[str, Any], stream: bool = False
) -> ProgramState:
    """Run `func(s, **kwargs)`; with `stream` it runs in a background thread and the state is returned at once."""
    ex = StreamExecutor(backend, defaults, stream)
    state = ProgramState(ex)

    def body() -> None:
        try:
            state.ret_value = func(state, **kwargs)
            ex.sync()
        except Exception as exc:
            ex.fail(exc)
            ex.sync()
            log.warning("program %s failed: %r", getattr(func, "__name__", func), exc)
        finally:
            ex.log.finish()

    if stream:
        threading.Thread(target=body, name="radixgen-program", daemon=True).start()
    else:
        body()
    return state


def resolve_threads(num_threads: int | str, n: int) -> int:
    if num_threads == "auto":
        return max(1, min(n, DEFAULT_MAX_THREADS, 16 * (os.cpu_count() or 1)))
    if not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive int or 'auto', got {num_threads!r}")
    return min(num_threads, max(1, n))


def run_many(
    func: Callable[..., Any],
    backend: Backend,
    defaults: GenSpec,
    batch_kwargs: Sequence[dict[str, Any]],
    num_threads: int | str = "auto",
    progress_bar: bool = False,
) -> list[ProgramState]:
    """Run one program per kwargs dict, concurrently; states come back in input order, failed ones included."""
    for i, kw in enumerate(batch_kwargs):
        if not isinstance(kw, dict):
            raise TypeError(f"run_batch takes a list of dicts of arguments; item {i} is {type(kw).__name__}")
    bar = None
    if progress_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(batch_kwargs), desc=getattr(func, "__name__", "programs"))

    def one(kw: dict[str, Any]) -> ProgramState:
        state = run_program(func, backend, defaults, kw)
        if bar is not None:
            bar.update(1)
        return state

    try:
        with ThreadPoolExecutor(max_workers=resolve_threads(num_threads, len(batch_kwargs))) as pool:
            return list(pool.map(one, batch_kwargs))
    finally:
        if bar is not None:
            bar.close()
