"""`radixgen.Engine`: the offline API (shaped like SGLang's) over the engine loop thread.

The calling thread does everything that can be slow and is per request — tokenization, validation, grammar
compilation (cached by source) — so the loop thread never waits on it; then it submits the request and reads
its output chunks from a queue. See docs/engine_api.md for the contract.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import itertools
import logging
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from radixgen.grammars.reasoning import THINK_CLOSE
from radixgen.runtime.best_of import (
    SampleGroup,
    beam_results,
    cumulative_logprob,
    ranked_meta,
    returned_samples,
    sample_groups,
)
from radixgen.runtime.cpu_threads import apply_cpu_threads
from radixgen.runtime.engine_config import EngineConfig
from radixgen.runtime.output_sink import AsyncSink, SyncSink
from radixgen.runtime.outputs import MetaInfo
from radixgen.runtime.request import Req
from radixgen.runtime.sampling_params import SamplingParams
from radixgen.runtime.step_trace import StepRecord
from radixgen.runtime.tokenizer_fit import check_tokenizer_fits

if TYPE_CHECKING:
    from radixgen.grammars.backend import CompiledGrammar

# One prompt's sampling options: a SamplingParams, or its SGLang-shaped dict (None: every default).
SamplingParamsArg = SamplingParams | dict[str, Any] | None

log = logging.getLogger("radixgen.engine")


def load_tokenizer(path):
    """The tokenizer of a model folder or GGUF file."""
    from radixgen.tokenizer import Tokenizer

    if path is None:
        raise ValueError("a dummy model without a model folder needs tokenizer_path=")
    return Tokenizer.from_file(str(path))


def _on_own_thread(fn: Callable[[], None]) -> None:
    """Run fn on a short-lived thread, re-raising what it raises.

    Building the model and its buffers runs torch ops large enough to go parallel, and under OpenMP (libgomp) a
    thread that runs a parallel region keeps a team of worker threads for good. Built on the caller's thread,
    that team would coexist with the loop thread's: more OpenMP threads than cores makes libgomp stop
    spin-waiting between parallel regions, so each of the loop's (dozens per decode step) pays a sleeping
    worker's wake-up (docs/performance-notes.md). A short-lived thread's team ends with it. The effect is the CPU
    forward's (its dozens of parallel regions per step), so only a CPU engine builds this way; a CUDA engine
    builds on the caller's thread."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name="radixgen-build")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


class Finished(NamedTuple):
    """A request's whole output, as its last chunk left it."""

    text: str
    output_ids: list[int]
    meta: MetaInfo


def _returned(finished: Sequence[Finished], groups: Sequence[SampleGroup], keep_logprobs: bool) -> list[dict]:
    """The caller's results: every sample, or of a best_of prompt its n best (reporting cumulative_logprob)."""
    cumulative = [cumulative_logprob(f.meta.output_token_logprobs) for f in finished]
    results: list[dict] = []
    for i, ranked in returned_samples(groups, cumulative):
        text, ids, meta = finished[i]
        if meta.finished_beams:  # a beam search: each returned beam is a result, best first
            results.extend({"text": t, "output_ids": i, "meta_info": m} for t, i, m in beam_results(meta.to_dict()))
            continue
        meta = ranked_meta(meta, keep_logprobs) if ranked else meta
        results.append({"text": text, "output_ids": ids, "meta_info": meta.to_dict()})
    return results


def _check_streamable(reqs: Sequence[Req], groups: Sequence[SampleGroup]) -> None:
    if any(r.params.is_beam_search for r in reqs):
        raise ValueError("stream=True is not supported with beam search: the best beams are known only at the end")
    if any(g.picks_best for g in groups):
        raise ValueError("stream=True needs best_of == n: the best samples are known only once all have finished")
    if len(reqs) != 1:
        raise ValueError("stream=True takes a single prompt with n=1")


def _shutdown_at_exit(engine: weakref.ref[Engine]) -> None:
    """The atexit hook of a live engine (held weakly, so the hook never keeps an engine alive)."""
    alive = engine()
    if alive is not None:
        alive.shutdown()


