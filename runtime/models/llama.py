"""The Llama-family decoder (Llama 2/3, Mistral, Qwen2/2.5, Qwen3, SmolLM2): one implementation, chosen by config.

The forward consumes a ForwardBatch (flat tokens of many requests, their positions and KV slots), the KV pool,
and an attention backend with its plan of this batch (runtime/attention/); each layer writes its new tokens' K/V
into their slots, then the backend reads every position of every request by slot, so a prefix cached by another
request is read in place. Every other numeric op goes through `radixgen.kernels` (Triton on CUDA, the torch
reference elsewhere); this file only wires them together.

Weights are stored fused: q/k/v as one `qkv_proj` and gate/up as one `gate_up_proj`, so attention input and the
MLP input each take a single matmul. `checkpoint_targets()` maps every checkpoint tensor name (HF naming) to the
rows of the fused parameter it fills, so loaders copy tensor by tensor with no intermediate model.

The four matmul weights of a layer may also be quantized (`kernels.quant_weight`: int4, FP8, GGUF blocks):
`linear_slots()` names each with the checkpoint modules it fuses, and `set_linear` swaps one in; a model built
with `dense_linears=False` holds no dense copy of them meanwhile (runtime/quant/ fills them at load). The
embedding and the LM head stay dense.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from radixgen import kernels
from radixgen.kernels.quant_weight import LinearWeight
from radixgen.runtime.attention import AttentionBackend
from radixgen.runtime.config import ModelConfig
from radixgen.runtime.forward_batch import ForwardBatch
from radixgen.runtime.kv_pool import KVPool

M = TypeVar("M")  # the attention backend's plan of one forward


def _param(*shape: int, device: torch.device, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)


def _rope_cache(config: ModelConfig, device: torch.device) -> torch.Tensor:
    """[max_position, head_dim] = cat(cos, sin); GGUF's per-frequency factors divide the inverse frequencies."""
    if config.rope_freq_factors is None:
        return kernels.rope_cos_sin_cache(config.head_dim, config.max_position_embeddings, config.rope_theta,
                                          config.rope_scaling, dtype=torch.float32, device=device)
    inv_freq = kernels.rope_inv_freq(config.head_dim, config.rope_theta, None)
    inv_freq = inv_freq / torch.tensor(config.rope_freq_factors, dtype=torch.float32)
    freqs = torch.outer(torch.arange(config.max_position_embeddings, dtype=torch.float32), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(device)


@dataclass(frozen=True)
class LinearSlot:
    """One matmul weight of the model: attribute `attr` of `module`, the row-wise concatenation of the checkpoint
    modules `shards` (HF prefixes such as "model.layers.0.self_attn.q_proj", each with its row count)."""

    module: nn.Module
    attr: str
    shards: tuple[tuple[str, int], ...]

    @property
    def weight(self) -> LinearWeight:
        w = getattr(self.module, self.attr)
        assert isinstance(w, LinearWeight)
        return w


@dataclass(frozen=True)
class WeightTarget:
    """Where one checkpoint tensor goes: rows [start, stop) of `param` (the whole param for unfused weights)."""

    param: torch.Tensor
    start: int
    stop: int


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, device: torch.device, dtype: torch.dtype,
                 linear_device: torch.device) -> None:
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_size, self.kv_size = c.q_size, c.kv_size
        self.eps = c.rms_norm_eps
        self.layer = layer  # its K/V buffers in the pool, and the backend's view of it (scale, sliding window)
        p = functools.partial(_param, device=device, dtype=dtype)
        lin = functools.partial(_param, device=linear_device, dtype=dtype)
        self.qkv_proj = lin(c.q_size + 2 * c.kv_size, c.hidden_size)
        self.qkv_bias = p(c.q_size + 2 * c.kv_size) if c.attention_bias else None
        self.o_proj = lin(c.hidden_size, c.q_size)
        self.o_bias = p(c.hidden_size) if c.attention_out_bias else None
        self.q_norm = p(c.head_dim) if c.qk_norm else None
        self.k_norm = p(c.head_dim) if c.qk_norm else None

    def forward(self, x: torch.Tensor, batch: ForwardBatch, k_cache: torch.Tensor, v_cache: torch.Tensor,
                cos_sin: torch.Tensor, attention: AttentionBackend[M], plan: M,
                kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        t = x.shape[0]
        qkv = kernels.linear(x, self.qkv_proj, self.qkv_bias)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = kernels.rmsnorm(q, self.q_norm, self.eps)
            k = kernels.rmsnorm(k, self.k_norm, self.eps)
        # q and k stay views of qkv: the rotary, KV-store and attention kernels take their strides
        kernels.apply_rotary(q, k, batch.positions, cos_sin, is_neox=True)
        if kv_scales is None:
            kernels.store_kv(k_cache, v_cache, batch.out_cache_loc, k, v)
        else:  # an FP8 pool: codes x / scale
            kernels.store_kv(k_cache, v_cache, batch.out_cache_loc, k, v, *kv_scales)
        o = attention.forward(q, k_cache, v_cache, self.layer, plan, kv_scales)
        return kernels.linear(o.reshape(t, self.q_size), self.o_proj, self.o_bias)


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig, device: torch.device, dtype: torch.dtype,
                 linear_device: torch.device) -> None:
        super().__init__()
        p = functools.partial(_param, device=device, dtype=dtype)
        inter = config.intermediate_size
        self.gate_up_proj = _param(2 * inter, config.hidden_size, device=linear_device, dtype=dtype)
        self.gate_up_bias = p(2 * inter) if config.mlp_bias else None
        self.down_proj = _param(config.hidden_size, inter, device=linear_device, dtype=dtype)
        self.down_bias = p(config.hidden_size) if config.mlp_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = kernels.linear(x, self.gate_up_proj, self.gate_up_bias)
        return kernels.linear(kernels.silu_and_mul(gate_up), self.down_proj, self.down_bias)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, device: torch.device, dtype: torch.dtype,
                 linear_device: torch.device) -> None:
        super().__init__()
        self.eps = config.rms_norm_eps
        self.input_layernorm = _param(config.hidden_size, device=device, dtype=dtype)
        self.post_attention_layernorm = _param(config.hidden_size, device=device, dtype=dtype)
        self.self_attn = LlamaAttention(config, layer, device, dtype, linear_device)
        self.mlp = LlamaMLP(config, device, dtype, linear_device)

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch, k_cache: torch.Tensor,
                v_cache: torch.Tensor, cos_sin: torch.Tensor, attention: AttentionBackend[M],
                plan: M, kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, residual) -> (mlp output, residual stream before the MLP's add); residual None on layer 0."""
        if residual is None:
            residual = h
            x = kernels.rmsnorm(h, self.input_layernorm, self.eps)
        else:
            x, residual = kernels.fused_add_rmsnorm(h, residual, self.input_layernorm, self.eps)
        h = self.self_attn(x, batch, k_cache, v_cache, cos_sin, attention, plan, kv_scales)
        x, residual = kernels.fused_add_rmsnorm(h, residual, self.post_attention_layernorm, self.eps)
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    """Decoder + LM head. `forward(batch, kv_pool, attention, plan) -> logits [num_logit_rows, vocab]` in
    float32, `plan` being `attention.plan(batch)`. `dense_linears=False` leaves the layers' matmul weights
    unallocated (on the meta device) until `set_linear` fills them."""

    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, dense_linears: bool = True) -> None:
        super().__init__()
        device = torch.device(device)
        linear_device = device if dense_linears else torch.device("meta")
        self.config = config
        self.embed_tokens = _param(config.vocab_size, config.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, device, dtype, linear_device) for i in range(config.num_hidden_layers)
        )
        self.norm = _param(config.hidden_size, device=device, dtype=dtype)
        self.lm_head = (self.embed_tokens if config.tie_word_embeddings
                        else _param(config.vocab_size, config.hidden_size, device=device, dtype=dtype))
        # cos/sin table for every position the model supports, fp32 (precision of long positions).
        self.register_buffer("cos_sin_cache", _rope_cache(config, device), persistent=False)
        # An FP8 checkpoint's KV cache scales (K, V), as the loader found them; an FP8 KV pool takes them.
        self.checkpoint_kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    def decoder_layers(self) -> Iterator[LlamaDecoderLayer]:
        for layer in self.layers:
            assert isinstance(layer, LlamaDecoderLayer)
            yield layer

    def forward(self, batch: ForwardBatch, kv_pool: KVPool, attention: AttentionBackend[M],
                plan: M) -> torch.Tensor:
        """Run the batch, writing its K/V into `kv_pool`, and return fp32 logits of the logit rows."""
        return self.forward_with_hidden(batch, kv_pool, attention, plan)[0]

    def forward_with_hidden(self, batch: ForwardBatch, kv_pool: KVPool, attention: AttentionBackend[M],
                            plan: M) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`'s logits, and the final (normed) hidden states of the same rows, which the LM head reads."""
        h = self.embed_tokens[batch.input_ids]
        residual: torch.Tensor | None = None
        for i, layer in enumerate(self.layers):
            h, residual = layer(h, residual, batch, kv_pool.k_buffers[i], kv_pool.v_buffers[i], self.cos_sin_cache,
                                attention, plan, kv_pool.scales(i))
        assert residual is not None, "a model without layers"
        rows = batch.logits_indices if batch.logits_indices is not None else batch.last_token_indices()
        x, _ = kernels.fused_add_rmsnorm(h[rows], residual[rows], self.norm, self.config.rms_norm_eps)
        return kernels.linear(x, self.lm_head).float(), x

    def pack_linear_weights(self, pack: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace every dense matmul weight with `pack(weight)` (`kernels.linear_weight_packer`: a layout only
        `kernels.linear` reads); quantized ones stay. An untied LM head is packed too; a tied one stays the
        embedding table itself (the lookup needs the plain table, and a packed copy would hold it twice)."""
        for slot in self.linear_slots():
            w = slot.weight
            if isinstance(w, torch.Tensor):
                setattr(slot.module, slot.attr, nn.Parameter(pack(w), requires_grad=False))
        if not self.config.tie_word_embeddings:
            self.lm_head = nn.Parameter(pack(self.lm_head), requires_grad=False)

    def linear_slots(self) -> list[LinearSlot]:
        """Every layer's matmul weight, with the checkpoint modules it fuses (the LM head is not one of them)."""
        c = self.config
        out = []
        for i, layer in enumerate(self.decoder_layers()):
            p, attn, mlp = f"model.layers.{i}.", layer.self_attn, layer.mlp
            out += [
                LinearSlot(attn, "qkv_proj", ((p + "self_attn.q_proj", c.q_size), (p + "self_attn.k_proj", c.kv_size),
                                              (p + "self_attn.v_proj", c.kv_size))),
                LinearSlot(attn, "o_proj", ((p + "self_attn.o_proj", c.hidden_size),)),
                LinearSlot(mlp, "gate_up_proj", ((p + "mlp.gate_proj", c.intermediate_size),
                                                 (p + "mlp.up_proj", c.intermediate_size))),
                LinearSlot(mlp, "down_proj", ((p + "mlp.down_proj", c.hidden_size),)),
            ]
        return out

    @staticmethod
    def set_linear(slot: LinearSlot, weight: LinearWeight) -> None:
        """Put `weight` (dense or quantized, [rows of all shards, in features]) in `slot`."""
        if hasattr(slot.module, slot.attr):
            delattr(slot.module, slot.attr)  # a registered parameter refuses a non-tensor value
        if isinstance(weight, torch.Tensor) and not isinstance(weight, nn.Parameter):
            weight = nn.Parameter(weight, requires_grad=False)
        setattr(slot.module, slot.attr, weight)

    def checkpoint_targets(self) -> dict[str, WeightTarget]:
        """Every tensor name a checkpoint (HF naming) must provide -> where it goes in the fused parameters."""
        c = self.config
        q, kv, inter = c.q_size, c.kv_size, c.intermediate_size
        out: dict[str, WeightTarget] = {}

        def put(name: str, param: torch.Tensor | None, start: int = 0, stop: int | None = None) -> None:
            if param is not None:
                out[name] = WeightTarget(param, start, param.shape[0] if stop is None else stop)

        put("model.embed_tokens.weight", self.embed_tokens)
        put("model.norm.weight", self.norm)
        if not c.tie_word_embeddings:
            put("lm_head.weight", self.lm_head)
        for i, layer in enumerate(self.decoder_layers()):
            p, attn, mlp = f"model.layers.{i}.", layer.self_attn, layer.mlp
            put(p + "input_layernorm.weight", layer.input_layernorm)
            put(p + "post_attention_layernorm.weight", layer.post_attention_layernorm)
            for kind, param in (("weight", attn.qkv_proj), ("bias", attn.qkv_bias)):
                put(f"{p}self_attn.q_proj.{kind}", param, 0, q)
                put(f"{p}self_attn.k_proj.{kind}", param, q, q + kv)
                put(f"{p}self_attn.v_proj.{kind}", param, q + kv, q + 2 * kv)
            put(p + "self_attn.o_proj.weight", attn.o_proj)
            put(p + "self_attn.o_proj.bias", attn.o_bias)
            put(p + "self_attn.q_norm.weight", attn.q_norm)
            put(p + "self_attn.k_norm.weight", attn.k_norm)
            for kind, param in (("weight", mlp.gate_up_proj), ("bias", mlp.gate_up_bias)):
                put(f"{p}mlp.gate_proj.{kind}", param, 0, inter)
                put(f"{p}mlp.up_proj.{kind}", param, inter, 2 * inter)
            put(p + "mlp.down_proj.weight", mlp.down_proj)
            put(p + "mlp.down_proj.bias", mlp.down_bias)
        return out
