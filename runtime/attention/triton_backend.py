"""Attention on CUDA: the Triton kernels, through kernels/dispatch.py.

Decode rows go through the decode kernel: split-K over each context, one read of a KV block serving every query
head of its group. Extend rows (prefill chunks) go through the extend kernel, which tiles many queries per
program. A batch of rows of at most `multi_query_max_tokens` new tokens each (speculative verify, multi-token
rows: the multi-token and verify CUDA graphs' batches) goes whole through the multi-query decode kernel, the
decode kernel's design with every (new token, group head) pair of a row in one query tile, causally masked.
All read the pool in place by slot, so the plan is only the row split: in a DECODE batch and a multi-query one
nothing but views of the batch's tensors, which is what lets a CUDA graph captured over static buffers replay it.
"""

from __future__ import annotations

import torch

from radixgen import kernels
from radixgen.runtime.attention.backend import AttentionShape, KVScales, Rows, RowSplit, attend_split, split_rows
from radixgen.runtime.forward_batch import ForwardBatch

# Rows of up to this many new tokens take the multi-query decode kernel: the engine's default
# cuda_graph_max_row_tokens, so every multi-token and verify graph's rows do.
MULTI_QUERY_MAX_TOKENS = 8


class TritonAttentionBackend:
    """`AttentionBackend[RowSplit]` over the Triton kernels (the torch ops where dispatch cannot run them); EXTEND
    batches of at most `multi_query_max_tokens` new tokens per request run the multi-query decode kernel (0:
    never)."""

    def __init__(self, shape: AttentionShape, multi_query_max_tokens: int = MULTI_QUERY_MAX_TOKENS) -> None:
        self.shape = shape
        self.scale = shape.scale
        self.multi_query_max_tokens = multi_query_max_tokens

    def plan(self, batch: ForwardBatch) -> RowSplit:
        return split_rows(batch, self.multi_query_max_tokens)

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, layer: int,
                metadata: RowSplit, kv_scales: KVScales | None = None) -> torch.Tensor:
        window = self.shape.sliding_windows[layer]
        table = metadata.req_to_token
        k_scale, v_scale = kv_scales if kv_scales is not None else (None, None)

        def decode(qd: torch.Tensor, rows: Rows) -> torch.Tensor:
            return kernels.decode_attention(qd, k_cache, v_cache, table, rows.req_pool_indices, rows.seq_lens,
                                            self.scale, sliding_window=window, max_seq_len=metadata.max_seq_len,
                                            k_scale=k_scale, v_scale=v_scale)

        def extend(qe: torch.Tensor, rows: Rows) -> torch.Tensor:
            return kernels.extend_attention(qe, k_cache, v_cache, table, rows.req_pool_indices, rows.prefix_lens,
                                            rows.extend_lens, rows.extend_start_loc, self.scale,
                                            sliding_window=window, max_extend_len=rows.max_extend_len,
                                            k_scale=k_scale, v_scale=v_scale)

        def multi(qm: torch.Tensor, rows: Rows) -> torch.Tensor:
            return kernels.multi_query_decode_attention(qm, k_cache, v_cache, table, rows.req_pool_indices,
                                                        rows.prefix_lens, rows.extend_lens, rows.extend_start_loc,
                                                        self.scale, window, rows.max_extend_len,
                                                        metadata.max_seq_len, k_scale, v_scale)

        return attend_split(q, metadata, decode, extend, multi)
