"""Per-layer K/V copies of the decoding requests, carried from one CPU forward to the next.

On the CPU a decode step's attention first gathers every request's context from the slot pool into a padded
batch (the slots of one request are scattered: a cached prefix, then tokens allocated step by step), and that
copy costs about as much as the attention reading it. Consecutive steps gather the same keys again plus one new
key per request. `DecodeKVCopies` keeps each decoding request's keys and values in a row of per-layer buffers
instead: a request new to the copies has its row filled from the pool once, and from then on each step only
writes its newest key and value.

A row whose request left keeps what it holds, with the slots it was read from: a newcomer whose first positions
are those slots (the next turn of a conversation, the next `gen` of a program: a prefix shared through the
radix cache) takes the row and fills only the rest. The slots of such a row are watched: a forward that writes
any of them (they were freed and handed out again) makes the row forget. Rows no request needs are reused by
the next newcomers; once holes are a quarter of the rows in use, the rows are rebuilt in batch order.

Policy lives here, the tensor work in `kernels.decode_copy_torch` (`CopyPlacement` is what a plan decides).
A held row is trusted only for the same holder of the same request-table row (`ReqToTokenPool.allocations`)
at exactly one position shorter than now, so a forward that extended the request another way (a prefill chunk,
a jump-forward) makes the next decode fill it again. The buffers take at most `max_bytes`; a batch that would
need more decodes through the gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radixgen import kernels
from radixgen.runtime.attention.backend import Rows
from radixgen.runtime.forward_batch import ForwardBatch
from radixgen.runtime.kv_pool import lazy_zeros

HEADROOM = 64  # positions (and rounding) each request can grow before the buffers are reallocated larger
ROW_ROUNDING = 8  # buffer rows come in multiples of this, so requests can join without a reallocation


@dataclass(frozen=True)
class HeldCopies:
    """Where this forward's decode requests sit in the copy buffers, and the buffers each layer reads."""

    placement: kernels.CopyPlacement
    k: tuple[torch.Tensor, ...]  # per layer: [R, Hkv, capacity, D]
    v: tuple[torch.Tensor, ...]


