"""Decode forwards captured as CUDA graphs, one per batch-size bucket, and replayed.

A decode step of a large model is hundreds of small kernel launches; at small batches the CPU cannot issue them
as fast as the GPU runs them. Capturing the whole decode forward once per bucket (1, 2, 4, 8, 16, 24, 32, 48,
64, 80, ... up to `max_bs`) and replaying it costs one launch per step.

Decode steps in which some requests append several tokens (a grammar's forced text, jump-forward) would leave
the graphs for an eager step, which costs several decode steps' time; with `row_tokens` the runner also
captures, per bucket, forwards of rows of up to max(row_tokens) new tokens each, every row through the
multi-token kernel, one logits row per request, at a few total token counts (`token_buckets`: a step in which
a handful of requests jump runs a few positions more than a decode step, not k per row). With `verify_max_bs` it
captures rows of each k in row_tokens once more for buckets up to that size, k tokens a row, with a logits row
for every token (a speculative verify step scores each drafted position).

A graph replays with fixed tensor addresses, so every input lives in a static buffer of `max_bs` rows. A batch
of `n` requests runs in the smallest bucket >= n: its rows are copied into rows [0, n) and rows [n, bucket)
are padding, which

    reads token 0 at position 0, writes its K/V to the reserved slot kv_pool.PADDING_SLOT (never read), and has
    seq_len 0, so decode attention reads nothing and returns zeros for it;

their logits rows are computed and dropped. A multi-token batch's tokens are packed at the front of the token
buffers; the tokens after them are padding of the same kind, and belong to no request. Invariant: rows >=
`self._live_rows` and tokens >= `self._live_tokens` of the static buffers hold padding values, so a step only
rewrites what a larger earlier batch left behind.

The split count of the decode attention kernel depends on (batch, max_seq_len) and is baked into a graph, so
every graph is captured with max_seq_len = the context length; the kernels read the real lengths from
`seq_lens` at each replay (docs/kernels.md, "CUDA graphs"). The captured `forward` is the model with its
attention backend's plan of the batch, so the backend plans inside the capture: whatever tensors its plan
derives are recomputed from the static buffers at each replay (the Triton backend's plan of a decode batch is
only views of them).

On a CPU (tests) the same buffers and padding run eagerly (`use_graphs=False`), so everything except the
capture itself is tested without CUDA.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator

import torch

from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode
from radixgen.runtime.kv_pool import PADDING_SLOT

log = logging.getLogger(__name__)


def token_buckets(bs: int, k: int) -> list[int]:
    """Total token counts of bucket `bs`'s multi-token graphs (rows of up to k tokens): bs + 2, bs + 8, bs + 32,
    ... (x4) below bs * k, and bs * k. None for k < 2."""
    if k < 2:
        return []
    most = bs * k
    counts = []
    extra = 2
    while bs + extra < most:
        counts.append(bs + extra)
        extra *= 4
    return counts + [most]


def graph_batch_sizes(max_bs: int) -> list[int]:
    """Buckets 1, 2, 4, 8, 16, 24, 32, 48, 64, 80, ... (every 16 from 48), capped by and ending at `max_bs`."""
    if max_bs < 1:
        raise ValueError(f"cuda_graph_max_bs must be >= 1, got {max_bs}")
    sizes = [1, 2, 4, 8, 16, 24, 32] + list(range(48, max_bs + 1, 16))
    sizes = [s for s in sizes if s < max_bs]
    return sizes + [max_bs]


class CudaGraphRunner:
    """Captures `forward` (batch -> fp32 logits: the model, its KV pool and its attention plan) of a decode batch
    per bucket at construction; `replay(batch)` runs a decode batch.

    With `row_tokens` (e.g. (2, 4, 8)) it also captures, per bucket and per token count of `token_buckets`, a
    forward of rows of up to max(row_tokens) new tokens each, one logits row per request (a decode step in which
    some requests append forced tokens): `short_rows(batch)` says which token count takes a batch,
    `replay_short(batch, tokens)` runs it. Its tokens sit packed at the front of the token buffers, padding
    tokens after them; a padding request has no tokens."""

    def __init__(self, forward: Callable[[ForwardBatch], torch.Tensor], req_to_token: torch.Tensor, max_bs: int,
                 max_context: int, use_graphs: bool | None = None, row_tokens: tuple[int, ...] = (),
                 verify_max_bs: int = 0,
                 forward_with_hidden: Callable[[ForwardBatch], tuple[torch.Tensor, torch.Tensor]] | None = None,
                 ) -> None:
        self.forward = forward
        # With it, the decode graphs also keep the final hidden states of their rows (contrastive search reads
        # them: `replay_with_hidden`); the multi-token and verify graphs keep logits only.
        self.forward_with_hidden = forward_with_hidden
        self.req_to_token = req_to_token
        self.max_context = max_context
        self.device = req_to_token.device
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        if self.use_graphs and self.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        if any(k < 2 for k in row_tokens):
            raise ValueError(f"multi-token graph rows hold at least 2 tokens, got {row_tokens}")
        self.batch_sizes = graph_batch_sizes(max_bs)
        self.max_bs = self.batch_sizes[-1]
        self.row_tokens = tuple(sorted(set(row_tokens)))
        n, dev = self.max_bs, self.device
        tokens = n * max(self.row_tokens, default=1)
        self.input_ids = torch.zeros(tokens, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(tokens, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.full((tokens,), PADDING_SLOT, dtype=torch.int64, device=dev)
        self.req_pool_indices = torch.zeros(n, dtype=torch.int64, device=dev)
        self.prefix_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.extend_lens = torch.ones(n, dtype=torch.int32, device=dev)  # never changes: one token per row
        self.extend_start_loc = torch.arange(n, dtype=torch.int32, device=dev)  # never changes
        # The multi-token graphs' rows: tokens of each request (0 for padding), its first token, its logits row.
        self.row_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.row_starts = torch.zeros(n, dtype=torch.int32, device=dev)
        self.logits_rows = torch.zeros(n, dtype=torch.int64, device=dev)
        # The verify graphs' logits rows: every token of rows [0, verify bucket) (padding rows read token 0).
        self.verify_sizes = [bs for bs in self.batch_sizes if bs <= verify_max_bs] if self.row_tokens else []
        verify_tokens = max(self.verify_sizes, default=0) * max(self.row_tokens, default=1)
        self.verify_logits_rows = torch.zeros(verify_tokens, dtype=torch.int64, device=dev)
        self._live_verify_rows = 0
        # the host copy of the row layout (`_row_layout`) that row_lens, row_starts and verify_logits_rows hold
        # for the last verify replay; None once anything else rewrote them
        self._verify_layout: tuple[bytes, bytes] | None = None
        self._live_rows = 0
        self._live_tokens = 0
        self.replays = 0  # decode steps served (a count for stats and tests)
        self.short_replays = 0  # multi-token steps served
        self.verify_replays = 0  # verify steps served
        self.batches = {bs: self._static_batch(bs) for bs in self.batch_sizes}
        self.max_row_tokens = max(self.row_tokens, default=0)  # the multi-token graphs' rows; 0: none
        # per bucket, the total token counts of its multi-token graphs, ascending (`token_buckets`)
        self.token_counts = {bs: token_buckets(bs, self.max_row_tokens) for bs in self.batch_sizes}
        self.short_batches = {(bs, t): self._static_short_batch(bs, self.max_row_tokens, tokens=t)
                              for bs, counts in self.token_counts.items() for t in counts}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.hidden_outputs: dict[int, torch.Tensor] = {}  # per bucket, with `forward_with_hidden`
        self.short_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.short_outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.verify_batches = {(bs, k): self._static_short_batch(bs, k, every_token=True) for bs in self.verify_sizes
                               for k in self.row_tokens}
        self.verify_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.verify_outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.verify_replay_seconds: dict[tuple[int, int], float] = {}
        # Seconds of one eager decode forward per bucket, and of one replay per graph, timed at capture: what a
        # step costs inside and outside the graphs (the engine's jump-forward policy weighs it).
        self.eager_seconds: dict[int, float] = {}
        self.replay_seconds: dict[int, float] = {}
        self.short_replay_seconds: dict[tuple[int, int], float] = {}
        # ... and as they run with real contexts (a padding row reads no KV at capture): per (bucket, k), k = 1
        # for the decode graphs.
        self.measured = ReplayTimes() if self.use_graphs else None
        if self.use_graphs:
            self._capture_all()

    def _static_batch(self, bs: int) -> ForwardBatch:
        """The ForwardBatch over rows [0, bs) of the static buffers (what a graph of bucket `bs` reads)."""
        return ForwardBatch(
            mode=ForwardMode.DECODE, input_ids=self.input_ids[:bs], positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs], req_pool_indices=self.req_pool_indices[:bs],
            req_to_token=self.req_to_token, prefix_lens=self.prefix_lens[:bs], extend_lens=self.extend_lens[:bs],
            seq_lens=self.seq_lens[:bs], extend_start_loc=self.extend_start_loc[:bs], logits_indices=None,
            max_extend_len=1, max_seq_len=self.max_context, num_decode_rows=bs,
        )

    def _static_short_batch(self, bs: int, k: int, every_token: bool = False, tokens: int | None = None,
                            ) -> ForwardBatch:
        """The ForwardBatch of bucket `bs` with up to `k` tokens per request and `tokens` in all (bs * k by
        default; every row through the multi-token kernel, whose grid the fixed k and bs size); logits of each
        request's last token, or of `every_token`."""
        t = bs * k if tokens is None else tokens
        logits = self.verify_logits_rows[:t] if every_token else self.logits_rows[:bs]
        return ForwardBatch(
            mode=ForwardMode.EXTEND, input_ids=self.input_ids[:t], positions=self.positions[:t],
            out_cache_loc=self.out_cache_loc[:t], req_pool_indices=self.req_pool_indices[:bs],
            req_to_token=self.req_to_token, prefix_lens=self.prefix_lens[:bs], extend_lens=self.row_lens[:bs],
            seq_lens=self.seq_lens[:bs], extend_start_loc=self.row_starts[:bs], logits_indices=logits,
            max_extend_len=k, max_seq_len=self.max_context, num_decode_rows=0,
        )

    def _forward(self, bs: int) -> torch.Tensor:
        """The decode forward of bucket `bs` over the static buffers, the attention plan included (keeping the
        hidden states in `hidden_outputs` where the runner has `forward_with_hidden`)."""
        if self.forward_with_hidden is None:
            return self.forward(self.batches[bs])
        logits, self.hidden_outputs[bs] = self.forward_with_hidden(self.batches[bs])
        return logits

    def _short_forward(self, key: tuple[int, int]) -> torch.Tensor:
        return self.forward(self.short_batches[key])

    def _verify_forward(self, key: tuple[int, int]) -> torch.Tensor:
        return self.forward(self.verify_batches[key])

    @torch.inference_mode()
    def _capture_all(self) -> None:
        """Capture the largest bucket first, all graphs sharing one memory pool (a smaller graph's activations
        fit in the blocks the larger one freed); the multi-token graphs, larger still, before the decode ones."""
        start = time.perf_counter()
        self._graph_pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device=self.device)
        for key in sorted(self.verify_batches, key=lambda bk: -bk[0] * bk[1]):
            run = functools.partial(self._verify_forward, key)
            self.verify_outputs[key], self.verify_graphs[key], _, self.verify_replay_seconds[key] = (
                self._capture(run, stream))
        for key in sorted(self.short_batches, key=lambda bt: -bt[1]):
            run = functools.partial(self._short_forward, key)
            self.short_outputs[key], self.short_graphs[key], _, self.short_replay_seconds[key] = (
                self._capture(run, stream))
        for bs in reversed(self.batch_sizes):
            run = functools.partial(self._forward, bs)
            self.outputs[bs], self.graphs[bs], self.eager_seconds[bs], self.replay_seconds[bs] = (
                self._capture(run, stream))
        torch.cuda.synchronize(self.device)
        log.info("captured %d decode, %d multi-token and %d verify CUDA graphs (batch %d..%d) in %.1f s",
                 len(self.graphs), len(self.short_graphs), len(self.verify_graphs), self.batch_sizes[0], self.max_bs,
                 time.perf_counter() - start)

    def _capture(self, run: Callable[[], torch.Tensor],
                 stream: torch.cuda.Stream) -> tuple[torch.Tensor, torch.cuda.CUDAGraph, float, float]:
        """Warm `run` up on `stream` (Triton compiles, the allocator settles; padding rows write only the reserved
        slot), capture it, and time it: (the graph's output, the graph, seconds eagerly, seconds per replay)."""
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            run()
            eager = _timed(run, self.device)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool, stream=stream):
            out = run()
        graph.replay()
        return out, graph, eager, _timed(graph.replay, self.device)

    def step_cost(self, batch_size: int, row_tokens: int) -> float:
        """A verify step of `batch_size` requests of up to `row_tokens` tokens each, every token scored, in decode
        steps' time: that of the verify graph taking it, else that of an eager forward (`_decode_steps`). 1 where
        nothing was timed (no graphs: every step is eager)."""
        bs = self.bucket(min(batch_size, self.max_bs))
        k = next((k for k in self.row_tokens if k >= row_tokens), None)
        if k is None:
            return self._decode_steps(bs, None, None)
        return self._decode_steps(bs, (bs, -k), self.verify_replay_seconds.get((bs, k)))  # measured as (bs, -k)

    def jump_step_cost(self, batch_size: int, extra_tokens: int) -> float:
        """A decode step of `batch_size` requests in which some append `extra_tokens` tokens beyond one each (in
        rows of at most `max(row_tokens)`), in decode steps' time: that of the multi-token graph of the smallest
        token count that holds them (`_decode_steps`). 1 where nothing was timed or nothing is appended."""
        n = min(batch_size, self.max_bs)
        bs = self.bucket(n)
        if extra_tokens <= 0:
            return 1.0
        t = self._token_bucket(bs, n + extra_tokens)
        if t is None:
            return self._decode_steps(bs, None, None)
        return self._decode_steps(bs, (bs, t), self.short_replay_seconds.get((bs, t)))

    def _decode_steps(self, bs: int, key: tuple[int, int] | None, captured: float | None) -> float:
        """Seconds of graph `key` of bucket `bs` (None: an eager forward) over those of its decode graph, both as
        they run. One not replayed yet is priced at its capture time plus what the decode replays take beyond
        theirs at capture: padding rows read no KV at capture, and real contexts add the same reads to either
        graph (pricing it at its capture time alone made jumps look cheaper than they run). At least 1; 1 where
        nothing was timed."""
        seen = self.measured.seconds if self.measured is not None else {}
        at_capture = self.replay_seconds.get(bs)
        decode = seen.get((bs, 1)) or at_capture
        if not decode:
            return 1.0
        cost = seen.get(key) if key is not None else None
        if cost is None:
            base = captured if captured is not None else self.eager_seconds.get(bs, decode)
            cost = base + max(decode - (at_capture or decode), 0.0)
        return max(1.0, cost / decode)

    def _token_bucket(self, bs: int, tokens: int) -> int | None:
        """The smallest token count of bucket `bs`'s multi-token graphs >= `tokens`, or None."""
        counts = self.token_counts[bs]
        i = bisect.bisect_left(counts, tokens)
        return counts[i] if i < len(counts) else None

    def decode_seconds(self, batch_size: int) -> float | None:
        """GPU seconds of a decode step of `batch_size` requests (its graph's replays as they run, else as timed
        at capture); None where nothing was timed."""
        bs = self.bucket(min(batch_size, self.max_bs))
        seen = self.measured.seconds if self.measured is not None else {}
        return seen.get((bs, 1)) or self.replay_seconds.get(bs)

    def bucket(self, batch_size: int) -> int:
        """The smallest captured batch size >= batch_size."""
        return self.batch_sizes[bisect.bisect_left(self.batch_sizes, batch_size)]

    def can_run(self, batch: ForwardBatch) -> bool:
        """A decode batch that fits a bucket, reads this pool's req_to_token, and wants one logits row per request
        (the graphs compute exactly those; a decode batch's logits_indices is then arange(batch_size))."""
        n = batch.batch_size
        return (batch.mode is ForwardMode.DECODE and 0 < n <= self.max_bs and batch.num_tokens == n
                and batch.req_to_token is self.req_to_token and batch.max_seq_len <= self.max_context
                and (batch.logits_indices is None or batch.logits_indices.shape[0] == n))

    def short_rows(self, batch: ForwardBatch) -> int | None:
        """The token count of the multi-token graph that runs this batch (its requests' new tokens at most
        max(row_tokens) each, one logits row per request), or None."""
        n = batch.batch_size
        if not (self.row_tokens and batch.mode is ForwardMode.EXTEND and 0 < n <= self.max_bs
                and batch.req_to_token is self.req_to_token and batch.max_seq_len <= self.max_context
                and (batch.logits_indices is None or batch.logits_indices.shape[0] == n)):
            return None
        if batch.max_extend_len > self.max_row_tokens:
            return None
        return self._token_bucket(self.bucket(n), batch.num_tokens)

    def verify_rows(self, batch: ForwardBatch) -> int | None:
        """The k of the verify graph that runs this batch (its requests' new tokens at most k each, a logits row
        for more tokens than requests, within its bucket's bs * k), or None."""
        n = batch.batch_size
        if not (self.verify_sizes and batch.mode is ForwardMode.EXTEND and 0 < n <= self.verify_sizes[-1]
                and batch.req_to_token is self.req_to_token and batch.max_seq_len <= self.max_context
                and batch.logits_indices is not None and batch.logits_indices.shape[0] > n):
            return None
        k = next((k for k in self.row_tokens if k >= batch.max_extend_len), None)
        if k is None or batch.logits_indices.shape[0] > self.bucket(n) * k:
            return None
        return k

    @torch.inference_mode()
    def replay_verify(self, batch: ForwardBatch, k: int) -> torch.Tensor:
        """Run a batch `verify_rows` gave `k` for: fp32 logits of the batch's logits rows, a fresh tensor."""
        assert batch.logits_indices is not None, "a verify batch names its logits rows"
        n, r = batch.batch_size, batch.logits_indices.shape[0]
        key = (self.bucket(n), k)
        self._set_tokens(batch)
        self._set_rows(batch)
        layout = _row_layout(batch)
        if layout is None or layout != self._verify_layout:  # a steady speculating batch keeps its layout
            self.row_lens[:n].copy_(batch.extend_lens)
            self.row_starts[:n].copy_(batch.extend_start_loc)
            self.verify_logits_rows[:r].copy_(batch.logits_indices)
            if self._live_verify_rows > r:
                self.verify_logits_rows[r : self._live_verify_rows].zero_()
            self._live_verify_rows = r
            self._verify_layout = layout
        self.verify_replays += 1
        if self.use_graphs:
            with self._timing((key[0], -k)):
                self.verify_graphs[key].replay()
            logits = self.verify_outputs[key]
        else:
            logits = self._verify_forward(key)
        return logits[:r].clone()

    @torch.inference_mode()
    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """Run a decode batch (`can_run` must hold): fp32 logits [batch_size, vocab], a fresh tensor."""
        n = batch.batch_size
        # A copy: the graph's output buffer is overwritten by the next replay.
        return self._replay_decode(batch)[:n].clone()

    @torch.inference_mode()
    def replay_with_hidden(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """`replay`'s logits and the final hidden states of the same rows (fresh tensors); the runner needs
        `forward_with_hidden`."""
        assert self.forward_with_hidden is not None, "the decode graphs were captured without hidden states"
        n = batch.batch_size
        logits = self._replay_decode(batch)
        return logits[:n].clone(), self.hidden_outputs[self.bucket(n)][:n].clone()

    def _replay_decode(self, batch: ForwardBatch) -> torch.Tensor:
        """Replay (or, without graphs, run) the decode graph of the batch's bucket: its logits buffer."""
        bs = self.bucket(batch.batch_size)
        self._set_tokens(batch)
        self._set_rows(batch)
        self.replays += 1
        if not self.use_graphs:
            return self._forward(bs)
        with self._timing((bs, 1)):
            self.graphs[bs].replay()
        return self.outputs[bs]

    @torch.inference_mode()
    def replay_short(self, batch: ForwardBatch, tokens: int) -> torch.Tensor:
        """Run a batch `short_rows` gave `tokens` for: fp32 logits [batch_size, vocab] of each request's logits
        row."""
        n = batch.batch_size
        key = (self.bucket(n), tokens)
        self._set_tokens(batch)
        self._set_rows(batch)
        self.row_lens[:n].copy_(batch.extend_lens)
        self.row_starts[:n].copy_(batch.extend_start_loc)
        self._verify_layout = None
        self.logits_rows[:n].copy_(batch.logits_indices if batch.logits_indices is not None
                                   else batch.last_token_indices())
        self.short_replays += 1
        if self.use_graphs:
            with self._timing(key):
                self.short_graphs[key].replay()
            logits = self.short_outputs[key]
        else:
            logits = self._short_forward(key)
        return logits[:n].clone()

    @contextlib.contextmanager
    def _timing(self, key: tuple[int, int]) -> Iterator[None]:
        assert self.measured is not None, "replays are timed where graphs run"
        start = self.measured.start()
        yield
        self.measured.stop(key, start)

    def _set_tokens(self, batch: ForwardBatch) -> None:
        """Tokens [0, T) from the batch; tokens a larger earlier batch used become padding again."""
        t = batch.num_tokens
        self.input_ids[:t].copy_(batch.input_ids)
        self.positions[:t].copy_(batch.positions)
        self.out_cache_loc[:t].copy_(batch.out_cache_loc)
        if self._live_tokens > t:
            self.input_ids[t : self._live_tokens].zero_()
            self.positions[t : self._live_tokens].zero_()
            self.out_cache_loc[t : self._live_tokens].fill_(PADDING_SLOT)
        self._live_tokens = t

    def _set_rows(self, batch: ForwardBatch) -> None:
        """Requests [0, n) from the batch; requests a larger earlier batch used become padding again."""
        n = batch.batch_size
        self.req_pool_indices[:n].copy_(batch.req_pool_indices)
        self.prefix_lens[:n].copy_(batch.prefix_lens)
        self.seq_lens[:n].copy_(batch.seq_lens)
        if self._live_rows > n:
            self._pad_rows(n, self._live_rows)
        self._live_rows = n

    def _pad_rows(self, lo: int, hi: int) -> None:
        self._verify_layout = None
        self.req_pool_indices[lo:hi].zero_()
        self.prefix_lens[lo:hi].zero_()
        self.seq_lens[lo:hi].zero_()
        self.row_lens[lo:hi].zero_()
        self.row_starts[lo:hi].zero_()
        self.logits_rows[lo:hi].zero_()


def _row_layout(batch: ForwardBatch) -> tuple[bytes, bytes] | None:
    """A verify batch's tokens per request and logits rows as host bytes (what row_lens, row_starts and
    verify_logits_rows are set from), or None where the batch lacks their host copies."""
    if batch.host_extend_lens is None or batch.host_logits_indices is None:
        return None
    return batch.host_extend_lens.tobytes(), batch.host_logits_indices.tobytes()


class ReplayTimes:
    """GPU seconds of graph replays as they run, smoothed per graph: CUDA events around each replay, read once
    they have completed (never waited on), so timing costs the loop no sync."""

    SMOOTHING = 0.2  # weight of the newest replay

    def __init__(self) -> None:
        self.seconds: dict[tuple[int, int], float] = {}
        self._pending: collections.deque[tuple[tuple[int, int], torch.cuda.Event, torch.cuda.Event]] = (
            collections.deque())

    def start(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, key: tuple[int, int], start: torch.cuda.Event) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending.append((key, start, end))
        while self._pending and self._pending[0][2].query():
            done, a, b = self._pending.popleft()
            t = a.elapsed_time(b) / 1e3
            old = self.seconds.get(done)
            self.seconds[done] = t if old is None else old + self.SMOOTHING * (t - old)
        while len(self._pending) > 64:  # a stalled reader never grows this without bound
            self._pending.popleft()


def _timed(run: Callable[[], object], device: torch.device) -> float:
    """Seconds of one `run()` on the current stream, from idle to done."""
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    run()
    torch.cuda.synchronize(device)
    return time.perf_counter() - start
