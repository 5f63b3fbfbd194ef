"""The engine side of one HTTP generation request: its sub-requests' streams, merged, measured and closable.

A request with several prompts, or `n` samples, becomes several single-sample sub-requests
(`SamplingParams.expand_n`: sample i of a seeded request gets seed + i). Each sub-request is one engine stream,
drained by its own task into a shared queue, so a handler reads one ordered event stream whatever the fan-out, and
`close()` (a finished handler, a client that went away, a server shutting down) cancels every task, which
aborts the unfinished engine requests and frees their KV slots. Time to first token and inter-token latency
are measured here, per sub-request, as the client sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from radixgen.runtime.sampling_params import SamplingParams
from radixgen.server.errors import bad_request, from_engine_error, internal_error
from radixgen.server.metrics import ServerMetrics

log = logging.getLogger("radixgen.server")

ABORTED_BY_REQUEST = "aborted by request"
CANCELLED = "cancelled"  # the metrics' finish reason of a generation whose client left before its end
MAX_SUB_REQUESTS = 1024  # prompts x samples of one HTTP request


@dataclass(frozen=True)
class SubRequest:
    """One single-sample engine request: prompt ids, sampling params (n=1), and the prompt it came from."""

    input_ids: list[int]
    sampling_params: SamplingParams
    prompt_index: int = 0


def sample_requests(input_ids: list[int], params: SamplingParams, prompt_index: int) -> list[SubRequest]:
    """The `params.n` single-sample sub-requests of one prompt."""
    return [SubRequest(input_ids, sample, prompt_index) for sample in params.expand_n()]


@dataclass(frozen=True)
class LogprobOptions:
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int | None = None


@dataclass
class Output:
    """A finished sub-request: its whole text and ids, and the engine's meta_info."""

    text: str
    output_ids: list[int]
    meta_info: dict[str, Any]


def check_fanout(num_prompts: int, n: int, param: str) -> None:
    """A 400 when one request would fan out into more engine requests than the server takes at once."""
    if num_prompts * n > MAX_SUB_REQUESTS:
        raise bad_request(param, f"{num_prompts} prompt(s) x n={n} exceeds the limit of {MAX_SUB_REQUESTS} "
                                 f"generations per request")


def failure_message(meta: dict[str, Any] | None) -> str | None:
    """Why a sub-request failed inside the engine, or None (finished normally or aborted by a client)."""
    reason = (meta or {}).get("finish_reason") or {}
    if reason.get("type") == "abort" and reason.get("message") != ABORTED_BY_REQUEST:
        return reason.get("message") or "the engine aborted the request"
    return None


