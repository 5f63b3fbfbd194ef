"""ModelConfig: the shape and options of one Llama-family decoder, read from an HF config.json or GGUF metadata.

One dataclass describes every supported family; the differences are fields, not subclasses:

    family    qkv bias   q/k RMSNorm   sliding window            typical rope
    llama     optional   no            no                        default / linear / llama3
    mistral   no         no            optional (all layers)     default
    qwen2     yes        no            optional (upper layers)   default
    qwen3     optional   yes           optional (upper layers)   default
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from radixgen.runtime.errors import ModelLoadError, UnsupportedArchitectureError

# HF `architectures[0]` -> family name used throughout the runtime.
HF_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
# GGUF `general.architecture` values we read (llama.cpp stores Mistral models as "llama").
GGUF_ARCHITECTURES: tuple[str, ...] = ("llama", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # family: llama | mistral | qwen2 | qwen3
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Mapping[str, Any] | None  # None = plain rope; else has "rope_type" in SUPPORTED_ROPE_TYPES
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2 always; Llama/Qwen3 attention_bias)
    attention_out_bias: bool = False  # o_proj carries a bias (Llama/Qwen3 attention_bias; never Qwen2)
    mlp_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each head of q and k before rope (Qwen3)
    sliding_window: int | None = None  # attend to the last `sliding_window` positions; None = full attention
    sliding_window_start_layer: int = 0  # layers >= this use the window (Qwen's max_window_layers)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    torch_dtype: str | None = None  # the dtype the checkpoint was saved in, informational
    # GGUF's form of llama3 scaling: each rotary inverse frequency is divided by its factor (rope_freqs tensor).
    rope_freq_factors: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelLoadError(
                f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def layer_sliding_window(self, layer: int) -> int | None:
        """The attention window of layer `layer` (None = full attention)."""
        if self.sliding_window is None or layer < self.sliding_window_start_layer:
            return None
        return self.sliding_window

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV pool memory one token takes across all layers (K and V)."""
        return 2 * self.num_hidden_layers * self.kv_size * dtype_bytes

    def num_parameters(self) -> int:
        """Weights the model holds (embeddings, attention, MLP, norms; biases left out): sizes memory before load."""
        h = self.hidden_size
        attention = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        mlp = 3 * h * self.intermediate_size
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return embeddings + self.num_hidden_layers * (attention + mlp + norms) + h

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any], generation_config: Mapping[str, Any] | None = None,
                source: str = "config.json") -> ModelConfig:
        """Build from the dict of an HF config.json (and generation_config.json, for extra EOS ids)."""
        archs = cfg.get("architectures") or []
        arch_name = archs[0] if archs else None
        family = HF_ARCHITECTURES.get(arch_name) if arch_name else None
        if family is None:
            found = arch_name or f"model_type={cfg.get('model_type')!r}"
            raise UnsupportedArchitectureError(
                f"{source}: unsupported architecture {found}; supported: {', '.join(HF_ARCHITECTURES)}"
            )
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedArchitectureError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            layers = int(cfg["num_hidden_layers"])
            rope_theta, rope_scaling = _hf_rope(cfg, source)
            sliding_window, window_start = _hf_sliding_window(cfg, family, layers)
            bias = bool(cfg.get("attention_bias", False))
            return cls(
                architecture=family,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=rope_theta,
                rope_scaling=rope_scaling,
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias={"qwen2": True, "mistral": False}.get(family, bias),
                attention_out_bias=bias if family in ("llama", "qwen3") else False,
                mlp_bias=bool(cfg.get("mlp_bias", False)) if family == "llama" else False,
                qk_norm=family == "qwen3",
                sliding_window=sliding_window,
                sliding_window_start_layer=window_start,
                bos_token_id=_opt_int(cfg.get("bos_token_id")),
                eos_token_ids=_eos_ids(cfg.get("eos_token_id"),
                                       (generation_config or {}).get("eos_token_id")),
                torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            )
        except KeyError as e:
            raise ModelLoadError(f"{source}: missing required field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ModelLoadError(f"{source}: invalid value: {e}") from None

    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], tensor_names: set[str], source: str = "GGUF",
                  rope_freq_factors: tuple[float, ...] | None = None) -> ModelConfig:
        """Build from GGUF metadata (key -> python value), the file's tensor names (which optional weights exist)
        and, when the file has a `rope_freqs` tensor, its values."""
        arch = meta.get("general.architecture")
        if arch not in GGUF_ARCHITECTURES:
            raise UnsupportedArchitectureError(
                f"{source}: unsupported GGUF architecture {arch!r}; supported: {', '.join(GGUF_ARCHITECTURES)}"
            )
        def key(name: str, default: Any = None) -> Any:
            value = meta.get(f"{arch}.{name}", default)
            if value is None:
                raise ModelLoadError(f"{source}: missing metadata {arch}.{name}")
            return value

        hidden = int(key("embedding_length"))
        heads = int(key("attention.head_count"))
        vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or ())
        if not vocab:
            raise ModelLoadError(f"{source}: missing metadata {arch}.vocab_size")
        scaling_type = meta.get(f"{arch}.rope.scaling.type")
        rope_scaling = None
        if scaling_type == "linear":
            rope_scaling = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
        elif scaling_type not in (None, "none"):
            raise ModelLoadError(f"{source}: unsupported rope scaling {scaling_type!r}; supported: none, linear")
        return cls(
            architecture=arch,
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(key("feed_forward_length")),
            num_hidden_layers=int(key("block_count")),
            num_attention_heads=heads,
            num_key_value_heads=int(key("attention.head_count_kv", heads)),
            head_dim=int(key("attention.key_length", hidden // heads)),
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(key("context_length", 2048)),
            tie_word_embeddings="output.weight" not in tensor_names,
            attention_bias="blk.0.attn_q.bias" in tensor_names,
            attention_out_bias="blk.0.attn_output.bias" in tensor_names,
            qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
            bos_token_id=_opt_int(meta.get("tokenizer.ggml.bos_token_id")),
            eos_token_ids=_eos_ids(meta.get("tokenizer.ggml.eos_token_id"), None),
            rope_freq_factors=rope_freq_factors,
        )


def _hf_rope(cfg: Mapping[str, Any], source: str) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None) from the classic fields or transformers 5's `rope_parameters`."""
    params = dict(cfg.get("rope_parameters") or {})
    theta = float(cfg.get("rope_theta") or params.pop("rope_theta", None) or 10000.0)
    params.pop("rope_theta", None)
    scaling = dict(cfg.get("rope_scaling") or params or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"{source}: unsupported rope_scaling type {kind!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if kind == "default":
        return theta, None
    scaling["rope_type"] = kind
    return theta, scaling


def _hf_sliding_window(cfg: Mapping[str, Any], family: str, layers: int) -> tuple[int | None, int]:
    """(window, first windowed layer). Qwen only windows when use_sliding_window, from max_window_layers."""
    window = cfg.get("sliding_window")
    if family in ("llama",) or window is None:
        return None, 0
    if family == "mistral":
        return int(window), 0
    if not cfg.get("use_sliding_window", False):
        return None, 0
    start = int(cfg.get("max_window_layers", 0))
    return (int(window), start) if start < layers else (None, 0)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _eos_ids(primary: Any, extra: Any) -> tuple[int, ...]:
    """Every EOS id, config first, in order, without duplicates (ids may be an int or a list)."""
    out: list[int] = []
    for value in (primary, extra):
        for v in (value if isinstance(value, (list, tuple)) else [value]):
            if v is not None and int(v) not in out:
                out.append(int(v))
    return tuple(out)