class Engine:
    """An in-process engine. `Engine(model_path=None, **options)`; options are EngineConfig's fields."""

    def __init__(self, model_path: str | None = None, **options: Any) -> None:
        from radixgen.grammars.backend import grammar_backend_factory
        from radixgen.runtime.engine_core import EngineCore
        from radixgen.runtime.model_runner import ModelRunner, resolve_device_dtype

        self.config = EngineConfig.from_options(model_path, **options)
        logging.getLogger("radixgen").setLevel(self.config.log_level.upper())
        # A grammar backend whose package is missing is refused here, before the model loads.
        make_grammar_backend = grammar_backend_factory(self.config.grammar_backend)

        def build() -> None:
            self.runner = ModelRunner(self.config)
            self.model_config = self.runner.model_config
            self.tokenizer = load_tokenizer(self.config.tokenizer_path or self.runner.model_path)
            check_tokenizer_fits(self.model_config.vocab_size, self.tokenizer.vocab_size, self.config.load_format)
            self.vocab = self._build_vocabulary()
            self.grammar_backend = make_grammar_backend(
                self.vocab, functools.partial(self.tokenizer.encode, add_special_tokens=False))
            self.core = EngineCore(self.config, self.runner, self.tokenizer, self.vocab)

        device, _ = resolve_device_dtype(self.config.device, self.config.dtype)
        if device.type == "cpu":
            apply_cpu_threads(self.config.cpu_threads)
            _on_own_thread(build)
        else:
            build()
        self._compile_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="radixgen-compile")
        self._ids = itertools.count()
        self._closed = False
        self.core.start()
        # Stop and join the loop thread before the interpreter finalizes: a daemon thread still inside torch
        # when it does aborts the process in native code ("terminate called without an active exception").
        self._at_exit = functools.partial(_shutdown_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)

    # ----------------------------------------------------------- properties
    @property
    def context_length(self) -> int:
        return self.core.max_context

    def _build_vocabulary(self):
        from radixgen.runtime.constraints import build_vocabulary, grammar_disk_cache

        cache = grammar_disk_cache(self.config.disable_grammar_disk_cache)
        return build_vocabulary(self.tokenizer, grammar_cache=cache)

    # -------------------------------------------------------------- building
    def _prepare(self, prompt: Any, input_ids: Any,
                 sampling_params: SamplingParamsArg | list[SamplingParamsArg] | tuple[SamplingParamsArg, ...],
                 return_logprob: bool, top_logprobs_num: int, logprob_start_len: int | None, rid: Any,
                 cache_namespace: Any = None) -> tuple[list[Req], list[SampleGroup], bool]:
        """Validate everything and build the Req objects (`num_samples` per prompt: n, or best_of), with each
        prompt's group of them. Raises ValueError on bad input."""
        if (prompt is None) == (input_ids is None):
            raise ValueError("give exactly one of `prompt` (text) or `input_ids`")
        if prompt is not None:
            batched = isinstance(prompt, (list, tuple))
            texts = list(prompt) if batched else [prompt]
            for t in texts:
                if not isinstance(t, str):
                    raise ValueError(f"prompt must be a string or a list of strings, got {type(t).__name__}")
            id_lists = [self.tokenizer.encode(t) for t in texts]
        else:
            batched = len(input_ids) > 0 and isinstance(input_ids[0], (list, tuple, np.ndarray))
            id_lists = [list(x) for x in input_ids] if batched else [list(input_ids)]
        n_prompts = len(id_lists)
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != n_prompts:
                raise ValueError(f"sampling_params: got {len(sampling_params)} for {n_prompts} prompts")
            params_list = [SamplingParams.from_dict(p) for p in sampling_params]
        else:
            params_list = [SamplingParams.from_dict(sampling_params)] * n_prompts
        if not isinstance(top_logprobs_num, int) or top_logprobs_num < 0:
            raise ValueError(f"top_logprobs_num must be a non-negative int, got {top_logprobs_num!r}")
        vocab_size = self.model_config.vocab_size
        reqs: list[Req] = []
        for ids, params in zip(id_lists, params_list):
            params.validate(vocab_size)
            if params.search_width > self.config.max_running_requests:
                name = "num_beams" if params.is_beam_search else "top_k"
                raise ValueError(f"{name} ({params.search_width}) exceeds max_running_requests "
                                 f"({self.config.max_running_requests}): each beam or candidate runs as a request")
            if params.is_beam_search and (return_logprob or top_logprobs_num or logprob_start_len is not None):
                raise ValueError("return_logprob is not supported with beam search: each beam reports its "
                                 "cumulative_logprob and beam_score instead of token logprobs")
            arr = np.asarray(ids, dtype=np.int64)
            if arr.ndim != 1 or len(arr) == 0:
                raise ValueError("a prompt must have at least one token")
            if int(arr.min()) < 0 or int(arr.max()) >= vocab_size:
                raise ValueError(f"input_ids: token ids must be in [0, {vocab_size})")
            if len(arr) >= self.context_length:
                raise ValueError(f"the prompt has {len(arr)} tokens; the context length is {self.context_length} "
                                 f"(at least one token must remain for the output)")
            if logprob_start_len is not None and not 0 <= logprob_start_len <= len(arr):
                raise ValueError(f"logprob_start_len must be in [0, {len(arr)}], got {logprob_start_len}")
            grammar = self._compile(params)
            wants_logprob = return_logprob or params.picks_best  # best_of ranks samples by their logprobs
            for sub in params.expand_n():
                req = self._make_req(arr, sub, grammar, wants_logprob, top_logprobs_num, logprob_start_len, rid)
                if sub.is_contrastive and req.logprob_start_len is None:
                    req.logprob_start_len = 0  # every prompt position's hidden state: none is served from the cache
                req.namespace = cache_namespace
                reqs.append(req)
        first = params_list[0]
        several = first.beams_returned > 1 if first.is_beam_search else first.n > 1
        return reqs, sample_groups(params_list), batched or several

    def _compile(self, params: SamplingParams) -> CompiledGrammar | None:
        constraint = params.constraint
        if constraint is None:
            return None
        from radixgen.runtime.constraints import compile_request_constraint

        return compile_request_constraint(constraint, self.grammar_backend)

    def _make_req(self, ids: np.ndarray, params: SamplingParams, grammar: CompiledGrammar | None,
                  return_logprob: bool, top_logprobs_num: int, logprob_start_len: int | None, rid: Any) -> Req:
        from radixgen.runtime.stop_checker import StopChecker

        rid = str(rid) if rid is not None and not isinstance(rid, (list, tuple)) else uuid.uuid4().hex
        req = Req(rid=f"{rid}-{next(self._ids)}", origin_ids=ids, params=params,
                  return_logprob=bool(return_logprob) or logprob_start_len is not None,
                  top_logprobs_num=top_logprobs_num, logprob_start_len=logprob_start_len)
        if grammar is not None:
            req.grammar = grammar
            req.matcher = grammar.matcher()
        if params.thinking_budget is not None:
            req.thinking_close_ids = self.tokenizer.encode(THINK_CLOSE, add_special_tokens=False)
        req.detok = self.tokenizer.incremental_detokenizer(skip_special_tokens=params.skip_special_tokens)
        req.stop_checker = StopChecker(params, eos_token_ids=self.tokenizer.eos_token_ids)
        return req

    # ------------------------------------------------------------- generate
    def generate(self, prompt: str | list[str] | None = None,
                 sampling_params: SamplingParamsArg | list[SamplingParamsArg] = None,
                 input_ids: list | None = None, return_logprob: bool = False, top_logprobs_num: int = 0,
                 logprob_start_len: int | None = None, stream: bool = False, rid: Any = None,
                 cache_namespace: Any = None) -> dict | list[dict] | Iterator[dict]:
        """Generate for one prompt (dict out) or a list of prompts (list out), or stream one prompt's chunks.

        `sampling_params` is a `SamplingParams` or its dict (SGLang's keys), one for all prompts or one per prompt.
        `cache_namespace` (any hashable, e.g. a tenant's cache salt) keeps this request's cached prefixes apart
        from other namespaces'."""
        self._check_open()
        reqs, groups, batched = self._prepare(prompt, input_ids, sampling_params, return_logprob, top_logprobs_num,
                                              logprob_start_len, rid, cache_namespace)
        if stream:
            _check_streamable(reqs, groups)
            return self._stream_sync(reqs[0])
        sinks = [SyncSink() for _ in reqs]
        for req, sink in zip(reqs, sinks):
            req.sink = sink
            self.core.submit(req)
        finished = [self._collect_sync(req, sink) for req, sink in zip(reqs, sinks)]
        results = _returned(finished, groups, bool(return_logprob) or logprob_start_len is not None)
        return results if batched else results[0]

    def _collect_sync(self, req: Req, sink: SyncSink) -> Finished:
        text = []
        while True:
            chunk = sink.get()
            text.append(chunk.text)
            if chunk.meta is not None:
                return Finished("".join(text), list(req.output_ids), chunk.meta)

    def _stream_sync(self, req: Req) -> Iterator[dict]:
        sink = SyncSink()
        req.sink = sink
        req.stream = True
        self.core.submit(req)
        try:
            while True:
                chunk = sink.get()
                yield chunk.to_dict()
                if chunk.finished:
                    return
        finally:
            if req.finish_reason is None:
                self.core.abort(req.rid)

    async def async_generate(self, prompt: str | list[str] | None = None,
                             sampling_params: SamplingParamsArg | list[SamplingParamsArg] = None,
                             input_ids: list | None = None, return_logprob: bool = False, top_logprobs_num: int = 0,
                             logprob_start_len: int | None = None, stream: bool = False, rid: Any = None,
                             cache_namespace: Any = None) -> dict | list[dict] | AsyncIterator[dict]:
        """Awaitable generate; with stream=True returns an async iterator of chunks."""
        self._check_open()
        loop = asyncio.get_running_loop()
        reqs, groups, batched = await loop.run_in_executor(
            self._compile_pool, self._prepare, prompt, input_ids, sampling_params, return_logprob,
            top_logprobs_num, logprob_start_len, rid, cache_namespace)
        if stream:
            _check_streamable(reqs, groups)
            return self._stream_async(reqs[0], loop)
        sinks = [AsyncSink(loop) for _ in reqs]
        for req, sink in zip(reqs, sinks):
            req.sink = sink
            self.core.submit(req)
        finished = await asyncio.gather(*(self._collect_async(r, sink) for r, sink in zip(reqs, sinks)))
        results = _returned(finished, groups, bool(return_logprob) or logprob_start_len is not None)
        return results if batched else results[0]

    async def stream_request(self, input_ids: list[int], sampling_params: SamplingParamsArg,
                             return_logprob: bool = False, top_logprobs_num: int = 0,
                             logprob_start_len: int | None = None) -> AsyncIterator[dict]:
        """One engine request (a prompt's single sample, or its beam search) as the async stream of its chunks,
        for callers that fan out n and best_of themselves (the server). A beam search streams one chunk, its end:
        the best beam's text and tokens, every returned beam in meta_info's `finished_beams`."""
        self._check_open()
        loop = asyncio.get_running_loop()
        reqs, _, _ = await loop.run_in_executor(self._compile_pool, self._prepare, None, input_ids, sampling_params,
                                                return_logprob, top_logprobs_num, logprob_start_len, None)
        if len(reqs) != 1:
            raise ValueError("stream_request runs one engine request: give n=1 without best_of, or a beam search")
        return self._stream_async(reqs[0], loop)

    async def _collect_async(self, req: Req, sink: AsyncSink) -> Finished:
        text = []
        try:
            while True:
                chunk = await sink.get()
                text.append(chunk.text)
                if chunk.meta is not None:
                    return Finished("".join(text), list(req.output_ids), chunk.meta)
        except asyncio.CancelledError:
            self.core.abort(req.rid)
            raise

    async def _stream_async(self, req: Req, loop: asyncio.AbstractEventLoop) -> AsyncIterator[dict]:
        sink = AsyncSink(loop)
        req.sink = sink
        req.stream = True
        self.core.submit(req)
        finished = False
        try:
            while True:
                chunk = await sink.get()
                finished = chunk.finished
                yield chunk.to_dict()
                if finished:
                    return
        finally:
            if not finished:
                self.core.abort(req.rid)

    # ----------------------------------------------------------------- admin
    def abort(self, rid: str) -> None:
        """Abort a running or waiting request by its id (meta_info["id"])."""
        self.core.abort(rid)

    def flush_cache(self) -> bool:
        return self.core.call(self.core.flush_cache)

    def get_stats(self) -> dict:
        return self.core.call(self.core.stats)

    def take_step_records(self) -> list[StepRecord]:
        """The loop's steps since the last call, oldest first, at most `step_trace` of them (the engine option;
        none without it): what each ran and where its time went (runtime/step_trace.py)."""
        trace = self.core.step_trace
        if trace is None:
            return []

        def take() -> list[StepRecord]:
            records = trace.records()
            trace.clear()
            return records

        return self.core.call(take)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        self.core.stop()
        self._compile_pool.shutdown(wait=False)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the engine has been shut down")

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:  # pragma: no cover - best effort
        # No module globals here (contextlib.suppress): at interpreter exit they may already be None.
        try:  # noqa: SIM105
            self.shutdown()
        except Exception:
            pass
