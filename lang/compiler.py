"""`fn.compile()`: run a batch of programs from their traced graph, wave by wave, instead of thread by thread.

The plan (1) prefills the program's constant prefix once before the batch; (2) for a static graph, advances
every program of the batch through its non-model nodes, then submits all model calls that are ready (every
program, every fork branch) in one backend call, so they enter the engine together and share its steps; a fork
prefills its branches' shared prefix in the same call that runs the other programs' ready gens. Programs whose
trace is dynamic (Python branches on generated values) run eagerly after the prefix prefill.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixgen.lang.backend import Backend, GenResult, SelectRequest
from radixgen.lang.executor import StreamExecutor
from radixgen.lang.expr import Gen, Select, Text
from radixgen.lang.ir import Graph, Node
from radixgen.lang.runner import run_many
from radixgen.lang.spec import GenSpec
from radixgen.lang.state import ForkGroup, ProgramState

if TYPE_CHECKING:
    from radixgen.lang.function import SglFunction

_PREFILL_ONLY = GenSpec(max_new_tokens=0)


@dataclass
class PlanStats:
    """What the last batch cost on the backend side."""

    waves: int = 0
    backend_calls: int = 0
    gens: int = 0
    selects: int = 0
    prefix_prefills: int = 0


@dataclass
class _Program:
    kwargs: dict[str, Any]
    streams: dict[int, StreamExecutor] = field(default_factory=dict)
    cursor: dict[int, int] = field(default_factory=dict)
    active: list[int] = field(default_factory=list)  # streams being advanced
    opened: list[int] = field(default_factory=list)  # fork branches that start after this wave's prefills
    waiting: set[int] = field(default_factory=set)  # streams whose model call is queued in this wave
    failed: bool = False

    @property
    def root(self) -> StreamExecutor:
        return self.streams[0]

    @property
    def done(self) -> bool:
        return self.failed or not (self.active or self.opened)


class CompiledFunction:
    """A compiled program: `run(**kwargs)` and `run_batch([...])` like the function it came from."""

    def __init__(self, fn: SglFunction, backend: Any | None = None) -> None:
        self.fn = fn
        self.graph: Graph = fn.trace()
        self.backend = backend
        self.stats = PlanStats()
        self._nodes = {s: self.graph.stream_nodes(s) for s in {n.stream for n in self.graph.nodes} | {0}}
        self._branches: dict[int, list[int]] = {}
        for stream, fork_node in self.graph.stream_parent.items():
            self._branches.setdefault(fork_node, []).append(stream)

    def __str__(self) -> str:
        mode = "graph plan" if self.graph.static else f"eager (trace is dynamic: {self.graph.dynamic})"
        prefix = len(self.graph.constant_prefix())
        return f"compiled {self.graph.name}: {mode}; constant prefix of {prefix} node(s)\n{self.graph}"

    def run(self, backend: Any | None = None, **kwargs: Any) -> ProgramState:
        """Run once: keyword arguments are the program's, except run options (temperature, ...) it lacks."""
        from radixgen.lang.function import _RUN_OPTIONS

        options = {k: kwargs.pop(k) for k in list(kwargs) if k in _RUN_OPTIONS and k not in self.fn.arg_names}
        return self.run_batch([kwargs], backend=backend, **options)[0]

    def run_batch(self, batch_kwargs: Sequence[dict[str, Any]], *, backend: Any | None = None,
                  num_threads: int | str = "auto", progress_bar: bool = False, **options: Any) -> list[ProgramState]:
        from radixgen.lang.function import resolve_backend

        be = resolve_backend(backend if backend is not None else self.backend)
        _, defaults = self.fn._split_options(dict(options))
        batch = [self.fn._kwargs((), dict(kw)) for kw in batch_kwargs]
        self.stats = PlanStats()
        self._prefill_constant_prefix(be)
        if not self.graph.static:
            return run_many(self.fn.func, be, defaults, batch, num_threads, progress_bar)
        return self._run_graph(be, defaults, batch, progress_bar)

    def _prefill_constant_prefix(self, backend: Backend) -> None:
        exprs = self.graph.constant_prefix()
        if not exprs:
            return
        ex = StreamExecutor(backend)
        for expr in exprs:
            ex.execute(expr)
        if ex.text:
            backend.cache_prefix(ex.text)
            self.stats.prefix_prefills += 1
            self.stats.backend_calls += 1

    # -- the wave loop ---------------------------------------------------------------------------------------
    def _run_graph(self, backend: Backend, defaults: GenSpec, batch: list[dict[str, Any]],
                   progress_bar: bool = False) -> list[ProgramState]:
        bar = None
        if progress_bar:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(batch), desc=self.graph.name)
        programs = []
        for kw in batch:
            prog = _Program(kw)
            prog.streams[0] = StreamExecutor(backend, defaults)
            prog.cursor[0] = 0
            prog.active = [0]
            programs.append(prog)
        with ThreadPoolExecutor(max_workers=8) as pool:
            while True:
                gens: list[tuple[_Program, int, Node]] = []
                selects: list[tuple[_Program, int, Node]] = []
                prefills: list[str] = []
                moved = True
                while moved:  # until every stream waits on a model call or a join (advance every program)
                    moved = False
                    for prog in programs:
                        moved |= self._advance(prog, gens, selects, prefills)
                if gens or selects or prefills:
                    self.stats.waves += 1
                    self._submit(backend, pool, gens, selects, prefills)
                opened = False
                for prog in programs:
                    prog.waiting.clear()
                    opened |= bool(prog.opened)
                    prog.active.extend(prog.opened)
                    prog.opened.clear()
                if bar is not None:
                    bar.update(sum(p.done for p in programs) - bar.n)
                if not (gens or selects or prefills or opened):
                    break
        if bar is not None:
            bar.close()
        states = []
        for prog in programs:
            prog.root.log.finish()
            states.append(ProgramState(prog.root))
        return states

    def _advance(self, prog: _Program, gens: list, selects: list, prefills: list[str]) -> bool:
        """Run `prog`'s streams up to their next model call (queued in `gens`/`selects`) or unfinished join.

        New fork branches wait in `prog.opened` until the current wave is submitted (it prefills their prefix).
        Returns whether anything moved.
        """
        if prog.failed:
            return False
        moved = False
        for sid in list(prog.active):
            if sid in prog.waiting:
                continue
            ex, nodes = prog.streams[sid], self._nodes[sid]
            try:
                while prog.cursor[sid] < len(nodes):
                    node = nodes[prog.cursor[sid]]
                    if node.kind in ("gen", "select"):
                        (gens if node.kind == "gen" else selects).append((prog, sid, node))
                        prog.waiting.add(sid)
                        break
                    if node.kind == "join" and not self._join(prog, node):
                        break
                    if node.kind == "fork":
                        prog.opened += self._fork(prog, ex, node, prefills)
                    elif node.kind != "join":
                        self._execute(prog, ex, node)
                    prog.cursor[sid] += 1
                    moved = True
                else:
                    prog.active.remove(sid)
            except Exception as exc:
                self._fail(prog, exc)
                return False
        return moved

    def _execute(self, prog: _Program, ex: StreamExecutor, node: Node) -> None:
        if node.kind == "arg":
            ex.execute(Text(str(prog.kwargs[node.attrs["name"]])))
        elif node.kind == "var":
            ex.execute(Text(str(prog.streams[node.attrs["stream"]].variables[node.attrs["name"]])))
        elif node.kind == "set_var":
            ex.set_var(node.attrs["name"], node.attrs["value"])
        elif node.expr is not None:
            ex.execute(node.expr)

    def _fork(self, prog: _Program, ex: StreamExecutor, node: Node, prefills: list[str]) -> list[int]:
        parent = ProgramState(ex)
        streams = self._branches.get(node.id, [])
        for sid in streams:
            prog.streams[sid] = parent._copy()._ex
            prog.cursor[sid] = 0
        if len(streams) > 1 and ex.text and ex.cached_len < len(ex.text):
            prefills.append(ex.text)
            ex.cached_len = len(ex.text)
        return streams

    def _join(self, prog: _Program, node: Node) -> bool:
        streams = node.attrs["streams"]
        if any(prog.cursor[s] < len(self._nodes[s]) for s in streams):
            return False
        parent = ProgramState(prog.streams[node.stream])
        ForkGroup(parent, [ProgramState(prog.streams[s]) for s in streams]).join(node.attrs["mode"])
        parent.sync()
        return True

    def _fail(self, prog: _Program, exc: BaseException) -> None:
        prog.failed = True
        prog.root.fail(exc)

    def _submit(self, backend: Backend, pool: ThreadPoolExecutor, gens: list, selects: list,
                prefills: list[str]) -> None:
        """One backend call for every ready gen plus the fork prefills, and one for every ready select, at once."""
        prompts = [prog.streams[sid].text for prog, sid, _ in gens] + prefills
        specs = [node.expr.spec.with_defaults(prog.streams[sid].defaults) for prog, sid, node in gens]
        specs += [_PREFILL_ONLY] * len(prefills)
        requests = [SelectRequest(prog.streams[sid].text, node.expr.choices, node.expr.method, node.expr.temperature)
                    for prog, sid, node in selects]
        scored = pool.submit(backend.select_batch, requests) if requests else None
        results: list[GenResult | Exception] = backend.generate_batch(prompts, specs) if prompts else []
        self.stats.backend_calls += (1 if prompts else 0) + (1 if requests else 0)
        self.stats.gens += len(gens)
        self.stats.selects += len(selects)
        self.stats.prefix_prefills += len(prefills)
        for (prog, sid, node), result in zip(gens, results):
            self._apply(prog, sid, node, result)
        if scored is not None:
            try:
                choices: list[Any] = scored.result()
            except Exception as exc:
                choices = [exc] * len(selects)
            for (prog, sid, node), result in zip(selects, choices):
                self._apply(prog, sid, node, result)

    def _apply(self, prog: _Program, sid: int, node: Node, result: Any) -> None:
        if prog.failed:
            return
        ex = prog.streams[sid]
        try:
            if isinstance(result, Exception):
                raise result
            if isinstance(node.expr, Gen):
                ex.record_gen(node.expr, ex.text, result.text, result.meta_info)
            elif isinstance(node.expr, Select):
                ex.record_select(node.expr, ex.text, result)
            prog.cursor[sid] += 1
        except Exception as exc:
            self._fail(prog, exc)
