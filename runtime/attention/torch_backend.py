"""Attention on the CPU: the batched torch ops of kernels/attention_torch.py, planned once per forward.

Everything the layers of one forward index with is worked out in `plan`, once per distinct sliding window: the
extend rows' padding, slots, masks and shared-prefix (cascade) choice (`kernels.plan_extend`), and, where the
decode rows carry their K/V across steps (`DecodeKVCopies`), where each sits in the copy buffers and the index
tensors of this step's fills and appends (`kernels.plan_copy_step`). Which op each path takes on this CPU (the
decode step as matmuls, the cascade where torch's flash kernel returns its log-sum-exp) the kernels decide
(kernels/cpu_features.py holds the vendor policy).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from radixgen import kernels
from radixgen.runtime.attention.backend import AttentionShape, KVScales, Rows, RowSplit, attend_split, split_rows
from radixgen.runtime.attention.decode_kv_copies import DecodeKVCopies
from radixgen.runtime.forward_batch import ForwardBatch

T = TypeVar("T")


@dataclass(frozen=True)
class CarriedDecode:
    """The decode rows read their own keys from the copies carried across steps: this step's indices, and each
    layer's copy buffers and mask."""

    step: kernels.CopyStep
    k: tuple[torch.Tensor, ...]  # per layer
    v: tuple[torch.Tensor, ...]
    masks: tuple[torch.Tensor, ...]  # per layer; layers with the same sliding window share one


@dataclass(frozen=True)
class TorchAttentionMetadata:
    """The torch backend's plan of one forward: the row split and what each layer's ops index with."""

    split: RowSplit
    carried: CarriedDecode | None  # None: the decode rows gather their contexts from the pool
    extend_plans: tuple[kernels.ExtendPlan, ...]  # per layer (shared as the masks are); () without extend rows


class TorchAttentionBackend:
    """`AttentionBackend[TorchAttentionMetadata]` over the torch ops; with `decode_kv_copies`, decode rows read
    the copies it carries across steps (None: every step gathers from the pool)."""

    def __init__(self, shape: AttentionShape, dtype: torch.dtype,
                 decode_kv_copies: DecodeKVCopies | None = None) -> None:
        self.shape = shape
        self.scale = shape.scale
        self.dtype = dtype  # of q: the masks are made in it
        self.decode_kv_copies = decode_kv_copies

    def plan(self, batch: ForwardBatch) -> TorchAttentionMetadata:
        split = split_rows(batch)
        g, table = self.shape.group, batch.req_to_token
        carried = None
        if self.decode_kv_copies is not None:  # every forward: the copies also watch the KV writes
            held = self.decode_kv_copies.plan(batch, split.decode)
            if held is not None and split.decode is not None:
                step = kernels.plan_copy_step(table, split.decode.req_pool_indices, split.decode.seq_lens,
                                              held.placement)
                masks = self._per_layer(lambda w: kernels.copy_step_mask(step, g, self.dtype, w))
                carried = CarriedDecode(step, held.k, held.v, masks)
        plans: tuple[kernels.ExtendPlan, ...] = ()
        if (e := split.extend) is not None:
            plans = self._per_layer(lambda w: kernels.plan_extend(table, e.req_pool_indices, e.prefix_lens,
                                                                  e.extend_lens, e.extend_start_loc, e.num_tokens,
                                                                  g, self.dtype, w))
        return TorchAttentionMetadata(split, carried, plans)

    def _per_layer(self, make: Callable[[int | None], T]) -> tuple[T, ...]:
        """make(window) for every layer's sliding window, made once per distinct window."""
        made: dict[int | None, T] = {}
        for w in self.shape.sliding_windows:
            if w not in made:
                made[w] = make(w)
        return tuple(made[w] for w in self.shape.sliding_windows)

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, layer: int,
                metadata: TorchAttentionMetadata, kv_scales: KVScales | None = None) -> torch.Tensor:
        q = q.contiguous()  # the torch kernels view q's heads; the model passes a strided slice of qkv
        window = self.shape.sliding_windows[layer]
        table, carried = metadata.split.req_to_token, metadata.carried
        k_scale, v_scale = kv_scales if kv_scales is not None else (None, None)

        def decode(qd: torch.Tensor, rows: Rows) -> torch.Tensor:
            if carried is not None:
                return kernels.decode_attention_from_copy(qd, k_cache, v_cache, carried.k[layer], carried.v[layer],
                                                          carried.step, carried.masks[layer], self.scale, k_scale,
                                                          v_scale)
            return kernels.decode_attention_torch(qd, k_cache, v_cache, table, rows.req_pool_indices, rows.seq_lens,
                                                  self.scale, window, metadata.split.max_seq_len, k_scale, v_scale)

        def extend(qe: torch.Tensor, rows: Rows) -> torch.Tensor:
            return kernels.extend_attention_torch(qe, k_cache, v_cache, table, rows.req_pool_indices,
                                                  rows.prefix_lens, rows.extend_lens, rows.extend_start_loc,
                                                  self.scale, window, rows.max_extend_len,
                                                  metadata.extend_plans[layer], k_scale, v_scale)

        return attend_split(q, metadata.split, decode, extend)
