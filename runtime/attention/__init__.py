"""Attention backends: one per device kind, planned once per forward and called by every layer.

    backend.py           the AttentionBackend protocol, AttentionShape, and the decode/extend row split
    triton_backend.py    CUDA: the Triton kernels through kernels/dispatch.py (plans are views: CUDA graphs);
                         rows of a few new tokens (verify, multi-token) through the multi-query decode kernel
    torch_backend.py     CPU: the batched torch ops, with per-forward plans the layers share
    decode_kv_copies.py  CPU decode steps' per-request K/V copies carried across steps (policy)
"""

from __future__ import annotations

import torch

from radixgen import kernels
from radixgen.runtime.attention.backend import AttentionBackend, AttentionShape, Rows, RowSplit, split_rows
from radixgen.runtime.attention.decode_kv_copies import DecodeKVCopies
from radixgen.runtime.attention.torch_backend import TorchAttentionBackend, TorchAttentionMetadata
from radixgen.runtime.attention.triton_backend import MULTI_QUERY_MAX_TOKENS, TritonAttentionBackend
from radixgen.runtime.config import ModelConfig


def attention_backend_for(config: ModelConfig, device: torch.device, dtype: torch.dtype,
                          decode_kv_copies: DecodeKVCopies | None = None,
                          multi_query_max_tokens: int = MULTI_QUERY_MAX_TOKENS,
                          ) -> TritonAttentionBackend | TorchAttentionBackend:
    """The Triton backend where its kernels run (CUDA, head dims they take), sending batches of rows of at most
    `multi_query_max_tokens` new tokens through the multi-query decode kernel, else the torch backend, which
    carries decode K/V across steps in `decode_kv_copies` when given."""
    shape = AttentionShape.of(config)
    if kernels.triton_attention_runs(device, config.head_dim):
        return TritonAttentionBackend(shape, multi_query_max_tokens)
    return TorchAttentionBackend(shape, dtype, decode_kv_copies)


__all__ = ["MULTI_QUERY_MAX_TOKENS", "AttentionBackend", "AttentionShape", "DecodeKVCopies", "RowSplit", "Rows",
           "TorchAttentionBackend", "TorchAttentionMetadata", "TritonAttentionBackend", "attention_backend_for",
           "split_rows"]