class DecodeKVCopies:
    """Owns the copy buffers ([R, Hkv, capacity, D] per layer, K and V) and, per forward, which decode request
    holds which row and which positions of it must be filled from the pool."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, max_bytes: int,
                 allocations: np.ndarray, cascade: bool = True) -> None:
        self.num_layers, self.num_kv_heads, self.head_dim, self.dtype = num_layers, num_kv_heads, head_dim, dtype
        self.max_bytes = max_bytes
        self.allocations = allocations  # ReqToTokenPool.allocations: how often each table row was handed out
        self.cascade = cascade  # False for models with sliding-window layers (the cascade path has no window)
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        self._row_of = np.full(len(allocations), -1, dtype=np.int64)  # table row -> buffer row (-1: none)
        self._holder: np.ndarray  # these four: see _resize_rows
        self._holder_alloc: np.ndarray
        self._len: np.ndarray
        self._slots: np.ndarray
        self._resize_rows(0, 0)
        self._shared = 0
        self._shared_slots = torch.zeros(0, dtype=torch.int32)
        self.filled_positions = 0  # positions copied from the pool (counters for tests and benchmarks)
        self.reused_positions = 0  # positions a newcomer found in a left request's row
        self.appended_rows = 0  # rows that only had their newest position written
        self.rebuilds = 0  # forwards that reassigned every row (a new capacity, a new shared prefix, compaction)

    def plan(self, batch: ForwardBatch, decode: Rows | None) -> HeldCopies | None:
        """Where the decode rows of this forward (`decode`, of `split_rows`) sit in the copies, or None: they
        gather from the pool. Call once per forward, in order: it also watches every forward's KV writes."""
        written = batch.out_cache_loc.cpu().numpy()
        table = batch.req_to_token
        if decode is None:
            self._release(np.ones(len(self._holder), dtype=bool))
            self._forget_written(written)
            return None
        nd = len(decode.seq_lens)
        table_rows = decode.req_pool_indices.cpu().numpy()
        lens = decode.seq_lens.cpu().numpy().astype(np.int64)
        allocs = self.allocations[table_rows]
        rows = self._row_of[table_rows]
        held = rows >= 0
        held[held] &= self._holder_alloc[rows[held]] == allocs[held]
        rows[~held] = -1
        have = np.zeros(nd, dtype=np.int64)  # positions each request's row holds
        have[held] = self._len[rows[held]]
        have[have != lens - 1] = 0  # extended another way: fill again from the start
        keep = np.zeros(len(self._holder), dtype=bool)
        keep[rows[held]] = True
        self._release(~keep & (self._holder >= 0))  # left: their rows keep their contents for newcomers
        self._forget_written(written)  # ... unless this forward reuses their slots
        # A batch of newcomers only (a new wave of requests) may share a prefix the current rows do not split off.
        prefix = self._batch_prefix(decode, table) if not held.any() else None
        if (prefix is not None and prefix != self._shared) or not self._fits(table, table_rows, lens, rows):
            if not self._rebuild(decode, table, lens, prefix):
                return None
            rows, have = np.arange(nd), np.zeros(nd, dtype=np.int64)
        else:
            self._place_newcomers(table, table_rows, lens, rows, have)
        have = np.maximum(have, self._shared)
        fill = np.flatnonzero(have < lens - 1)
        self._record(table, table_rows, lens, allocs, rows, have, fill)
        num_rows = int(rows.max()) + 1
        in_order = num_rows == nd and bool((rows == np.arange(nd)).all())
        rows_t, fill_t, from_t = torch.from_numpy(rows.copy()), torch.from_numpy(fill), torch.from_numpy(have[fill])
        placement = kernels.CopyPlacement(rows_t, fill_t, from_t, num_rows, self._shared, in_order)
        return HeldCopies(placement, tuple(self._k), tuple(self._v))

    # ------------------------------------------------------------ placement
    def _place_newcomers(self, table: torch.Tensor, table_rows: np.ndarray, lens: np.ndarray, rows: np.ndarray,
                         have: np.ndarray) -> None:
        """Give each request without a row a free one: the free row whose remembered slots are the longest
        prefix of the request's own (`have` then counts those positions), else a row with nothing to offer."""
        p = self._shared
        taken = np.zeros(len(self._holder), dtype=bool)  # rows given out in this placement
        for b in np.flatnonzero(rows < 0):
            free = np.flatnonzero((self._holder < 0) & ~taken)
            best, best_len = -1, p
            known = free[(self._len[free] > p) & (self._len[free] <= lens[b] - 1)]
            if len(known):
                n = int(self._len[known].max()) - p
                mine = table[int(table_rows[b]), p : p + n].numpy()
                same = self._slots[known, :n] == mine[None, :]
                # positions matched from the start, per candidate, capped by what the row holds
                run = np.where(same.all(1), n, np.argmin(same, axis=1))
                ok = run >= self._len[known] - p
                if ok.any():
                    i = int(np.argmax(np.where(ok, self._len[known], -1)))
                    best, best_len = int(known[i]), int(self._len[known[i]])
            if best < 0:  # a row nothing remembered, else the one remembering least
                best = int(free[np.argmin(self._len[free])])
            rows[b], have[b] = best, best_len
            taken[best] = True
            self.reused_positions += best_len - p

    def _fits(self, table: torch.Tensor, table_rows: np.ndarray, lens: np.ndarray, rows: np.ndarray) -> bool:
        """Whether this forward can keep the current rows: capacity for every length, enough free rows for the
        newcomers, holes under a quarter of the rows in use, and every newcomer sharing the cascade prefix."""
        if not self._k:
            return False
        newcomers = int((rows < 0).sum())
        free = np.flatnonzero(self._holder < 0)
        if newcomers > len(free):
            return False
        num_rows = max(int(rows.max()) + 1, int(free[:newcomers].max()) + 1 if newcomers else 0)
        if 4 * (num_rows - len(rows)) > num_rows:  # holes the attention would read through
            return False
        if self._shared:
            if int(lens.min()) - 1 < self._shared:
                return False
            new = torch.from_numpy(table_rows[rows < 0])
            if newcomers and not bool((table[new, : self._shared] == self._shared_slots).all()):
                return False
        longest = int(lens.max()) - self._shared
        return longest <= self._k[0].shape[2] or self._grow(longest)

    def _batch_prefix(self, decode: Rows, table: torch.Tensor) -> int:
        """Leading slots the decode requests share that the cascade reads from the pool (0: none, or no cascade)."""
        if not self.cascade:
            return 0
        return kernels.cascade_prefix_len(table, decode.req_pool_indices, decode.seq_lens)

    def _rebuild(self, decode: Rows, table: torch.Tensor, lens: np.ndarray, shared: int | None) -> bool:
        """Every decode request gets row b = its batch position; buffers reallocated when too small. `shared`:
        the batch's `_batch_prefix` when the caller has it."""
        self._release(np.ones(len(self._holder), dtype=bool))
        shared = self._batch_prefix(decode, table) if shared is None else shared
        if not self._reserve(len(lens), int(lens.max()) - shared + HEADROOM):
            return False
        self._shared = shared
        self._shared_slots = table[decode.req_pool_indices[0], :shared].clone()
        self.rebuilds += 1
        return True

    # ----------------------------------------------------------- bookkeeping
    def _record(self, table: torch.Tensor, table_rows: np.ndarray, lens: np.ndarray, allocs: np.ndarray,
                rows: np.ndarray, have: np.ndarray, fill: np.ndarray) -> None:
        """Holders, lengths and remembered slots after this forward's fills and appends."""
        p = self._shared
        self._holder[rows], self._holder_alloc[rows] = table_rows, allocs
        self._row_of[table_rows] = rows
        for b in fill:  # the slots the fill reads, then every request's newest
            lo, hi = int(have[b]), int(lens[b]) - 1
            self._slots[rows[b], lo - p : hi - p] = table[int(table_rows[b]), lo:hi].numpy()
        newest = table[torch.from_numpy(table_rows), torch.from_numpy(lens - 1)].numpy()
        self._slots[rows, lens - 1 - p] = newest
        self._len[rows] = lens
        self.filled_positions += int((lens[fill] - 1 - have[fill]).sum())
        self.appended_rows += len(rows) - len(fill)

    def _release(self, mask: np.ndarray) -> None:
        """The rows in `mask` lose their holders and keep what they hold."""
        gone = self._holder[mask]
        self._row_of[gone[gone >= 0]] = -1
        self._holder[mask] = -1

    def _forget_written(self, written: np.ndarray) -> None:
        """Rows without a holder forget contents read from slots this forward writes (freed, handed out again)."""
        free = np.flatnonzero((self._holder < 0) & (self._len > self._shared))
        if len(free) == 0 or len(written) == 0:
            return
        p = self._shared
        width = int(self._len[free].max()) - p
        mem = self._slots[free, :width]
        valid = np.arange(width)[None, :] < (self._len[free] - p)[:, None]
        hit = (np.isin(mem, written) & valid).any(1)
        self._len[free[hit]] = 0

    def _grow(self, positions: int) -> bool:
        """Longer buffers (at least 1.5x as long: growth is a copy of everything held) with every row's contents
        kept. Only the rows that hold positions are copied; the rest stay untouched zero pages (`_reserve`)."""
        old_k, old_v, held = self._k, self._v, self._k[0].shape[2]
        positions = max(positions + HEADROOM, held + held // 2)
        positions = -(-positions // HEADROOM) * HEADROOM
        shape = (old_k[0].shape[0], self.num_kv_heads, positions, self.head_dim)
        if 2 * self.num_layers * int(np.prod(shape)) * old_k[0].element_size() > self.max_bytes:
            return False
        in_use = np.flatnonzero((self._len > 0) | (self._holder >= 0))
        rows = int(in_use[-1]) + 1 if len(in_use) else 0
        self._k, self._v = [], []
        for old, new in ((old_k, self._k), (old_v, self._v)):
            while old:
                buf = lazy_zeros(shape, self.dtype, "cpu")
                buf[:rows, :, :held] = old.pop(0)[:rows]
                new.append(buf)
        slots = np.zeros((shape[0], shape[2]), dtype=np.int32)
        slots[:, :held] = self._slots
        self._slots = slots
        return True

    def _reserve(self, batch: int, positions: int) -> bool:
        """Buffers holding at least `batch` rows of `positions`; reuses the current ones when they fit."""
        if not (self._k and self._k[0].shape[0] >= batch and self._k[0].shape[2] >= positions):
            positions = -(-positions // HEADROOM) * HEADROOM
            batch = -(-batch // ROW_ROUNDING) * ROW_ROUNDING
            shape = (batch, self.num_kv_heads, positions, self.head_dim)
            nbytes = 2 * self.num_layers * int(np.prod(shape)) * torch.empty((), dtype=self.dtype).element_size()
            self._k, self._v = [], []  # free the old buffers before allocating the new
            if nbytes > self.max_bytes:
                self._resize_rows(0, 0)
                return False
            # Zeros, not empty: masked columns still enter the attention's P @ V with weight 0, and 0 * NaN is NaN.
            # Zero pages on demand: the rows (and columns) no request has written cost no memory.
            self._k = [lazy_zeros(shape, self.dtype, "cpu") for _ in range(self.num_layers)]
            self._v = [lazy_zeros(shape, self.dtype, "cpu") for _ in range(self.num_layers)]
        self._resize_rows(self._k[0].shape[0], self._k[0].shape[2])
        return True

    def _resize_rows(self, n: int, positions: int) -> None:
        self._holder = np.full(n, -1, dtype=np.int64)  # buffer row -> table row holding it (-1: free)
        self._holder_alloc = np.zeros(n, dtype=np.int64)  # buffer row -> that table row's allocation count
        self._len = np.zeros(n, dtype=np.int64)  # buffer row -> positions it holds (from the start)
        self._slots = np.zeros((n, positions), dtype=np.int32)  # buffer row -> the slots its columns came from

    def buffers(self) -> tuple[torch.Tensor, ...]:
        """Every layer's K buffer, then every layer's V buffer (none before the first decode)."""
        return (*self._k, *self._v)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers())
