"""Per-layer K/V copies of the running decode batch, carried from one CPU decode step to the next.

On the CPU a decode step's attention first gathers every request's context from the slot pool into a padded
batch (the slots of one request are scattered: a cached prefix, then tokens allocated step by step), and that
copy costs more than the attention reading it. Consecutive decode steps of the same requests gather the same
keys again plus one new key each. `DecodeKVCopies` keeps the padded batch of each layer instead: the first
decode step of a batch fills it, and each later step of the same batch (same request rows, every length one
longer, no other forward in between) only writes each request's newest key and value.

Policy lives here, the tensor work in `kernels.attention_torch` (`DecodeKVCopy`, `decode_attention_torch`).
A copy is only trusted across consecutive decode forwards: a prefill or mixed forward in between, a changed
batch, or a batch longer than the copy's capacity refills it; a batch whose copies would outgrow `max_bytes`
runs without them (the gather path).
"""

from __future__ import annotations

import numpy as np
import torch
from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode

from radixgen import kernels

HEADROOM = 64  # positions each request can grow before its copy is refilled with a larger capacity


class DecodeKVCopies:
    """Owns the copy buffers ([B, Hkv, capacity, D] per layer, K and V) and decides per forward whether they
    can be appended to, must be refilled, or are not used."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, max_bytes: int,
                 cascade: bool = True) -> None:
        self.num_layers, self.num_kv_heads, self.head_dim, self.dtype = num_layers, num_kv_heads, head_dim, dtype
        self.max_bytes = max_bytes
        self.cascade = cascade  # False for models with sliding-window layers (the cascade path has no window)
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        self._rows: np.ndarray | None = None  # request rows of the batch the copies hold (None: nothing valid)
        self._lens = np.zeros(0, dtype=np.int64)  # their lengths at the last step
        self._shared = 0
        self.refills = 0  # forwards that filled the copies (counters for tests and benchmarks)
        self.appends = 0  # forwards that only appended one position per request

    def plan(self, batch: ForwardBatch) -> list[kernels.DecodeKVCopy] | None:
        """The per-layer copies this forward's attention uses, or None (not a decode batch, or over budget).
        Call once per forward, in order: any non-decode forward invalidates the copies."""
        if batch.mode is not ForwardMode.DECODE:
            self._rows = None
            return None
        rows = batch.req_pool_indices.cpu().numpy()
        lens = batch.seq_lens.cpu().numpy().astype(np.int64)
        length = batch.max_seq_len
        capacity = self._k[0].shape[2] if self._k else 0
        append = (self._rows is not None and np.array_equal(rows, self._rows)
                  and np.array_equal(lens, self._lens + 1) and length - self._shared <= capacity)
        if not append:
            shared = (kernels.cascade_prefix_len(batch.req_to_token, batch.req_pool_indices, batch.seq_lens)
                      if self.cascade else 0)
            if not self._reserve(len(rows), length - shared + HEADROOM):
                self._rows = None
                return None
            self._shared = shared
        self._rows, self._lens = rows.copy(), lens
        if append:
            self.appends += 1
        else:
            self.refills += 1
        b = len(rows)
        return [kernels.DecodeKVCopy(k[:b], v[:b], refill=not append, shared=self._shared)
                for k, v in zip(self._k, self._v)]

    def _reserve(self, batch: int, positions: int) -> bool:
        """Buffers holding at least `batch` rows of `positions`; reuses the current ones when they fit."""
        if self._k and self._k[0].shape[0] >= batch and self._k[0].shape[2] >= positions:
            return True
        positions = -(-positions // HEADROOM) * HEADROOM
        shape = (batch, self.num_kv_heads, positions, self.head_dim)
        nbytes = 2 * self.num_layers * int(np.prod(shape)) * torch.empty((), dtype=self.dtype).element_size()
        self._k, self._v = [], []  # free the old buffers before allocating the new
        if nbytes > self.max_bytes:
            return False
        # Zeros, not empty: masked columns still enter the attention's P @ V with weight 0, and 0 * NaN is NaN.
        self._k = [torch.zeros(shape, dtype=self.dtype) for _ in range(self.num_layers)]
        self._v = [torch.zeros(shape, dtype=self.dtype) for _ in range(self.num_layers)]
        return True

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._k + self._v)
