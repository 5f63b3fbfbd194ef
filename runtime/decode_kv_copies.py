"""Per-layer K/V copies of the decoding requests, carried from one CPU forward to the next.

On the CPU a decode step's attention first gathers every request's context from the slot pool into a padded
batch (the slots of one request are scattered: a cached prefix, then tokens allocated step by step), and that
copy costs about as much as the attention reading it. Consecutive steps gather the same keys again plus one new
key per request. `DecodeKVCopies` keeps each decoding request's keys and values in a row of per-layer buffers
instead: a request new to the copies has its row filled from the pool once, and from then on each step only
writes its newest key and value. Requests that leave free their rows for the next ones, so a batch whose
membership changes every step (continuous batching) still fills only its newcomers.

Policy lives here, the tensor work in `kernels.attention_torch` (`DecodeKVCopy`, `decode_attention_torch`).
A row is trusted only for the same holder of the same request-table row (`ReqToTokenPool.allocations`) at
exactly one position shorter than now, so any forward that extended the request another way (a prefill chunk,
a jump-forward) makes the next decode refill it. Rows no decode request holds become holes, reused by the next
newcomers; once holes are a quarter of the rows, the rows are rebuilt in batch order. The buffers take at most
`max_bytes`; a batch that would need more decodes through the gather.
"""

from __future__ import annotations

import numpy as np
import torch
from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode

from radixgen import kernels

HEADROOM = 64  # positions (and rounding) each request can grow before the buffers are reallocated larger
ROW_ROUNDING = 8  # buffer rows come in multiples of this, so requests can join without a reallocation


