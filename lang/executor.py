"""The eager interpreter of one program state: a queue of expressions drained in order by a worker thread.

`s += expr` only enqueues, so a program keeps running Python while its model calls are in flight, and the
branches of a fork (each with its own executor) submit their calls concurrently, which the engine batches.
Reading a value (`s["x"]`, `s.text()`) waits for the queue to drain. A failure stops the queue and is kept in
`error`; later submissions are dropped, and reads of missing variables re-raise it.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from radixgen.lang.backend import Backend, GenResult, ModelCallError, SelectResult
from radixgen.lang.beams import BeamGenSpec, beam_answers
from radixgen.lang.best_of import best_answers
from radixgen.lang.chat_template import RoleTemplate
from radixgen.lang.expr import (
    Expr,
    ExprList,
    Gen,
    RoleBegin,
    RoleEnd,
    Select,
    Text,
    VarScopeBegin,
    VarScopeEnd,
)
from radixgen.lang.spec import GenSpec, convert_dtype
from radixgen.lang.tools import tool_meta

_STAMPS = itertools.count()


class ProgramError(RuntimeError):
    """Raised when a program reads a value that its failed state never produced."""


@dataclass
class TextLog:
    """Append-only record of text pieces for streaming: (variable name or None, delta, the variable's meta info so
    far); a None delta marks the variable done."""

    pieces: list[tuple[str | None, str | None, dict[str, Any]]] = field(default_factory=list)
    finished: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition)

    def add(self, var: str | None, delta: str | None, meta: dict[str, Any] | None = None) -> None:
        with self.cond:
            self.pieces.append((var, delta, meta or {}))
            self.cond.notify_all()

    def finish(self) -> None:
        with self.cond:
            self.finished = True
            self.cond.notify_all()

    def follow(self, var: str | None, timeout: float | None = None) -> Iterator[str]:
        """Yield text deltas as they arrive: all text, or only those of variable `var` until it completes."""
        return (delta for delta, _ in self.follow_with_meta(var, timeout))

    def follow_with_meta(self, var: str | None, timeout: float | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """`follow`, each delta paired with the meta info its model call had reported by then."""
        cursor = 0
        while True:
            with self.cond:
                while cursor >= len(self.pieces) and not self.finished:
                    if not self.cond.wait(timeout):
                        raise TimeoutError("no streamed text within the timeout")
                if cursor >= len(self.pieces):
                    return
                name, delta, meta = self.pieces[cursor]
            cursor += 1
            if var is None:
                if delta:
                    yield delta, meta
            elif name == var:
                if delta is None:
                    return
                if delta:
                    yield delta, meta


class StreamExecutor:
    """Holds one state's text, variables, meta info and chat messages, and runs its queued expressions."""

    def __init__(self, backend: Backend, defaults: GenSpec | None = None, stream: bool = False) -> None:
        self.backend = backend
        self.defaults = defaults
        self.stream = stream
        self.text = ""
        self.variables: dict[str, Any] = {}
        self.var_versions: dict[str, int] = {}  # name -> assignment stamp; a fork's join gathers what changed
        self.meta_info: dict[str, dict[str, Any]] = {}
        self.messages: list[dict[str, str]] = []
        self.error: BaseException | None = None
        self.log = TextLog()
        self.turns = 0  # chat turns begun; the first one carries the template's preamble
        self.cached_len = 0  # length of a text prefix known to be in the engine's cache
        self._role_start = 0
        self._scope_starts: dict[str, int] = {}
        self._template: RoleTemplate | None = None
        self._queue: deque[Expr] = deque()
        self._lock = threading.Condition()
        self._busy = False

    # -- queue -----------------------------------------------------------------------------------------------
    def submit(self, expr: Expr) -> None:
        items = expr.items if isinstance(expr, ExprList) else (expr,)
        with self._lock:
            if self.error is not None:
                return
            self._queue.extend(items)
            if not self._busy:
                self._busy = True
                threading.Thread(target=self._drain, name="radixgen-state", daemon=True).start()

    def sync(self) -> None:
        """Wait until every submitted expression has run (or the state has failed)."""
        with self._lock:
            while self._busy:
                self._lock.wait()

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = exc
            self._queue.clear()

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._busy = False
                    self._lock.notify_all()
                    return
                item = self._queue.popleft()
            try:
                self.execute(item)
            except BaseException as exc:
                self.fail(exc)

    # -- interpretation --------------------------------------------------------------------------------------
    def _append(self, text: str, var: str | None = None, meta: dict[str, Any] | None = None) -> None:
        self.text += text
        self.log.add(var, text, meta)

    def execute(self, item: Expr) -> None:
        """Run one expression now, in the calling thread (the drain loop, or a compiled plan)."""
        if isinstance(item, Text):
            self._append(item.value)
        elif isinstance(item, Gen):
            self._gen(item)
        elif isinstance(item, Select):
            self._select(item)
        elif isinstance(item, RoleBegin):
            self._append(self.template().role_begin(item.role, self.turns == 0))
            self.turns += 1
            self._role_start = len(self.text)
        elif isinstance(item, RoleEnd):
            self.messages.append({"role": item.role, "content": self.text[self._role_start:]})
            self._append(self.template().role_end(item.role))
        elif isinstance(item, VarScopeBegin):
            self._scope_starts[item.name] = len(self.text)
        elif isinstance(item, VarScopeEnd):
            start = self._scope_starts.pop(item.name)
            self.set_var(item.name, self.text[start:])
        else:
            raise TypeError(f"cannot execute {type(item).__name__}")

    def set_var(self, name: str, value: Any) -> None:
        self.variables[name] = value
        self.var_versions[name] = next(_STAMPS)

    def template(self) -> RoleTemplate:
        if self._template is None:
            self._template = self.backend.role_template()
        return self._template

    def _gen(self, item: Gen) -> None:
        spec = item.spec.with_defaults(self.defaults)
        prompt = self.text
        if isinstance(spec, BeamGenSpec):
            self._gen_beams(item, prompt, spec)
        elif item.num_samples > 1:
            self._gen_n(item, prompt, spec)
        elif self.stream:
            text, meta = "", {}
            for delta in self.backend.stream(prompt, spec):
                if delta.finished or delta.meta_info:
                    meta = delta.meta_info
                if delta.text:
                    text += delta.text
                    self._append(delta.text, item.name, meta)
            self.record_gen(item, prompt, text, meta, appended=True)
        else:
            result = self.backend.generate(prompt, spec)
            self.record_gen(item, prompt, result.text, result.meta_info)

    def _gen_n(self, item: Gen, prompt: str, spec: GenSpec) -> None:
        """`gen(n=k)`: k samples after the same prompt in one batched call; the text continues with the first.
        With `best_of=b > k`: b samples (with logprobs), of which the k of highest cumulative logprob are kept."""
        picks_best = item.num_samples > item.n
        if picks_best:  # SamplingParams' rules for best_of (e.g. refused with greedy decoding)
            dataclasses.replace(spec.to_sampling_params(), n=item.n, best_of=item.best_of)
        sample_spec = dataclasses.replace(spec, return_logprob=True) if picks_best else spec
        results = self.backend.generate_batch([prompt] * item.num_samples, [sample_spec] * item.num_samples)
        for result in results:
            if isinstance(result, Exception):
                raise result
        answers = [r for r in results if isinstance(r, GenResult)]
        if picks_best:
            answers = best_answers(answers, item.n, keep_logprobs=bool(spec.return_logprob))
        self._record_answers(item, prompt, answers)

    def _gen_beams(self, item: Gen, prompt: str, spec: BeamGenSpec) -> None:
        """`gen(num_beams=k)`: one model call whose returned beams, best first, are the answers. Never streamed
        (the best beams are known only at the end) and without token logprobs (each beam's meta info has its
        `beam_score` and `cumulative_logprob`), whatever the run's defaults ask."""
        spec = dataclasses.replace(spec, return_logprob=False, top_logprobs_num=None)
        spec.to_sampling_params()  # SamplingParams' rules with the run's defaults filled in, for every backend
        results = self.backend.generate_batch([prompt], [spec])
        self._record_answers(item, prompt, beam_answers(results, spec.num_return_sequences))

    def _record_answers(self, item: Gen, prompt: str, answers: list[GenResult]) -> None:
        """Record a gen's answers, best first: the text continues with the first; with n > 1 the variable holds
        them all (`n_meta_info`: each one's meta info)."""
        self.record_gen(item, prompt, answers[0].text, answers[0].meta_info)
        if item.n > 1 and item.name is not None:
            self.set_var(item.name, [convert_dtype(r.text, item.dtype) for r in answers])
            self.meta_info[item.name] = {**answers[0].meta_info, "n_meta_info": [r.meta_info for r in answers]}

    def record_gen(self, item: Gen, prompt: str, text: str, meta: dict[str, Any], appended: bool = False) -> None:
        """Apply a finished generation for `item` (called here, or by a compiled plan that batched the call)."""
        if not appended:
            self._append(text, item.name, meta)
        self.cached_len = len(prompt)
        _raise_if_aborted(meta)
        if item.name is not None:
            self.set_var(item.name, convert_dtype(text, item.dtype))
            self.meta_info[item.name] = meta if item.tools is None else {**meta, **tool_meta(text, item.tools)}
            self.log.add(item.name, None)

    def _select(self, item: Select) -> None:
        prompt = self.text
        self.record_select(item, prompt, self.backend.select(prompt, item.choices, item.method, item.temperature))

    def record_select(self, item: Select, prompt: str, result: SelectResult) -> None:
        self.cached_len = len(prompt)
        self._append(result.choice, item.name, result.meta_info)
        if item.name is not None:
            self.set_var(item.name, result.choice)
            self.meta_info[item.name] = result.meta_info
            self.log.add(item.name, None)


def _raise_if_aborted(meta: dict[str, Any]) -> None:
    reason = meta.get("finish_reason") or {}
    if isinstance(reason, dict) and reason.get("type") == "abort":
        raise ModelCallError(f"model call aborted: {reason.get('message', 'no message')}")
