"""The engine loop: schedule, forward, sample, advance grammars, stream, finish. Runs on its own thread.

Everything mutable about the engine lives here and is touched only by the loop thread; callers talk to it
through `submit` / `abort` / `call` (a thread-safe inbox), and receive chunks through each request's sink.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import numpy as np
import torch

from radixgen.grammars import bitmask_words
from radixgen.radix import PrefixCache
from radixgen.runtime.batch_builder import LogitRows, build_forward_batch
from radixgen.runtime.beam_steps import BeamSearches
from radixgen.runtime.contrastive_steps import ContrastiveSearches
from radixgen.runtime.engine_config import EngineConfig
from radixgen.runtime.engine_counters import EngineCounters, StepTimes
from radixgen.runtime.forward_batch import host_to_device
from radixgen.runtime.logprobs import token_logprobs
from radixgen.runtime.mask_staging import MaskStaging
from radixgen.runtime.outputs import (
    AbortFinish,
    BeamResult,
    FinishReason,
    LengthFinish,
    MetaInfo,
    StopFinish,
    StreamChunk,
    TopLogprobs,
)
from radixgen.runtime.request import Req, ReqState
from radixgen.runtime.sampled_step import SampledStep, copy_to_host
from radixgen.runtime.sampling_batch import SamplingBatch
from radixgen.runtime.scheduler import ScheduleBatch, Scheduler, SchedulerLimits
from radixgen.runtime.speculative import (
    GrammarDrafts,
    NgramDrafter,
    SpeculationPolicy,
    accepted_lengths,
    make_drafter,
)
from radixgen.runtime.speculative.grammar_drafts import whole_utf8_prefix
from radixgen.runtime.step_trace import StepRecord, StepTrace

if TYPE_CHECKING:
    from radixgen.grammars import Vocabulary
    from radixgen.grammars.backend import GrammarMatcher
    from radixgen.runtime.forward_batch import ForwardBatch
    from radixgen.runtime.model_runner import ModelRunner
    from radixgen.runtime.speculative import Drafter
    from radixgen.tokenizer import Tokenizer

T = TypeVar("T")
DELIVER_SMOOTHING = 0.2  # weight of the newest delivery in `_deliver_seconds`
FORCED_IDS_CACHED = 4096  # forced texts whose token ids the engine keeps (`_encode_forced`)

log = logging.getLogger("radixgen.engine")


class EngineCore:
    """The loop over one model: `vocab` (the grammars' view of the tokenizer) is None when the engine runs
    without constrained decoding."""

    def __init__(self, config: EngineConfig, runner: ModelRunner, tokenizer: Tokenizer,
                 vocab: Vocabulary | None) -> None:
        from radixgen.radix import NoPrefixCache, RadixCache
        from radixgen.runtime.sampler import Sampler

        self.config = config
        self.runner = runner
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.device: torch.device = runner.device
        self.vocab_size: int = runner.model_config.vocab_size
        self.max_context: int = runner.context_length
        self.allocator = runner.slot_allocator
        self.req_rows = runner.req_to_token_pool
        cache_enabled = not config.disable_radix_cache
        self.cache: PrefixCache = RadixCache(page_size=config.page_size) if cache_enabled else NoPrefixCache()
        limits = SchedulerLimits(
            max_running_requests=config.max_running_requests,
            max_prefill_tokens=config.max_prefill_tokens,
            chunked_prefill_size=config.chunked_prefill_size,
            max_context=self.max_context,
            schedule_policy=config.schedule_policy,
            overlap_schedule=not config.disable_overlap_schedule,
            # On the CPU the forward does not run beside the loop: a constrained step gains nothing by waiting.
            overlap_constrained=runner.device.type == "cuda",
        )
        self.scheduler = Scheduler(limits, self.allocator, self.req_rows, self.cache)
        self.sampler = Sampler(self.vocab_size, self.device, seed=config.random_seed, token_count=tokenizer.vocab_size)
        self.counters = EngineCounters()
        self.grammar_us_per_request = StepTimes()  # per step: its grammar time over its constrained requests
        self.step_trace = StepTrace(config.step_trace) if config.step_trace else None
        self.inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()  # (kind, payload), see `_drain`
        self.reqs: dict[str, Req] = {}
        # rid -> why its grammar failed while filling this step's mask: the request ends when its token arrives
        self._grammar_failures: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Speculative decoding (runtime/speculative): what drafts, and how many drafts a step verifies.
        algorithm = config.speculative_algorithm
        k = config.speculative_num_draft_tokens
        self.drafter: Drafter | None = make_drafter(config, runner) if algorithm is not None else None
        self.spec_policy = (SpeculationPolicy(k, config.speculative_max_batch,
                                              runner.step_cost)
                            if algorithm is not None else None)
        self.grammar_drafts = GrammarDrafts(tokenizer) if algorithm is not None else None
        self.bitmask_words = (self.vocab_size + 31) // 32
        live_words = bitmask_words(len(vocab.token_bytes)) if vocab is not None else 0
        mask_rows = config.max_running_requests
        if algorithm is not None:  # a verify step masks every position of a constrained request
            mask_rows = max(mask_rows, config.speculative_max_batch * (1 + k))
        self._masks = MaskStaging(mask_rows, self.bitmask_words, live_words, self.device)
        self._eos_set = frozenset(tokenizer.eos_token_ids)
        self._eos_ids = tuple(tokenizer.eos_token_ids)
        self._beam_searches = 0  # beam-search requests submitted and not finished (their steps take _beam_step)
        self._contrastive_searches = 0  # ... contrastive-search requests (their steps compute hidden states)
        self.contrastive = ContrastiveSearches(self.scheduler, lambda reqs: self._grammar_masks(reqs, frozenset()),
                                               self.sampler.token_count)
        self.beams = BeamSearches(self.scheduler, lambda reqs: self._grammar_masks(reqs, frozenset()), self._eos_set,
                                  self.sampler.token_count, self.max_context)
        self._inflight: SampledStep | None = None  # sampled, launched, not yet delivered (overlapped loop)
        self._last_sampled: SampledStep | None = None  # its SamplingBatch is reused by a steady decode
        # the current step's start, output tokens so far, and (batch size, drafted) if it only decodes
        self._period: tuple[float, int, tuple[int, bool] | None] | None = None
        self._drafting = False  # the policy asked this step to draft (whether or not any draft was found)
        # tokens beyond one per request that the jumps taken while delivering the current step add to the next step
        self._jump_extra_tokens = 0
        # jumps declined while delivering the current step because one alone did not pay: (request, whether a
        # launched step computes its token); taken together at the end of the delivery if together they pay
        self._deferred_jumps: list[tuple[Req, bool, int]] = []
        self._jump_declined = 0  # the most tokens a declined jump of the request being delivered would save
        # a delivery's host seconds (smoothed), and whether the one running overlaps a launched step: a jump then
        # makes the next step wait for the host (`_sync_penalty`)
        self._deliver_seconds = 0.0
        self._delivering_overlapped = False
        self._forced_ids: collections.OrderedDict[tuple[str, bool], list[int]] = collections.OrderedDict()
        self.on_step: Callable[[ScheduleBatch], None] | None = None  # test hook

    # ------------------------------------------------------------ thread API
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="radixgen-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.inbox.put(("wake", None))
        if self._thread is not None:
            self._thread.join(timeout=30)

    def submit(self, req: Req) -> None:
        self.inbox.put(("add", req))

    def abort(self, rid: str) -> None:
        self.inbox.put(("abort", rid))

    def call(self, fn: Callable[[], T], timeout: float | None = 60) -> T:
        """Run fn on the loop thread between steps and return its result (for flush, stats, checks)."""
        box: queue.Queue[tuple[bool, Any]] = queue.Queue()
        self.inbox.put(("call", (fn, box)))
        ok, value = box.get(timeout=timeout)
        if not ok:
            raise value
        return value

    # ------------------------------------------------------------- the loop
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._drain(block=not self.scheduler.has_work())
                if self._stop.is_set():
                    break
                self.step()
            except Exception as exc:  # never let one bad step kill the engine: fail its requests instead
                log.exception("engine step failed")
                self._fail_running(f"internal error: {type(exc).__name__}: {exc}")
        for req in list(self.reqs.values()):
            self._finish(req, AbortFinish("engine shut down"))

    def _drain(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload = item
            if kind == "add":
                self.reqs[payload.rid] = payload
                self._beam_searches += payload.params.is_beam_search
                self._contrastive_searches += payload.params.is_contrastive
                self.scheduler.add(payload)
            elif kind == "abort":
                req = self.reqs.get(payload)
                if req is not None:
                    self._finish(req, AbortFinish("aborted by request"))
            elif kind == "call":
                fn, box = payload
                try:
                    box.put((True, fn()))
                except Exception as exc:
                    box.put((False, exc))
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def step(self) -> None:
        """Schedule, forward and sample one batch. With a step still in flight, the scheduler either overlaps
        (the next decode is launched before that step's tokens are delivered) or asks for them first."""
        start = time.perf_counter()
        before = replace(self.counters) if self.step_trace is not None else None
        prev = self._inflight
        if self.spec_policy is not None:
            self._observe_period()
            prev = self._prepare_drafts(prev)
        batch = self.scheduler.schedule(prev.reqs) if prev is not None else None
        if prev is not None and batch is None:
            self._deliver(prev)
            self._inflight = prev = None
        if batch is None:
            batch = self.scheduler.schedule()
            if batch is None:
                return
        if self.spec_policy is not None:
            self._start_period(batch)
        if self.on_step is not None:
            self.on_step(batch)
        constrained = sum(it.req.matcher is not None for it in batch.items) if self.vocab is not None else 0
        grammar_before = self.counters.grammar_seconds
        try:
            self._launch(batch, prev, constrained > 0)
        finally:
            if constrained:
                self.counters.grammar_request_steps += constrained
                self.grammar_us_per_request.add((self.counters.grammar_seconds - grammar_before) * 1e6 / constrained)
            if before is not None:  # the step trace is on
                self._trace_step(batch, before, time.perf_counter() - start)

    def _trace_step(self, batch: ScheduleBatch, before: EngineCounters, wall: float) -> None:
        """Record the step just run (`EngineConfig.step_trace`), from the counters' change over it."""
        c = self.counters
        assert self.step_trace is not None, "traced only where the engine keeps a trace"
        self.step_trace.add(StepRecord(
            index=c.steps - 1, mode="decode" if batch.is_decode else "extend", batch_size=len(batch.items),
            tokens=batch.num_tokens, path=self.runner.last_forward_path,
            overlapped=c.overlapped_steps > before.overlapped_steps, wall_s=wall,
            forward_s=c.forward_seconds - before.forward_seconds, grammar_s=c.grammar_seconds - before.grammar_seconds,
            sample_s=c.sample_seconds - before.sample_seconds))

    def _launch(self, batch: ScheduleBatch, prev: SampledStep | None, constrained: bool) -> None:
        if prev is not None:
            self._overlapped_step(batch, prev, constrained)
            return
        fb, rows = build_forward_batch(batch, self.scheduler, self.req_rows.req_to_token, self.device)
        hidden = None
        if self._contrastive_searches and any(it.req.params.is_contrastive for it in batch.items):
            logits, hidden = self._forward(batch, fb, with_hidden=True)  # a contrastive search reads the states
            self._contrastive_prompts(batch, rows, hidden)
        else:
            logits = self._forward(batch, fb)
        self._prompt_logprobs(batch, rows, logits)
        sampled = self._sample(batch, rows, logits, hidden=hidden)
        if sampled is None:
            return
        if sampled.counts is None and self.scheduler.can_defer_delivery(sampled.reqs):
            self._inflight = sampled  # delivered after the next step is launched (or before a synchronous one)
        else:
            self._deliver(sampled)

    @overload
    def _forward(self, batch: ScheduleBatch, fb: ForwardBatch) -> torch.Tensor: ...

    @overload
    def _forward(self, batch: ScheduleBatch, fb: ForwardBatch,
                 with_hidden: Literal[True]) -> tuple[torch.Tensor, torch.Tensor]: ...

    def _forward(self, batch: ScheduleBatch, fb: ForwardBatch,
                 with_hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The step's logits (and, `with_hidden`, the final hidden states of the same rows)."""
        t0 = time.perf_counter()
        out: torch.Tensor | tuple[torch.Tensor, torch.Tensor] = (
            self.runner.forward_with_hidden(fb) if with_hidden else self.runner.forward(fb))
        self.scheduler.commit(batch)
        c = self.counters
        elapsed = time.perf_counter() - t0
        c.forward_seconds += elapsed
        c.decode_forward_seconds += elapsed if batch.is_decode else 0.0
        c.steps += 1
        c.decode_steps += int(batch.is_decode)
        c.forward_tokens += batch.num_tokens
        c.preemptions = self.scheduler.num_preemptions
        return out

    def _overlapped_step(self, batch: ScheduleBatch, prev: SampledStep, constrained: bool) -> None:
        """Launch `batch`, the next decode of the in-flight step's requests, its input tokens read on the device
        from that step's samples, and only then deliver those samples: the host's per-request work overlaps the
        device's forward (SGLang's overlap scheduler). The new samples stay in flight in turn."""
        keep = batch.in_flight_rows
        assert keep is not None, "an overlapped step's batch names its rows of the in-flight step"
        everyone = len(keep) == len(prev.reqs)
        ids = prev.out.next_token_ids
        if not everyone:
            ids = ids.index_select(0, host_to_device(np.asarray(keep, dtype=np.int64), ids.device))
        fb, rows = build_forward_batch(batch, self.scheduler, self.req_rows.req_to_token, self.device,
                                       device_ids=ids)
        logits = self._forward(batch, fb)
        self.counters.overlapped_steps += 1
        sb = prev.sb if everyone else prev.sb.filter(keep)
        sampling = (sb, [prev.counted[j] + 1 for j in keep])
        # A thinking budget may force tokens at delivery, which makes this step's sample of that request stale.
        forcing = any(it.req.thinking_close_ids is not None for it in batch.items)
        if constrained or forcing:
            # The matchers must see the in-flight tokens before they fill this step's masks: deliver first (the
            # forward runs meanwhile), then sample. A request whose delivery jumped forward has a stale sample.
            stale = self._deliver(prev, batch)
            sampled = self._sample(batch, rows, logits, sampling, stale)
        else:
            sampled = self._sample(batch, rows, logits, sampling)
            self._deliver(prev)
        self._inflight = sampled
        if sampled is not None and not any(r.state is ReqState.RUNNING for r in sampled.reqs):
            self._inflight = None  # every request ended with the tokens just delivered: nothing to wait for

    # --------------------------------------------------------- outputs
    def _contrastive_prompts(self, batch: ScheduleBatch, rows: LogitRows, hidden: torch.Tensor) -> None:
        """The prompt positions' hidden states of the contrastive searches prefilling in this step."""
        for i, it in enumerate(batch.items):
            req = it.req
            if not req.params.is_contrastive or it.logits_from is None or req.beam_group is not None:
                continue
            first_pos, n, lo = it.start + it.logits_from, int(rows.count[i]), int(rows.first[i])
            n = min(n, req.prompt_len - first_pos)
            if n > 0:
                self.contrastive.add_prompt_hidden(req, first_pos, hidden[lo : lo + n])

    def _prompt_logprobs(self, batch: ScheduleBatch, rows: LogitRows, logits: torch.Tensor) -> None:
        for i, it in enumerate(batch.items):
            if it.logits_from is None or rows.count[i] == 0:
                continue
            req = it.req
            first_pos = it.start + it.logits_from  # position of the first row
            n = int(rows.count[i])
            # Row at position p scores token p + 1, while p + 1 is still a prompt token.
            n_prompt = min(n, req.prompt_len - 1 - first_pos)
            if first_pos == 0 and req.logprob_start_len == 0 and not req.input_token_logprobs:
                req.input_token_logprobs.append((None, int(req.origin_ids[0])))
                if req.top_logprobs_num:
                    req.input_top_logprobs.append(None)
            if n_prompt <= 0:
                continue
            lo = int(rows.first[i])
            nxt = torch.from_numpy(req.origin_ids[first_pos + 1 : first_pos + 1 + n_prompt])
            scored = token_logprobs(logits[lo : lo + n_prompt], nxt, top_k=req.top_logprobs_num)
            req.input_token_logprobs.extend(zip(scored.logprobs.tolist(), nxt.tolist()))
            if scored.top_values is not None and scored.top_ids is not None:
                for v, ix in zip(scored.top_values.tolist(), scored.top_ids.tolist()):
                    req.input_top_logprobs.append(list(zip(v, ix)))

    def _sample(self, batch: ScheduleBatch, rows: LogitRows, logits: torch.Tensor,
                sampling: tuple[SamplingBatch, list[int]] | None = None,
                stale: frozenset[str] = frozenset(), hidden: torch.Tensor | None = None) -> SampledStep | None:
        """Sample the next token of every item that reaches the end of its tokens, and start copying the tokens
        to the host. `sampling`: the sampling batch and its rows' counted tokens, when the caller has them;
        `stale`: requests whose sample here is to be dropped (their tokens changed after the forward)."""
        sel = []
        for i, it in enumerate(batch.items):
            if not it.sample:
                continue
            # max_new_tokens=0: prefill (and score) only; a search's own requests (a contrastive candidate holds the
            # token it proposes) leave the limit to their search
            if it.req.beam_group is None and it.req.output_budget(self.max_context) <= 0:
                self._finish(it.req, LengthFinish())
            else:
                sel.append(i)
        beams = [i for i in sel if batch.items[i].req.params.is_beam_search] if self._beam_searches else []
        if beams:
            self._beam_step([batch.items[i].req for i in beams], logits, rows.sample_row[beams])
            sel = [i for i in sel if not batch.items[i].req.params.is_beam_search]
        contrastive = [i for i in sel if batch.items[i].req.params.is_contrastive] if self._contrastive_searches else []
        if contrastive:
            assert hidden is not None, "a step with contrastive searches computes the hidden states"
            self._contrastive_step([batch.items[i].req for i in contrastive], logits, hidden,
                                   rows.sample_row[contrastive])
            sel = [i for i in sel if not batch.items[i].req.params.is_contrastive]
        if not sel:
            return None
        reqs = [batch.items[i].req for i in sel]
        sample_rows = rows.sample_row[sel]
        counts = rows.sample_count[sel]
        verify = bool((counts > 1).any())  # some request verifies drafts: several rows each
        total = int(counts.sum())
        first = np.cumsum(counts) - counts  # each request's first row among the sampled rows
        if total == logits.shape[0] and (sample_rows == first).all():
            sample_logits = logits  # a decode or verify step: every logits row is sampled, in order
        else:
            if verify:  # each request's rows run on from its first one
                sample_rows = np.repeat(sample_rows - first, counts) + np.arange(total)
            sample_logits = logits.index_select(0, host_to_device(sample_rows, logits.device))
        # Greedy constrained requests of a verify step draw unmasked: where the grammar allows the argmax it is the
        # masked argmax too, and only a refused row needs its mask (`_greedy_grammar_fixups`).
        lazy = frozenset(r.rid for j, r in enumerate(reqs) if verify and counts[j] > 1 and r.matcher is not None
                         and r.params.is_greedy and r.rid not in stale)
        t0 = time.perf_counter()
        mask, mask_rows = self._grammar_masks(reqs, stale, counts if verify else None, lazy)
        t1 = time.perf_counter()
        self.counters.grammar_seconds += t1 - t0
        sb, counted = sampling if sampling is not None else self._sampling_batch(reqs)
        drawn = sb
        if verify:
            # One row per verified position, each drawn as plain decoding would draw it at that output index.
            drawn = sb.positions(counts)
            counted = [-1] * len(reqs)  # set once the kept tokens are known (`_deliver_verified`)
        out = self.sampler.sample(drawn, sample_logits, mask, mask_rows)
        if not verify:
            sb.append(out.next_token_ids)
        host, ready = copy_to_host([out.next_token_ids, out.next_token_logprobs, out.top_logprobs_values,
                                     out.top_logprobs_ids])
        self._last_sampled = sampled = SampledStep(reqs, tuple(r.rid for r in reqs), counted, sb, out, host, ready,
                                                   stale, counts if verify else None)
        if lazy:
            sampled.lazy = (lazy, sample_logits, drawn)
        self.counters.sample_seconds += time.perf_counter() - t1
        return sampled

    def _beam_step(self, reqs: list[Req], logits: torch.Tensor, sample_rows: np.ndarray) -> None:
        """Advance the beam searches of this step's beams (synchronously: their next step depends on the choice)."""
        t0 = time.perf_counter()
        try:
            ended = self.beams.step(reqs, logits, sample_rows)
        except Exception as exc:  # one failing search never takes its batch down
            log.exception("beam search step failed")
            roots = {r.beam_group or r.rid for r in reqs}
            for rid in roots:
                if rid in self.reqs:
                    self._finish(self.reqs[rid], AbortFinish(f"{type(exc).__name__}: {exc}"))
            return
        finally:
            self.counters.sample_seconds += time.perf_counter() - t0
        failed = {r.beam_group for r in reqs if r.rid in self._grammar_failures}
        for group in failed:
            if group is not None and group in self.reqs:
                self._finish(self.reqs[group], AbortFinish("constraint failed in a beam"))
        self.counters.generated_tokens += len(reqs)
        for search in ended:
            root = search.root
            results = tuple(self._beam_result(root, h.output_ids, h.score, h.cumulative_logprob)
                            for h in search.results)
            root.beam_results = results
            best = results[0]
            root.output_ids = list(best.output_ids)
            root.emitted_text, root.text_pos, root.text_done = best.text, len(best.output_ids), True
            self._finish(root, best.finish_reason, delta_text=best.text, delta_ids=list(best.output_ids))

    def _contrastive_step(self, reqs: list[Req], logits: torch.Tensor, hidden: torch.Tensor,
                          sample_rows: np.ndarray) -> None:
        """Start the contrastive searches whose prompt this step finished, and take each running one's winner:
        its token is appended to the request (stops, streaming), then its logits give the next candidates."""
        t0 = time.perf_counter()
        roots = [(r, int(row)) for r, row in zip(reqs, sample_rows) if r.beam_group is None]
        cands = [(r, int(row)) for r, row in zip(reqs, sample_rows) if r.beam_group is not None]
        try:
            for root, row in roots:
                self.contrastive.start(root, logits[row])
            choices = self.contrastive.choose([r for r, _ in cands], logits, hidden,
                                              np.array([row for _, row in cands], dtype=np.int64))
        except Exception as exc:  # one failing search never takes its batch down
            log.exception("contrastive search step failed")
            for rid in {r.beam_group or r.rid for r in reqs}:
                if rid in self.reqs:
                    self._finish(self.reqs[rid], AbortFinish(f"{type(exc).__name__}: {exc}"))
            return
        finally:
            self.counters.sample_seconds += time.perf_counter() - t0
        for choice in choices:
            root = choice.run.root
            refused = root.matcher is not None and choice.token not in self._eos_set and \
                not root.matcher.advance(choice.token)
            if refused:
                self._finish(root, AbortFinish(f"constraint refused the chosen token {choice.token}"))
                continue
            if root.first_token_time is None:
                root.first_token_time = time.perf_counter()
            self._append(root, [choice.token])
            if root.state is ReqState.BEAMS:  # it goes on
                self.contrastive.proceed(choice, logits[choice.row])

    def _beam_result(self, req: Req, ids: tuple[int, ...], score: float, cumulative: float) -> BeamResult:
        eos = self.beams.eos_of(req)
        ended = bool(ids) and ids[-1] in eos
        text = self.tokenizer.decode(list(ids[:-1] if ended and not req.params.no_stop_trim else ids),
                                     skip_special_tokens=req.params.skip_special_tokens)
        return BeamResult(text, ids, score, cumulative, StopFinish(ids[-1]) if ended else LengthFinish())

    def _deliver(self, sampled: SampledStep, successor: ScheduleBatch | None = None) -> frozenset[str]:
        """Hand a step's sampled tokens to their requests (waiting for the host copy if it is still in flight).
        `successor`: the step already launched on these tokens; returns the requests whose tokens then changed
        (jump-forward), so their rows of the successor's samples are stale."""
        t0 = time.perf_counter()
        if sampled.ready is not None:
            sampled.ready.synchronize()
        token_t, logprob_t, top_v, top_i = sampled.host
        assert token_t is not None, "every sampled step has its tokens"
        tokens = token_t.tolist()
        logprobs = logprob_t.tolist() if logprob_t is not None else None
        tops = ([list(zip(v, i)) for v, i in zip(top_v.tolist(), top_i.tolist())]
                if top_v is not None and top_i is not None else None)
        self.counters.sample_seconds += time.perf_counter() - t0
        if sampled.counts is not None:
            self._deliver_verified(sampled, tokens, logprobs, tops)
            return frozenset()
        launched = frozenset(it.req.rid for it in successor.items) if successor is not None else frozenset()
        jumped: set[str] = set()
        self._jump_extra_tokens = 0
        self._deferred_jumps = []
        self._delivering_overlapped = successor is not None
        started = time.perf_counter()
        for j, req in enumerate(sampled.reqs):
            if req.rid in sampled.stale:
                continue
            try:
                if self._on_tokens(req, tokens[j : j + 1], [logprobs[j]] if logprobs else None,
                                   [tops[j][: req.top_logprobs_num]] if tops else None, req.rid in launched):
                    jumped.add(req.rid)
            except Exception as exc:  # one failing request never takes its batch down
                log.exception("request %s failed", req.rid)
                self._finish(req, AbortFinish(f"{type(exc).__name__}: {exc}"))
        if self._deferred_jumps:
            jumped |= self._take_deferred_jumps()
        took = time.perf_counter() - started
        self._deliver_seconds += DELIVER_SMOOTHING * (took - self._deliver_seconds)
        return frozenset(jumped & launched)

    def _take_deferred_jumps(self) -> set[str]:
        """The jumps declined one by one while delivering this step, taken together when the tokens they save
        pay for the step they make (`_jump_pays`' rule over their sum); returns the requests that jumped."""
        pending, self._deferred_jumps = self._deferred_jumps, []
        most = self.runner.max_graph_row_tokens  # None: no graphs, rows of any length
        extra = sum(saved if most is None else min(saved, most - 1) for _, _, saved in pending)
        if not self._jump_pays(sum(saved for _, _, saved in pending), extra):
            return set()
        taken: set[str] = set()
        for req, computed, _ in pending:
            if req.state is not ReqState.RUNNING:
                continue
            try:
                t0 = time.perf_counter()
                ids = self._jump_after(req, computed)
                self.counters.grammar_seconds += time.perf_counter() - t0
                if ids:
                    self._append(req, ids)
                    taken.add(req.rid)
            except Exception as exc:  # one failing request never takes its batch down
                log.exception("request %s failed", req.rid)
                self._finish(req, AbortFinish(f"{type(exc).__name__}: {exc}"))
        return taken

    def _jump_after(self, req: Req, computed: bool) -> list[int]:
        """The forced chain after the request's last token (already appended), advanced through its matcher: the
        forced text as the tokenizer tokenizes it after a token, then markers and their text (`_count_jump`).
        `computed`: a launched step computes that last token, so it is not in the next step's row."""
        m = req.matcher
        assert m is not None, "only a constrained request jumps forward"
        ids = self._forced_text_ids(whole_utf8_prefix(m.forced_suffix()), req.output_budget(self.max_context),
                                    computed)
        if ids is None:
            return []
        return self._count_jump(req, [req.output_ids[-1]] + ids[: self._advance_all(m, ids)], int(computed))[1:]

    def _deliver_verified(self, sampled: SampledStep, tokens: list[int], logprobs: list[float] | None,
                          tops: list[list[tuple[float, int]]] | None) -> None:
        """A verify step's tokens: each request keeps its samples up to and including the first that differs
        from its draft (runtime/speculative/acceptance.py); the KV of the drafts after it is freed."""
        counts = sampled.counts
        assert counts is not None, "a verify step records its rows per request"
        reqs = sampled.reqs
        if sampled.lazy is not None:
            g0 = time.perf_counter()
            self._greedy_grammar_fixups(sampled, tokens, logprobs)
            self.counters.grammar_seconds += time.perf_counter() - g0
        rows = counts.tolist()
        drafts = np.concatenate([r.draft_ids[: c - 1] for r, c in zip(reqs, rows)])
        kept = accepted_lengths(np.asarray(tokens, dtype=np.int64), drafts, counts).tolist()
        before = [len(r.output_ids) for r in reqs]
        drafted = accepted = s0 = 0
        for req, c, a in zip(reqs, rows, kept):
            req.draft_ids = req.draft_ids[:0]
            if c > 1:
                req.spec_verify_steps += 1
                req.spec_draft_tokens += c - 1
                req.spec_accepted_tokens += a
                drafted += c - 1
                accepted += a
                if req.state is ReqState.RUNNING and a < c - 1:
                    self.scheduler.rewind(req, req.kv_len - (c - 1 - a))  # the rejected drafts' positions
            top = [t[: req.top_logprobs_num] for t in tops[s0 : s0 + a + 1]] if tops else None
            try:
                self._on_tokens(req, tokens[s0 : s0 + a + 1], logprobs[s0 : s0 + a + 1] if logprobs else None, top,
                                False)
            except Exception as exc:  # one failing request never takes its batch down
                log.exception("request %s failed", req.rid)
                self._finish(req, AbortFinish(f"{type(exc).__name__}: {exc}"))
            s0 += c
        sb = sampled.sb  # one row per request: kept in step, so the next step reuses it (without penalty state)
        if sb.output_counts is None and sb.seen is None:
            added = [len(r.output_ids) - n for r, n in zip(reqs, before)]
            if min(added) == max(added):  # every request took as many (always at batch 1): no copy to the device
                sb.output_lens += added[0]
            else:
                sb.output_lens += host_to_device(np.asarray(added, dtype=np.int64), self.device)
            sampled.counted = [len(r.output_ids) for r in reqs]
        c_ = self.counters
        c_.spec_verify_steps += 1
        c_.spec_draft_tokens += drafted
        c_.spec_accepted_tokens += accepted
        assert self.spec_policy is not None, "only a speculating engine verifies drafts"
        self.spec_policy.observe(drafted, accepted)

    def _greedy_grammar_fixups(self, sampled: SampledStep, tokens: list[int], logprobs: list[float] | None) -> None:
        """The unmasked greedy rows of a verify step (in place in `tokens` / `logprobs`): walking each request's
        rows with its grammar advanced through the drafts before them, a token the grammar refuses is replaced by
        the masked argmax of its row (one mask, one single-row sample), and the walk stops at the first row whose
        token is not the next draft: later rows are not kept anyway."""
        assert sampled.lazy is not None and sampled.counts is not None, "called for a verify step with lazy rows"
        lazy, logits, drawn = sampled.lazy
        starts = (np.cumsum(sampled.counts) - sampled.counts).tolist()
        for req, c, s0 in zip(sampled.reqs, sampled.counts.tolist(), starts):
            matcher = req.matcher
            if req.rid not in lazy or matcher is None or req.state is not ReqState.RUNNING:
                continue
            advanced = 0
            try:
                for i in range(c):
                    if matcher.is_terminated():
                        break
                    t = tokens[s0 + i]
                    if matcher.advance(t):
                        matcher.rollback(1)
                    else:
                        t, lp = self._masked_row(matcher, logits, drawn, s0 + i)
                        tokens[s0 + i] = t
                        if logprobs is not None and lp is not None:
                            logprobs[s0 + i] = lp
                    if i == c - 1 or t != int(req.draft_ids[i]) or not matcher.advance(t):
                        break
                    advanced += 1
            except Exception as exc:  # the request ends when its tokens are taken; its batch goes on
                log.exception("grammar of request %s failed", req.rid)
                self._grammar_failures[req.rid] = f"constraint failed: {type(exc).__name__}: {exc}"
            finally:
                if advanced:
                    matcher.rollback(advanced)

    def _masked_row(self, matcher: GrammarMatcher, logits: torch.Tensor, drawn: SamplingBatch,
                    row: int) -> tuple[int, float | None]:
        """The sampler's choice for one row of a step under `matcher`'s mask, and its logprob."""
        mask = self._masks.rows(1)
        matcher.fill_mask(mask[0])
        masks, mask_rows = self._masks.upload([0])
        out = self.sampler.sample(drawn.filter([row]), logits[row : row + 1], masks, mask_rows)
        lp = float(out.next_token_logprobs[0]) if out.next_token_logprobs is not None else None
        return int(out.next_token_ids[0]), lp

    def _drafts_likely(self, candidates: list[Req], in_flight: set[str], k: int) -> bool:
        """Whether delivering the in-flight step for drafts may pay: n-gram lookups from the tokens without the
        one in flight (k + 1 tokens, the first a guess of it) find something for some request. Other drafters
        (a draft model, a grammar's forced text) need the delivered token: assume so."""
        if not isinstance(self.drafter, NgramDrafter) or any(r.matcher is not None for r in candidates):
            return True
        waiting = [r for r in candidates if r.rid in in_flight]
        return len(waiting) < len(candidates) or any(len(g) > 1 for g in self.drafter.propose(waiting, k + 1))

    def _start_period(self, batch: ScheduleBatch) -> None:
        """Remember when this step began and whether it only decodes (with or without drafts), so the next step
        can tell the policy this one's throughput."""
        decoding = all(it.sample and it.extend == 1 + it.drafts for it in batch.items)
        drafted = any(it.drafts for it in batch.items)
        # observed: steps that verified drafts, and steps the policy kept plain (not those that found none)
        kind = (len(batch.items), drafted) if decoding and (drafted or not self._drafting) else None
        self._period = (time.perf_counter(), self.counters.generated_tokens, kind)

    def _observe_period(self) -> None:
        period, self._period = self._period, None
        if period is None:
            return
        start, tokens, kind = period
        if kind is None:
            return
        batch_size, speculated = kind
        assert self.spec_policy is not None, "called when speculating"
        self.spec_policy.observe_step(batch_size, speculated, self.counters.generated_tokens - tokens,
                                      time.perf_counter() - start)

    def _prepare_drafts(self, prev: SampledStep | None) -> SampledStep | None:
        """Propose the drafts of this step's decoding requests when the policy says a verify step pays; the
        in-flight step (if any) is delivered first, as drafts are proposed from the host's tokens. Returns the
        step still in flight."""
        running = self.scheduler.running
        for req in running:
            req.draft_ids = req.draft_ids[:0]
        assert self.spec_policy is not None and self.grammar_drafts is not None, "called when speculating"
        in_flight = {r.rid for r in prev.reqs} if prev is not None else set()
        # requests that would draft: decoding (their last token sampled, maybe still in flight), no penalty, and
        # a drafter for them (grammar drafts alone serve only constrained requests)
        candidates = [r for r in running if r.state is ReqState.RUNNING and _may_speculate(r)
                      and (r.remaining == 1 or (r.remaining == 0 and r.rid in in_flight))
                      and (self.drafter is not None or r.matcher is not None)]
        self._drafting = False
        if not candidates:
            return prev
        k = self.spec_policy.draft_tokens(len(running))
        if k == 0:
            return prev
        self._drafting = True
        if prev is not None:
            if not self._drafts_likely(candidates, in_flight, k):
                return prev  # nothing to verify: keep the overlap
            self._deliver(prev)
            self._inflight = prev = None
        reqs = [r for r in candidates if r.state is ReqState.RUNNING and r.remaining == 1]
        if not reqs:
            return None
        t0 = time.perf_counter()
        proposals = self.drafter.propose(reqs, k) if self.drafter is not None else [r.draft_ids for r in reqs]
        grammar_seconds = 0.0
        for req, draft in zip(reqs, proposals):
            most = min(k, req.output_budget(self.max_context) - 1)
            if most <= 0:
                continue
            if req.matcher is not None:
                g0 = time.perf_counter()
                forced = self.grammar_drafts.forced(req.matcher, most)
                draft = GrammarDrafts.allowed_prefix(req.matcher, forced if len(forced) else draft[:most])
                grammar_seconds += time.perf_counter() - g0
            req.draft_ids = np.asarray(draft[:most], dtype=np.int64)
        self.counters.grammar_seconds += grammar_seconds
        self.counters.draft_seconds += time.perf_counter() - t0 - grammar_seconds
        return None

    def _sampling_batch(self, reqs: list[Req]) -> tuple[SamplingBatch, list[int]]:
        """The sampling tensors of `reqs` and the tokens each row will have counted after this step's sample:
        the last step's tensors, when the same requests sample again with exactly the tokens that step counted
        (the steady decode state); otherwise built afresh from the requests' tokens."""
        lens = [len(r.output_ids) for r in reqs]
        last = self._last_sampled
        if last is not None and last.rids == tuple(r.rid for r in reqs) and last.counted == lens:
            sb = last.sb
        else:
            sb = SamplingBatch.build(
                [r.params for r in reqs], self.vocab_size, self.device, eos_token_ids=self._eos_ids,
                prompt_ids=[r.origin_ids for r in reqs], output_ids=[r.output_ids for r in reqs],
                return_logprob=[r.return_logprob for r in reqs],
                top_logprobs_num=[r.top_logprobs_num for r in reqs])
        return sb, [n + 1 for n in lens]

    def _grammar_masks(self, reqs: list[Req], stale: frozenset[str], counts: np.ndarray | None = None,
                       lazy: frozenset[str] = frozenset()) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The packed masks of the constrained rows of `reqs`, on the device, and the logits row of each.
        `counts`: rows per request of a verify step (its drafts' positions masked as the grammar stands after
        the drafts before them)."""
        matchers = [(j, r.matcher) for j, r in enumerate(reqs) if r.matcher is not None and r.rid not in lazy]
        if not matchers:
            return None, None
        assert self.vocab is not None, "a request with a grammar was compiled against the engine's vocabulary"
        if counts is not None:
            return self._verify_masks(reqs, matchers, stale, counts)
        mask = self._masks.rows(len(matchers))
        for k, (j, matcher) in enumerate(matchers):
            if reqs[j].rid in stale or reqs[j].state not in (ReqState.RUNNING, ReqState.BEAMS):
                mask[k] = -1  # a sample nobody reads: any token
                continue
            try:
                matcher.fill_mask(mask[k])
            except Exception as exc:  # one request's grammar never takes the batch down: that request ends
                log.exception("grammar mask of request %s failed", reqs[j].rid)
                self._grammar_failures[reqs[j].rid] = f"constraint failed: {type(exc).__name__}: {exc}"
                mask[k] = -1  # any token: the row is sampled, then thrown away with its request
        return self._masks.upload([j for j, _ in matchers])

    def _verify_masks(self, reqs: list[Req], matchers: list[tuple[int, GrammarMatcher]], stale: frozenset[str],
                      counts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Masks of every verified position of the constrained requests: position i is masked with the grammar
        advanced through the request's first i drafts (rolled back after)."""
        starts = np.cumsum(counts) - counts
        mask = self._masks.rows(int(sum(int(counts[j]) for j, _ in matchers)))
        logit_rows: list[int] = []
        for j, matcher in matchers:
            c, req, k = int(counts[j]), reqs[j], len(logit_rows)
            logit_rows.extend(range(int(starts[j]), int(starts[j]) + c))
            if req.rid in stale or req.state is not ReqState.RUNNING:
                mask[k : k + c] = -1
                continue
            advanced = 0
            try:
                for i in range(c):
                    if i and not matcher.advance(int(req.draft_ids[i - 1])):
                        mask[k + i : k + c] = -1  # drafts are cut where the grammar refuses: never reached
                        break
                    advanced += int(i > 0)
                    matcher.fill_mask(mask[k + i])
            except Exception as exc:
                log.exception("grammar mask of request %s failed", req.rid)
                self._grammar_failures[req.rid] = f"constraint failed: {type(exc).__name__}: {exc}"
                mask[k : k + c] = -1
            finally:
                if advanced:
                    matcher.rollback(advanced)
        return self._masks.upload(logit_rows)

    def _on_tokens(self, req: Req, tokens: list[int], logprobs: list[float] | None,
                   tops: Sequence[TopLogprobs] | None, computed: bool) -> bool:
        """Take sampled tokens (one, or a verify step's kept ones). `computed`: a step already launched computes
        the token (overlap), so a jump-forward that replaces it must also rewind that position. Returns whether
        the request jumped forward (only a single token jumps: with speculation, forced text is drafted)."""
        if req.state is not ReqState.RUNNING:
            return False
        failure = self._grammar_failures.pop(req.rid, None)
        if failure is not None:
            self._finish(req, AbortFinish(failure))
            return False
        if req.first_token_time is None:
            req.first_token_time = time.perf_counter()
        matcher = req.matcher
        if matcher is not None:
            t0 = time.perf_counter()
            for n, t in enumerate(tokens):
                if not matcher.advance(t):
                    raise RuntimeError(f"sampled token {t} is not allowed by the grammar")
                if matcher.is_terminated() and n + 1 < len(tokens):  # the grammar ends inside kept drafts
                    tokens = tokens[: n + 1]
                    break
            self.counters.grammar_seconds += time.perf_counter() - t0
        if req.return_logprob:
            req.output_token_logprobs.extend(zip(logprobs if logprobs is not None else [None] * len(tokens), tokens))
            if req.top_logprobs_num:
                req.output_top_logprobs.extend(tops[: len(tokens)] if tops is not None else [None] * len(tokens))
        token = tokens[-1]
        new_ids = list(tokens)
        # a request that asks for logprobs samples every token (a jumped token has none to report)
        if matcher is not None and len(tokens) == 1 and self.spec_policy is None and not req.return_logprob:
            t0 = time.perf_counter()
            self._jump_declined = 0
            new_ids = self._jump_forward(req, token, computed)
            if len(new_ids) == 1 and self._jump_declined and req.thinking_close_ids is None:
                self._deferred_jumps.append((req, computed, self._jump_declined))
            if computed and new_ids[0] != token:
                self.scheduler.rewind(req, req.kv_len - 1)  # that step computed the replaced token
            self.counters.grammar_seconds += time.perf_counter() - t0
        if req.thinking_close_ids is not None:  # after jump-forward: forced text may close the section itself
            new_ids = self._close_thinking(req, new_ids)
        self._append(req, new_ids)
        return new_ids != tokens

    def _close_thinking(self, req: Req, new_ids: list[int]) -> list[int]:
        """`new_ids` under a thinking budget: once the budget is spent with the section still open, the tokens up to
        the budget and then `</think>` (forced, the grammar advanced through them; kept tokens past the budget,
        a verify step's, are dropped with their KV). A closed section ends the watch."""
        close = req.thinking_close_ids
        budget = req.params.thinking_budget
        assert close is not None and budget is not None, "called for a request with a thinking budget"
        done = len(req.output_ids)
        seq = req.output_ids[max(done - len(close) + 1, 0) :] + new_ids  # a close that ends in new_ids
        if any(seq[i : i + len(close)] == close for i in range(len(seq) - len(close) + 1)):
            req.thinking_close_ids = None  # the model closed it
            return new_ids
        if done + len(new_ids) < budget:
            return new_ids
        req.thinking_close_ids = None
        kept = new_ids[: max(budget - done, 1) if done < budget else 1]
        if len(kept) < len(new_ids):
            if req.matcher is not None:
                req.matcher.rollback(len(new_ids) - len(kept))
            fill = req.fill_len + len(kept)  # positions the kept tokens reach; KV past them was for dropped ones
            if req.kv_len > fill:
                self.scheduler.rewind(req, fill)
            if req.return_logprob:
                del req.output_token_logprobs[len(req.output_token_logprobs) - (len(new_ids) - len(kept)) :]
                if req.top_logprobs_num:
                    del req.output_top_logprobs[len(req.output_top_logprobs) - (len(new_ids) - len(kept)) :]
        room = max(req.output_budget(self.max_context) - len(kept), 0)
        forced = close[:room]
        if req.matcher is not None:
            forced = forced[: self._advance_all(req.matcher, forced)]
        if req.return_logprob:  # forced, not sampled: no logprob
            req.output_token_logprobs.extend((None, t) for t in forced)
            if req.top_logprobs_num:
                req.output_top_logprobs.extend(None for _ in forced)
        self.counters.jump_forward_tokens += len(forced)
        return kept + forced

    def _jump_forward(self, req: Req, token: int, computed: bool = False) -> list[int]:
        """The tokens to append for the sampled `token`: itself plus the text the grammar forces after it, appended
        without decode steps. The forced text is re-tokenized together with the sampled token, so the boundary
        token is the tokenizer's own choice (e.g. `"` + forced `name": ` becomes `"name` `":` ` `), not a split
        the model would never produce. Replacing the sampled token costs nothing unless a launched step already
        computes it (`computed`): then that position is computed again. Jumps are taken only where they pay
        (`_jump_pays`); `_count_jump` takes the rest of the forced chain (markers and the text after them)."""
        m = req.matcher
        assert m is not None, "only a constrained request jumps forward"
        if not self.config.enable_jump_forward or m.is_terminated():
            return [token]
        forced = whole_utf8_prefix(m.forced_suffix())
        if not forced:  # maybe special tokens the grammar forces right after this one (`_count_jump` takes them)
            if m.forced_token() is None or not self._jump_pays(1, 1):
                return [token]
            return self._count_jump(req, [token], int(computed))
        # a byte is a token at most: no need to tokenize (declined, it counts as ~3 bytes a token)
        if not self._jump_pays(len(forced), 1, declined_saves=-(-len(forced) // 3)):
            return [token]
        budget = req.output_budget(self.max_context)  # the sampled token counts against it too
        try:
            joint = (self.tokenizer.token_bytes(token) + forced).decode("utf-8")
        except UnicodeDecodeError:  # the sampled token ends inside a character: keep it, jump after it
            joint = None
        if joint is not None:
            ids = self._encode_forced(joint)[:budget]
            replaced = bool(ids) and ids[0] != token
            kept = int(computed and not replaced)  # the first id is the token a launched step computes
            ids = self._fit_row(ids, kept)
            # A replaced token absorbs the forced text (at least a step saved), less the step it recomputes.
            saved = max(len(ids) - 1, 1) - int(computed) if replaced else len(ids) - 1
            if not self._jump_pays(saved, len(ids) - kept - 1):
                return [token]
            if replaced:
                m.rollback(1)
                taken = self._advance_all(m, ids)
                if taken == len(ids):
                    return self._count_jump(req, ids, 0, int(computed))  # a replaced token is in the row
                m.rollback(taken)
                m.advance(token)
            elif ids:
                return self._count_jump(req, [token] + ids[1 : 1 + self._advance_all(m, ids[1:])], kept)
        after = self._forced_text_ids(forced, budget - 1, computed)
        if after is None or not self._jump_pays(len(after), len(after) - int(computed)):
            return [token]  # None: it starts inside a character the sampled token began
        return self._count_jump(req, [token] + after[: self._advance_all(m, after)], int(computed))

    def _forced_text_ids(self, forced: bytes, budget: int, computed: bool) -> list[int] | None:
        """The ids of forced text after a token, at most `budget` and cut to fit the next step's row, which holds
        that token too unless a launched step computes it; None when the text starts inside a character."""
        try:
            text = forced.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return self._fit_row(self._encode_forced(text)[:budget] if text else [], int(computed) - 1)

    def _encode_forced(self, text: str, continued: bool = True) -> list[int]:
        """Forced text's token ids (`Tokenizer.encode` without special tokens; `continued`: after other tokens), a
        fresh list, from a bounded cache: requests through one schema meet the same keys and closings at every
        step, and tokenizing them again was most of a jump check's cost at large batches."""
        key = (text, continued)
        ids = self._forced_ids.get(key)
        if ids is None:
            ids = self.tokenizer.encode(text, add_special_tokens=False, continued=continued)
            self._forced_ids[key] = ids
            if len(self._forced_ids) > FORCED_IDS_CACHED:
                self._forced_ids.popitem(last=False)
        else:
            self._forced_ids.move_to_end(key)
        return list(ids)

    def _fit_row(self, ids: list[int], outside: int) -> list[int]:
        """`ids` cut so that their step's row, which holds `len(ids) - outside` tokens, fits the multi-token CUDA
        graphs (the rest of the forced text is taken at a later step): a jump then does not leave the graphs."""
        most = self.runner.max_graph_row_tokens
        return ids if most is None else ids[: max(most + outside, 0)]

    def _jump_pays(self, saved_steps: int, extra_tokens: int, declined_saves: int | None = None) -> bool:
        """Does appending the forced tokens in one step (`extra_tokens` more than the request's one token of a
        decode step) raise throughput? The next step replays the multi-token graph that holds the step's tokens
        or, when none does, runs eagerly, and every running request pays for it: with B running, a step costing
        c decode steps' time pays when the tokens it adds beyond one per request make up for it,
        saved >= B * (c - 1), c counted beyond what the jumps already taken while delivering this step cost
        (`_jump_extra_tokens`: tokens that fit the graph they already need are free) and including, for the
        first jump of an overlapped delivery, the wait for the host it causes (`_sync_penalty`). Always, when the
        step is eager anyway (requests are waiting to be admitted: their prefill runs with it). A declined jump
        is remembered with the tokens it would save (`declined_saves` where `saved_steps` is only a bound), so
        that jumps which do not pay alone are taken together at the end of the delivery when their sum does."""
        if saved_steps < 1:
            return False
        running = len(self.scheduler.running)
        if self.scheduler.waiting and running < self.config.max_running_requests:
            return True
        planned = self._jump_extra_tokens
        penalty = self._sync_penalty(running)
        before = self.runner.jump_step_cost(running, planned) + penalty if planned > 0 else 1.0
        cost = self.runner.jump_step_cost(running, planned + max(extra_tokens, 0)) + penalty
        if saved_steps >= max(running, 1) * (cost - before):
            return True
        # declined: `_take_deferred_jumps` weighs it again with the others declined for this step
        self._jump_declined = max(self._jump_declined, saved_steps if declined_saves is None else declined_saves)
        return False

    def _sync_penalty(self, running: int) -> float:
        """Decode steps' worth of time the first jump of an overlapped delivery adds: the step it makes cannot be
        launched before the host has delivered the step in flight, so the device waits for one delivery (about
        as long as this one). 0 where nothing overlaps or no graph step was timed (the CPU: every step eager)."""
        if not self._delivering_overlapped:
            return 0.0
        decode = self.runner.decode_seconds(running)
        return self._deliver_seconds / decode if decode else 0.0

    @staticmethod
    def _advance_all(matcher: GrammarMatcher, ids: list[int]) -> int:
        """Advance through `ids` until one is refused; returns how many were taken."""
        for n, t in enumerate(ids):
            if not matcher.advance(t):
                return n
        return len(ids)

    def _count_jump(self, req: Req, ids: list[int], outside: int, lost: int = 0) -> list[int]:
        """A jump's tokens (the first `outside` of them outside its step's row: computed by a launched step; `lost`:
        steps it costs, a launched step's replaced token) with the rest of the forced chain after them: each
        special token the grammar forces (a marker such as `<tool_call>`: no text, so the forced text stops before
        it) and the text it forces after that marker, while the row fits the graphs and the output budget holds,
        text only where the longer jump still pays; counted as steps saved."""
        m = req.matcher
        assert m is not None, "only a constrained request jumps forward"
        most = self.runner.max_graph_row_tokens
        budget = req.output_budget(self.max_context)
        cap = budget if most is None else min(budget, most + outside)  # the most ids the jump may hold
        while len(ids) < cap:
            marker = m.forced_token()
            if marker is None or not m.advance(marker):
                break
            ids.append(marker)
            more = self._text_after(m, marker)[: cap - len(ids)]
            if more and self._jump_pays(len(ids) - 1 - lost + len(more), len(ids) + len(more) - outside - 1):
                taken = self._advance_all(m, more)  # a refused token ends the chain: its forced text is left
                ids += more[:taken]
        req.decode_steps_saved += len(ids) - 1
        self.counters.jump_forward_tokens += len(ids) - 1
        self._jump_extra_tokens += max(len(ids) - outside - 1, 0)
        return ids

    def _text_after(self, m: GrammarMatcher, marker: int) -> list[int]:
        """The text the grammar forces right after `marker` (just advanced), tokenized as the tokenizer tokenizes
        it after that token: encoded behind the marker's spelling, so nothing merges across it and a tokenizer
        that prefixes text with a space (Metaspace) does not prefix it there; encoded alone where the tokenizer
        does not read the spelling as the marker."""
        try:
            text = whole_utf8_prefix(m.forced_suffix()).decode("utf-8")
        except UnicodeDecodeError:
            return []
        if not text:
            return []
        spelled = self.tokenizer.token_bytes(marker).decode("utf-8", "replace")
        ids = self._encode_forced(spelled + text, continued=False)
        return ids[1:] if ids[:1] == [marker] else self._encode_forced(text, continued=False)

    def _append(self, req: Req, ids: list[int]) -> None:
        """Record new output tokens, check stop conditions, stream the text delta, finish if done.

        Text is produced per step only where someone needs it per step (a streaming caller, or stop strings to
        match); otherwise the output is detokenized once, at the finish.
        """
        self.counters.generated_tokens += len(ids)
        checker = req.stop_checker
        assert checker is not None, "the engine front gives every request a stop checker"
        finish: FinishReason | None = None
        kept = 0
        for t in ids:
            req.output_ids.append(t)
            kept += 1
            finish = checker.check_token(t, len(req.output_ids))
            # The matcher has already consumed all of `ids` (jump-forward tokens included): ask it only at the end.
            if finish is None and kept == len(ids) and req.matcher is not None and req.matcher.is_terminated():
                finish = StopFinish(t if t in self._eos_set else None)
            if finish is None and req.output_budget(self.max_context) <= 0:
                finish = LengthFinish()
            if finish is not None:
                break
        if not (req.stream or req.params.stop or req.params.stop_regex):
            if finish is not None:
                self._finish(req, finish)
            return
        text = self._text_so_far(req, finished=finish is not None)
        if finish is None and checker.stop_string_hit is not None:
            finish = StopFinish(checker.stop_string_hit)
            text += self._text_so_far(req, finished=True)
        if finish is not None:
            self._finish(req, finish, delta_text=text, delta_ids=ids[:kept])
        elif req.stream and (text or ids):
            assert req.sink is not None, "a streaming caller reads a sink"
            req.sink.put(StreamChunk(text, ids[:kept]))

    def _text_so_far(self, req: Req, finished: bool) -> str:
        """Detokenize the output tokens not yet turned into text (through the stop checker)."""
        assert req.stop_checker is not None and req.detok is not None, "set by the engine front"
        new = req.output_ids[req.text_pos :]
        req.text_pos = len(req.output_ids)
        req.text_done = finished
        text = req.stop_checker.feed_text(req.detok, new, finished=finished)
        req.emitted_text += text
        return text

    # ---------------------------------------------------------------- finish
    def _finish(self, req: Req, reason: FinishReason, delta_text: str = "", delta_ids: list[int] | None = None) -> None:
        if req.state is ReqState.FINISHED:
            return
        if req.beam_group is not None and req.beam_group != req.rid:  # one beam: its whole search ends
            self.scheduler.finish(req)
            root = self.reqs.get(req.beam_group)
            if root is not None:
                self._finish(root, reason)
            return
        self.beams.end(req)
        self.contrastive.end(req)
        self._beam_searches -= req.params.is_beam_search
        self._contrastive_searches -= req.params.is_contrastive
        if not req.text_done:
            delta_text += self._text_so_far(req, finished=True)
        if req.state is ReqState.RUNNING and req.kv_len > req.fill_len:
            # positions computed for tokens it never kept (a verify step's drafts after a stop, a step in flight)
            self.scheduler.rewind(req, req.fill_len)
        self.scheduler.finish(req)
        if self.drafter is not None:
            self.drafter.release(req.rid)
        self.reqs.pop(req.rid, None)
        self._grammar_failures.pop(req.rid, None)
        req.finish_reason = reason
        c = self.counters
        c.finished += 1
        c.aborted += isinstance(reason, AbortFinish)
        c.prompt_tokens += req.prompt_len
        c.cached_tokens += req.cached_tokens
        if req.sink is not None:
            # A streaming caller has had every earlier delta; any other caller gets the whole output now.
            text = delta_text if req.stream else req.emitted_text
            ids = (delta_ids or []) if req.stream else list(req.output_ids)
            req.sink.put(StreamChunk(text, ids, self.meta_info(req, reason)))

    @staticmethod
    def meta_info(req: Req, reason: FinishReason) -> MetaInfo:
        """The report of `req`, finished for `reason`."""
        now = time.perf_counter()
        logprobs = req.return_logprob
        tops = logprobs and req.top_logprobs_num > 0
        return MetaInfo(
            id=req.rid,
            prompt_tokens=req.prompt_len,
            completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            finish_reason=reason,
            e2e_latency=now - req.created,
            decode_steps_saved=req.decode_steps_saved,
            spec_verify_steps=req.spec_verify_steps,
            spec_draft_tokens=req.spec_draft_tokens,
            spec_accepted_tokens=req.spec_accepted_tokens,
            ttft=None if req.first_token_time is None else req.first_token_time - req.created,
            constraint_relaxations=req.grammar.relaxations if req.grammar is not None else (),
            constraint_narrowings=req.grammar.narrowings if req.grammar is not None else (),
            input_token_logprobs=req.input_token_logprobs if logprobs else None,
            output_token_logprobs=req.output_token_logprobs if logprobs else None,
            input_top_logprobs=req.input_top_logprobs if tops else None,
            output_top_logprobs=req.output_top_logprobs if tops else None,
            cumulative_logprob=req.beam_results[0].cumulative_logprob if req.beam_results else None,
            beam_score=req.beam_results[0].score if req.beam_results else None,
            finished_beams=req.beam_results,
        )

    def _fail_running(self, message: str) -> None:
        self._inflight = None
        for req in list(self.scheduler.running):
            self._finish(req, AbortFinish(message))
        for req in [r for r in self.reqs.values() if r.state is ReqState.BEAMS]:
            self._finish(req, AbortFinish(message))

    # ------------------------------------------------------------ inspection
    def flush_cache(self) -> bool:
        """Drop every cached prefix (only when no request is running or waiting)."""
        if self.scheduler.has_work():
            return False
        freed = self.cache.reset()
        if len(freed):
            self.allocator.free(freed)
        return True

    def stats(self) -> dict:
        c = self.counters
        cache_stats = self.cache.stats()
        total = self.allocator.num_slots - 1
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "kv_slots_total": total,
            "kv_slots_free": self.allocator.num_free,
            "kv_slots_cached": cache_stats.cached_tokens,
            "kv_usage": 1.0 - self.allocator.num_free / total,
            "cache_nodes": cache_stats.num_nodes,
            **{k: getattr(c, k) for k in c.__dataclass_fields__},
            "grammar_us_per_request_step_p50": self.grammar_us_per_request.quantile(0.5),
            "grammar_us_per_request_step_p90": self.grammar_us_per_request.quantile(0.9),
            "spec_accept_rate": c.spec_accepted_tokens / c.spec_draft_tokens if c.spec_draft_tokens else None,
        }



def _may_speculate(req: Req) -> bool:
    """Penalties count every earlier token, so a drafted position would need the drafts before it counted:
    requests with a penalty decode one token per step."""
    p = req.params
    return (not p.is_beam_search and not p.is_contrastive and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0
            and p.repetition_penalty == 1.0)