class Generation:
    """Sub-requests of one HTTP request, run concurrently on the engine. Use `async with` or call close()."""

    def __init__(self, engine: Any, metrics: ServerMetrics, subs: list[SubRequest],
                 logprobs: LogprobOptions = LogprobOptions(), rid: str | None = None, param_prefix: str = "") -> None:
        self.engine = engine
        self.metrics = metrics
        self.subs = subs
        self.logprobs = logprobs
        self.rid = rid or uuid.uuid4().hex
        self.param_prefix = param_prefix
        self.queue: asyncio.Queue = asyncio.Queue()
        self.tasks: list[asyncio.Task] = []
        self.metas: dict[int, dict] = {}
        self.aborted = False
        self.started = time.perf_counter()

    # ------------------------------------------------------------------ start
    async def start(self) -> None:
        """Validate every sub-request with the engine (nothing is queued before all pass), then run them."""
        streams: list[AsyncGenerator[dict[str, Any], None]] = []  # the engine's streams of chunks
        try:
            for sub in self.subs:
                t0 = time.perf_counter()
                streams.append(await self.engine.stream_request(
                    sub.input_ids, sub.sampling_params, return_logprob=self.logprobs.return_logprob,
                    top_logprobs_num=self.logprobs.top_logprobs_num,
                    logprob_start_len=self.logprobs.logprob_start_len))
                if sub.sampling_params.constraint is not None:
                    self.metrics.grammar_compile.observe(time.perf_counter() - t0)
        except ValueError as exc:
            for stream in streams:  # never started: closing queues nothing
                await stream.aclose()
            raise from_engine_error(exc, self.param_prefix) from None
        self.started = time.perf_counter()
        self.tasks = [asyncio.create_task(self._pump(i, s)) for i, s in enumerate(streams)]

    async def _pump(self, index: int, stream: AsyncGenerator[dict[str, Any], None]) -> None:
        t0 = time.perf_counter()
        last: float | None = None
        produced = 0
        try:
            async with contextlib.aclosing(stream):
                async for chunk in stream:
                    now = time.perf_counter()
                    if chunk["output_ids"]:
                        produced += len(chunk["output_ids"])
                        if last is None:
                            self.metrics.ttft.observe(now - t0)
                        else:
                            self.metrics.itl.observe(now - last)
                        last = now
                    if chunk["finished"]:
                        self._finished(index, chunk["meta_info"], now - t0)
                    self.queue.put_nowait((index, chunk))
        except asyncio.CancelledError:
            if not self.aborted:  # the client left (or the server is stopping): counted, then cancelled
                self._cancelled(index, produced, time.perf_counter() - t0)
                raise
            meta = self._abort_meta(index, produced, time.perf_counter() - t0)
            self._finished(index, meta, meta["e2e_latency"])
            self.queue.put_nowait((index, {"text": "", "output_ids": [], "finished": True, "meta_info": meta}))
        except Exception as exc:  # an engine bug: this request fails, the server goes on
            log.exception("generation %s failed", self.rid)
            self.queue.put_nowait((index, exc))

    def progress_meta(self, index: int, completion_tokens: int) -> dict[str, Any]:
        """A meta_info for sub-request `index` while it runs (finish_reason None; cached tokens are known at
        the end)."""
        return {"id": f"{self.rid}-{index}", "prompt_tokens": len(self.subs[index].input_ids),
                "completion_tokens": completion_tokens, "cached_tokens": 0, "finish_reason": None,
                "e2e_latency": time.perf_counter() - self.started}

    def _abort_meta(self, index: int, produced: int, latency: float) -> dict:
        return {"id": f"{self.rid}-{index}", "prompt_tokens": len(self.subs[index].input_ids),
                "completion_tokens": produced, "cached_tokens": 0,
                "finish_reason": {"type": "abort", "matched": None, "message": ABORTED_BY_REQUEST},
                "e2e_latency": latency}

    def _cancelled(self, index: int, produced: int, latency: float) -> None:
        """Count a sub-request cancelled before its end under finish reason CANCELLED."""
        if index not in self.metas:
            self.metrics.observe_generation(len(self.subs[index].input_ids), produced, 0, CANCELLED, latency)

    def _finished(self, index: int, meta: dict, latency: float) -> None:
        self.metas[index] = meta
        reason = (meta.get("finish_reason") or {}).get("type", "unknown")
        self.metrics.observe_generation(meta.get("prompt_tokens", 0), meta.get("completion_tokens", 0),
                                        meta.get("cached_tokens", 0), reason, latency)

    # ------------------------------------------------------------------ read
    async def events(self) -> AsyncIterator[tuple[int, dict]]:
        """(sub-request index, chunk) in arrival order until every sub-request has finished."""
        remaining = len(self.tasks)
        while remaining:
            index, item = await self.queue.get()
            if isinstance(item, BaseException):
                raise internal_error(f"internal error: {type(item).__name__}: {item}")
            yield index, item
            if item["finished"]:
                remaining -= 1

    async def collect(self) -> list[Output]:
        """Every sub-request's whole output, in sub-request order; a 500 when the engine failed one."""
        texts: list[list[str]] = [[] for _ in self.subs]
        ids: list[list[int]] = [[] for _ in self.subs]
        metas: list[dict] = [{} for _ in self.subs]
        async for index, chunk in self.events():
            texts[index].append(chunk["text"])
            ids[index].extend(chunk["output_ids"])
            if chunk["finished"]:
                metas[index] = chunk["meta_info"]
                failure = failure_message(chunk["meta_info"])
                if failure:
                    raise internal_error(f"generation failed: {failure}")
        return [Output("".join(t), i, m) for t, i, m in zip(texts, ids, metas)]

    # ------------------------------------------------------------------ end
    def abort(self) -> None:
        """Stop every unfinished sub-request; each then finishes with reason abort ("aborted by request")."""
        self.aborted = True
        for task in self.tasks:
            task.cancel()

    async def close(self) -> None:
        """Cancel what still runs (aborting it in the engine) and log one line for the request."""
        pending = [t for t in self.tasks if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        self._log()

    def _log(self) -> None:
        if not self.tasks:
            return
        metas = list(self.metas.values())
        reasons = sorted({(m.get("finish_reason") or {}).get("type", "?") for m in metas}) or [CANCELLED]
        log.info("request %s: %d sub-request(s), prompt=%d completion=%d cached=%d latency=%.3fs finish=%s",
                 self.rid, len(self.subs), sum(len(s.input_ids) for s in self.subs),
                 sum(m.get("completion_tokens", 0) for m in metas), sum(m.get("cached_tokens", 0) for m in metas),
                 time.perf_counter() - self.started, ",".join(reasons))

    async def __aenter__(self) -> Generation:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class GenerationRegistry:
    """Live generations by request id, for `/abort_request`."""

    def __init__(self) -> None:
        self.live: dict[str, set[Generation]] = {}

    @contextlib.contextmanager
    def track(self, gen: Generation):
        self.live.setdefault(gen.rid, set()).add(gen)
        try:
            yield gen
        finally:
            group = self.live.get(gen.rid)
            if group is not None:
                group.discard(gen)
                if not group:
                    del self.live[gen.rid]

    def abort(self, rid: str | None) -> int:
        """Abort the generations of `rid` (all of them when rid is None); returns how many were aborted."""
        groups = list(self.live.values()) if rid is None else [self.live.get(rid, set())]
        count = 0
        for group in groups:
            for gen in list(group):
                gen.abort()
                count += 1
        return count

