"""ModelRunner: the model on its device plus the KV memory it reads, built from one EngineConfig.

It owns three choices the rest of the engine should not make: which device and dtype (auto: CUDA + bfloat16
when CUDA is available, else CPU + float32), which model file (an explicit path, or the default model, fetched
on first use), and how many KV slots fit. The scheduler allocates slots and request rows through
`slot_allocator` and `req_to_token_pool` and calls `forward(batch)`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from radixgen import kernels
from radixgen.runtime.attention import DecodeKVCopies, attention_backend_for
from radixgen.runtime.attention.backend import AttentionBackend
from radixgen.runtime.download import cache_dir
from radixgen.runtime.engine_config import EngineConfig
from radixgen.runtime.forward_batch import ForwardBatch
from radixgen.runtime.kv_pool import (
    CPU_KV_BUDGET_BYTES,
    KVPool,
    ReqToTokenPool,
    SlotAllocator,
    kv_cache_dtype,
    kv_pool_num_slots,
)
from radixgen.runtime.loader import load_model, read_model_config
from radixgen.runtime.model_path import check_tokenizer_source, local_model_path

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

__all__ = ["ModelRunner", "load_model", "resolve_device_dtype", "resolve_model_path"]


def resolve_device_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """`auto` device = CUDA when available, else CPU; `auto` dtype = bfloat16 on CUDA, float32 on CPU."""
    if device == "auto":
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but CUDA is not available")
    if dtype == "auto":
        return dev, torch.bfloat16 if dev.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be auto|{'|'.join(_DTYPES)}, got {dtype!r}")
    return dev, _DTYPES[dtype]


def resolve_model_path(config: EngineConfig) -> Path | None:
    """The model to load: the configured path (or a hub id in the local Hugging Face cache), checked to have a
    tokenizer before any weight loads; or the default model (downloaded if missing).

    A dummy model with an explicit `dummy_config` needs no path at all.
    """
    if config.model_path is not None:
        path = local_model_path(config.model_path)
        check_tokenizer_source(path, config.tokenizer_path)
        return path
    if config.load_format == "dummy" and config.dummy_config is not None:
        return None
    from radixgen.runtime.download import default_model_path

    return default_model_path(download=True)


DRAFT_WORKSPACE_BYTES = 1 << 30  # a draft model's activations, logits and graphs, beside its weights


def draft_model_memory(config: EngineConfig, cache_dtype: torch.dtype) -> tuple[int, int]:
    """(KV bytes per token, bytes up front) the draft model will need once loaded: it holds a slot for each of the
    target's, so the target's pool leaves room for both; (0, 0) without a draft model."""
    if config.speculative_algorithm != "draft_model" or config.draft_model_path is None:
        return 0, 0
    draft = read_model_config(local_model_path(config.draft_model_path), config.load_format)
    dtype_bytes = torch.empty((), dtype=cache_dtype).element_size()
    weight_bytes = draft.num_parameters() * 2  # loaded in 16 bits (a GGUF draft is dequantized at load)
    return draft.kv_bytes_per_token(dtype_bytes), weight_bytes + DRAFT_WORKSPACE_BYTES


class ModelRunner:
    """Loads the model and its KV memory; `forward(batch)` returns fp32 logits of the batch's logit rows."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device, self.dtype = resolve_device_dtype(config.device, config.dtype)
        self.model_path = resolve_model_path(config)
        self.model, self.model_config = load_model(
            self.model_path, config.load_format, self.device, self.dtype, dummy_config=config.dummy_config,
            max_position_embeddings=config.context_length, seed=config.random_seed, weight_cache_dir=cache_dir(),
            quantization=config.quantization,
        )
        self.context_length = self.model_config.max_position_embeddings
        pack = kernels.linear_weight_packer(self.dtype, self.device)
        if pack is not None:  # fp32 on an AMD CPU: weights in oneDNN's layout (kernels/linear_onednn.py)
            self.model.pack_linear_weights(pack)
        cache_dtype = kv_cache_dtype(config.kv_cache_dtype, self.dtype, self.device)
        num_slots = kv_pool_num_slots(self.model_config, cache_dtype, self.device, config.max_total_tokens,
                                      config.mem_fraction, companion=draft_model_memory(config, cache_dtype))
        self.kv_pool = KVPool.for_model(self.model_config, num_slots, cache_dtype, self.device)
        scales = self.model.checkpoint_kv_scales
        if self.kv_pool.k_scales is not None and scales is not None:
            self.kv_pool.set_scales(*scales)  # the checkpoint's calibrated scales (else 1.0)
        self.slot_allocator = SlotAllocator(num_slots)
        self.req_to_token_pool = ReqToTokenPool(config.max_running_requests, self.context_length, self.device)
        logger.info("model %s on %s/%s; KV pool %d tokens (%.2f GiB)", self.model_path, self.device, self.dtype,
                    self.kv_pool.num_usable_slots, self.kv_pool.nbytes() / 2**30)
        # Decode steps on the CPU carry each decoding request's K/V across steps, in at most the pool's size of
        # memory or the CPU pool's default budget, whichever is larger (runtime/attention/decode_kv_copies.py).
        copies = None
        if self.device.type == "cpu":
            mc = self.model_config
            copies = DecodeKVCopies(mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim, self.dtype,
                                    max(self.kv_pool.nbytes(), CPU_KV_BUDGET_BYTES),
                                    self.req_to_token_pool.allocations, cascade=mc.sliding_window is None)
        self.attention = attention_backend_for(self.model_config, self.device, self.dtype, copies,
                                               multi_query_max_tokens=config.cuda_graph_max_row_tokens)
        # Decode steps on CUDA replay captured graphs (runtime/cuda_graph_runner.py); everything else runs eagerly.
        self.graph_runner = None
        self.last_forward_path = "eager"  # how the last forward ran: "graph", "multi-token <T>", "verify <k>"
        if self.device.type == "cuda" and config.cuda_graph:
            from radixgen.runtime.cuda_graph_runner import CudaGraphRunner

            self.graph_runner = CudaGraphRunner(
                self._run_model, self.req_to_token_pool.req_to_token,
                min(config.cuda_graph_max_bs, config.max_running_requests), self.context_length,
                row_tokens=multi_token_rows(config.cuda_graph_max_row_tokens),
                verify_max_bs=config.speculative_max_batch if config.speculative_algorithm is not None else 0,
                forward_with_hidden=self._run_model_with_hidden)

    def step_cost(self, batch_size: int, row_tokens: int) -> float:
        """Decode steps' worth of time a verify step of `batch_size` requests costs, up to `row_tokens` tokens each,
        every one scored: >= 1 where decode steps replay CUDA graphs, 1 where every step runs eagerly."""
        if self.graph_runner is None:
            return 1.0
        return self.graph_runner.step_cost(batch_size, row_tokens)

    def jump_step_cost(self, batch_size: int, extra_tokens: int) -> float:
        """Decode steps' worth of time a decode step of `batch_size` requests costs in which some append
        `extra_tokens` tokens beyond one each (jump-forward): >= 1 where decode steps replay CUDA graphs, 1 where
        every step runs eagerly."""
        if self.graph_runner is None:
            return 1.0
        return self.graph_runner.jump_step_cost(batch_size, extra_tokens)

    def decode_seconds(self, batch_size: int) -> float | None:
        """GPU seconds of a decode step of `batch_size` requests where decode steps replay graphs, else None."""
        return None if self.graph_runner is None else self.graph_runner.decode_seconds(batch_size)

    @property
    def max_graph_row_tokens(self) -> int | None:
        """The most new tokens per request a captured graph takes beside one-token rows (None: no graphs)."""
        if self.graph_runner is None:
            return None
        return self.graph_runner.max_row_tokens or 1

    @property
    def max_total_tokens(self) -> int:
        return self.kv_pool.num_usable_slots

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """The batch's logits: a captured graph's replay where one takes it, else the eager forward
        (`last_forward_path` names which)."""
        graphs = self.graph_runner
        if graphs is not None:
            if graphs.can_run(batch):
                self.last_forward_path = "graph"
                return graphs.replay(batch)
            k = graphs.verify_rows(batch)
            if k is not None:
                self.last_forward_path = f"verify {k}"
                return graphs.replay_verify(batch, k)
            tokens = graphs.short_rows(batch)
            if tokens is not None:
                self.last_forward_path = f"multi-token {tokens}"
                return graphs.replay_short(batch, tokens)
        self.last_forward_path = "eager"
        return self._run_model(batch)

    @torch.inference_mode()
    def forward_with_hidden(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`'s logits and the final hidden states of the same rows: a decode batch replays its graph
        (which keeps them), any other batch runs eagerly."""
        graphs = self.graph_runner
        if graphs is not None and graphs.can_run(batch):
            self.last_forward_path = "graph"
            return graphs.replay_with_hidden(batch)
        self.last_forward_path = "eager"
        return self._run_model_with_hidden(batch)

    def _run_model(self, batch: ForwardBatch) -> torch.Tensor:
        """The model's forward of `batch` with the attention backend's plan of it (planned here, once)."""
        return self.model(batch, self.kv_pool, self.attention, self.attention.plan(batch))

    def _run_model_with_hidden(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        backend: AttentionBackend[Any] = self.attention
        return self.model.forward_with_hidden(batch, self.kv_pool, backend, backend.plan(batch))


def multi_token_rows(max_row_tokens: int) -> tuple[int, ...]:
    """The row sizes of the multi-token graphs: 2, 4, 8, ... up to `max_row_tokens` (none below 2)."""
    sizes = []
    k = 2
    while k <= max_row_tokens:
        sizes.append(k)
        k *= 2
    return tuple(sizes)
