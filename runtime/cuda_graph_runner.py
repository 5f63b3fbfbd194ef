"""Decode forwards captured as CUDA graphs, one per batch-size bucket, and replayed.

A decode step of a large model is hundreds of small kernel launches; at small batches the CPU cannot issue them
as fast as the GPU runs them. Capturing the whole decode forward once per bucket (1, 2, 4, 8, 16, 24, 32, 48,
64, 80, ... up to `max_bs`) and replaying it costs one launch per step.

A graph replays with fixed tensor addresses, so every input lives in a static buffer of `max_bs` rows. A batch
of `n` requests runs in the smallest bucket >= n: its rows are copied into rows [0, n) and rows [n, bucket)
are padding, which

    reads token 0 at position 0, writes its K/V to the reserved slot kv_pool.PADDING_SLOT (never read), and has
    seq_len 0, so decode attention reads nothing and returns zeros for it;

their logits rows are computed and dropped. Invariant: rows >= `self._live_rows` of the static buffers hold
padding values, so a step only rewrites the rows a larger earlier batch left behind.

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
import logging
import time
from collections.abc import Callable

import torch

from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode
from radixgen.runtime.kv_pool import PADDING_SLOT

log = logging.getLogger(__name__)


def graph_batch_sizes(max_bs: int) -> list[int]:
    """Buckets 1, 2, 4, 8, 16, 24, 32, 48, 64, 80, ... (every 16 from 48), capped by and ending at `max_bs`."""
    if max_bs < 1:
        raise ValueError(f"cuda_graph_max_bs must be >= 1, got {max_bs}")
    sizes = [1, 2, 4, 8, 16, 24, 32] + list(range(48, max_bs + 1, 16))
    sizes = [s for s in sizes if s < max_bs]
    return sizes + [max_bs]


class CudaGraphRunner:
    """Captures `forward` (batch -> fp32 logits: the model, its KV pool and its attention plan) of a decode batch
    per bucket at construction; `replay(batch)` runs a decode batch."""

    def __init__(self, forward: Callable[[ForwardBatch], torch.Tensor], req_to_token: torch.Tensor, max_bs: int,
                 max_context: int, use_graphs: bool | None = None) -> None:
        self.forward = forward
        self.req_to_token = req_to_token
        self.max_context = max_context
        self.device = req_to_token.device
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        if self.use_graphs and self.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.batch_sizes = graph_batch_sizes(max_bs)
        self.max_bs = self.batch_sizes[-1]
        n, dev = self.max_bs, self.device
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.full((n,), PADDING_SLOT, dtype=torch.int64, device=dev)
        self.req_pool_indices = torch.zeros(n, dtype=torch.int64, device=dev)
        self.prefix_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.extend_lens = torch.ones(n, dtype=torch.int32, device=dev)  # never changes: one token per row
        self.extend_start_loc = torch.arange(n, dtype=torch.int32, device=dev)  # never changes
        self._live_rows = 0
        self.replays = 0  # decode steps served (a count for stats and tests)
        self.batches = {bs: self._static_batch(bs) for bs in self.batch_sizes}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
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

    def _forward(self, bs: int) -> torch.Tensor:
        """The decode forward of bucket `bs` over the static buffers, the attention plan included."""
        return self.forward(self.batches[bs])

    @torch.inference_mode()
    def _capture_all(self) -> None:
        """Capture the largest bucket first, all graphs sharing one memory pool (a smaller graph's activations
        fit in the blocks the larger one freed)."""
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device=self.device)
        for bs in reversed(self.batch_sizes):
            # Warm-up outside the capture: compiles the Triton kernels, settles the allocator. With every row
            # padding it writes only the reserved slot.
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._forward(bs)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self.outputs[bs] = self._forward(bs)
            self.graphs[bs] = graph
        torch.cuda.synchronize(self.device)
        log.info("captured %d decode CUDA graphs (batch %d..%d) in %.1f s", len(self.graphs), self.batch_sizes[0],
                 self.max_bs, time.perf_counter() - start)

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

    @torch.inference_mode()
    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """Run a decode batch (`can_run` must hold): fp32 logits [batch_size, vocab], a fresh tensor."""
        n = batch.batch_size
        bs = self.bucket(n)
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.out_cache_loc[:n].copy_(batch.out_cache_loc)
        self.req_pool_indices[:n].copy_(batch.req_pool_indices)
        self.prefix_lens[:n].copy_(batch.prefix_lens)
        self.seq_lens[:n].copy_(batch.seq_lens)
        if self._live_rows > n:  # rows a larger earlier batch used become padding again
            self._pad_rows(n, self._live_rows)
        self._live_rows = n
        self.replays += 1
        if self.use_graphs:
            self.graphs[bs].replay()
            logits = self.outputs[bs]
        else:
            logits = self._forward(bs)
        # A copy: the graph's output buffer is overwritten by the next replay.
        return logits[:n].clone()

    def _pad_rows(self, lo: int, hi: int) -> None:
        self.input_ids[lo:hi].zero_()
        self.positions[lo:hi].zero_()
        self.out_cache_loc[lo:hi].fill_(PADDING_SLOT)
        self.req_pool_indices[lo:hi].zero_()
        self.prefix_lens[lo:hi].zero_()
        self.seq_lens[lo:hi].zero_()