class DecodeKVCopies:
    """Owns the copy buffers ([R, Hkv, capacity, D] per layer, K and V) and, per forward, which decode request
    holds which row and which rows must be filled from the pool."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, max_bytes: int,
                 allocations: np.ndarray, cascade: bool = True) -> None:
        self.num_layers, self.num_kv_heads, self.head_dim, self.dtype = num_layers, num_kv_heads, head_dim, dtype
        self.max_bytes = max_bytes
        self.allocations = allocations  # ReqToTokenPool.allocations: how often each table row was handed out
        self.cascade = cascade  # False for models with sliding-window layers (the cascade path has no window)
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        self._row_of = np.full(len(allocations), -1, dtype=np.int64)  # table row -> buffer row (-1: none)
        self._holder = np.zeros(0, dtype=np.int64)  # buffer row -> table row holding it (-1: a hole)
        self._holder_alloc = np.zeros(0, dtype=np.int64)  # buffer row -> that table row's allocation count
        self._len = np.zeros(0, dtype=np.int64)  # buffer row -> positions it holds (the request's length then)
        self._shared = 0
        self._shared_slots = torch.zeros(0, dtype=torch.int32)
        self.filled_rows = 0  # rows filled from the pool (counters for tests and benchmarks)
        self.appended_rows = 0  # rows that only had their newest position written
        self.rebuilds = 0  # forwards that reassigned every row (a new capacity, a new shared prefix, compaction)

    def plan(self, batch: ForwardBatch) -> list[kernels.DecodeKVCopy] | None:
        """The per-layer copies the decode requests of this forward (all of a decode batch, the leading
        `num_decode_rows` of a mixed one) read, or None. Call once per forward, in order."""
        nd = batch.batch_size if batch.mode is ForwardMode.DECODE else batch.num_decode_rows
        if nd == 0:
            self._drop_all()
            return None
        table_rows = batch.req_pool_indices[:nd].cpu().numpy()
        lens = batch.seq_lens[:nd].cpu().numpy().astype(np.int64)
        allocs = self.allocations[table_rows]
        rows = self._row_of[table_rows]
        held = rows >= 0
        held[held] &= self._holder_alloc[rows[held]] == allocs[held]
        rows[~held] = -1
        current = held.copy()
        current[held] &= self._len[rows[held]] == lens[held] - 1
        # Rows of requests not decoding now free up; rows of requests decoding now but stale get refilled.
        keep = np.zeros(len(self._holder), dtype=bool)
        keep[rows[held]] = True
        self._free_rows(~keep & (self._holder >= 0))
        rebuild = not self._fits(batch.req_to_token, table_rows, lens, rows, held)
        if rebuild:
            if not self._rebuild(batch, nd, lens):
                return None
            rows, current = np.arange(nd), np.zeros(nd, dtype=bool)
        else:
            holes = np.flatnonzero(self._holder < 0)
            newcomers = np.flatnonzero(rows < 0)
            rows[newcomers] = holes[: len(newcomers)]
        self._holder[rows], self._holder_alloc[rows], self._len[rows] = table_rows, allocs, lens
        self._row_of[table_rows] = rows
        fill = np.flatnonzero(~current)
        self.filled_rows += len(fill)
        self.appended_rows += nd - len(fill)
        num_rows = int(rows.max()) + 1
        in_order = num_rows == nd and bool((rows == np.arange(nd)).all())
        rows_t, fill_t = torch.from_numpy(rows.copy()), torch.from_numpy(fill)
        return [kernels.DecodeKVCopy(k, v, rows_t, fill_t, num_rows, self._shared, in_order)
                for k, v in zip(self._k, self._v)]

    def _fits(self, table: torch.Tensor, table_rows: np.ndarray, lens: np.ndarray, rows: np.ndarray,
              held: np.ndarray) -> bool:
        """Whether this forward can keep the current rows: capacity for every length, enough free rows for the
        newcomers, holes under a quarter of the rows in use, and every newcomer sharing the cascade prefix."""
        if not self._k:
            return False
        newcomers = int((rows < 0).sum())
        free = int((self._holder < 0).sum())
        if int(lens.max()) - self._shared > self._k[0].shape[2] or newcomers > free:
            return False
        used = np.concatenate([rows[held], np.flatnonzero(self._holder < 0)[:newcomers]])
        num_rows = int(used.max()) + 1
        if 4 * (num_rows - len(used)) > num_rows:  # holes the attention would read through
            return False
        if self._shared:
            if int(lens.min()) - 1 < self._shared:
                return False
            if newcomers:
                new = torch.from_numpy(table_rows[rows < 0])
                return bool((table[new, : self._shared] == self._shared_slots).all())
        return True

    def _rebuild(self, batch: ForwardBatch, nd: int, lens: np.ndarray) -> bool:
        """Every decode request gets row b = its batch position; buffers reallocated when too small."""
        self._drop_all()
        rpi, seq = batch.req_pool_indices[:nd], batch.seq_lens[:nd]
        shared = kernels.cascade_prefix_len(batch.req_to_token, rpi, seq) if self.cascade else 0
        if not self._reserve(nd, int(lens.max()) - shared + HEADROOM):
            return False
        self._shared = shared
        self._shared_slots = batch.req_to_token[rpi[0], :shared].clone()
        self.rebuilds += 1
        return True

    def _free_rows(self, mask: np.ndarray) -> None:
        gone = self._holder[mask]
        self._row_of[gone[gone >= 0]] = -1
        self._holder[mask] = -1

    def _drop_all(self) -> None:
        self._free_rows(np.ones(len(self._holder), dtype=bool))

    def _reserve(self, batch: int, positions: int) -> bool:
        """Buffers holding at least `batch` rows of `positions`; reuses the current ones when they fit."""
        if not (self._k and self._k[0].shape[0] >= batch and self._k[0].shape[2] >= positions):
            positions = -(-positions // HEADROOM) * HEADROOM
            batch = -(-batch // ROW_ROUNDING) * ROW_ROUNDING
            shape = (batch, self.num_kv_heads, positions, self.head_dim)
            nbytes = 2 * self.num_layers * int(np.prod(shape)) * torch.empty((), dtype=self.dtype).element_size()
            self._k, self._v = [], []  # free the old buffers before allocating the new
            if nbytes > self.max_bytes:
                self._resize_rows(0)
                return False
            # Zeros, not empty: masked columns still enter the attention's P @ V with weight 0, and 0 * NaN is NaN.
            self._k = [torch.zeros(shape, dtype=self.dtype) for _ in range(self.num_layers)]
            self._v = [torch.zeros(shape, dtype=self.dtype) for _ in range(self.num_layers)]
        self._resize_rows(self._k[0].shape[0])
        return True

    def _resize_rows(self, n: int) -> None:
        self._holder = np.full(n, -1, dtype=np.int64)
        self._holder_alloc = np.zeros(n, dtype=np.int64)
        self._len = np.zeros(n, dtype=np.int64)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._k + self._v)
