"""Tiny random checkpoints of every model family, shared by the suite (the default model is conftest.py's).

Tiny checkpoints are written by transformers (test-only) from hand-written config.json dicts in the classic HF
format (`rope_theta`, `rope_scaling`), the way real checkpoints on disk look.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

_BASE = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}

# family name -> config.json contents
TINY_CONFIGS: dict[str, dict] = {
    "llama": {**_BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama"},
    "llama3": {
        **_BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32},
        "eos_token_id": [2, 3],
    },
    "llama_bias": {**_BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": True,
                   "mlp_bias": True},
    "mistral": {**_BASE, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 4},
    "qwen2": {**_BASE, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "tie_word_embeddings": True,
              "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 2},
    "qwen3": {**_BASE, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 32,
              "use_sliding_window": False, "attention_bias": False},
}


def write_tiny_checkpoint(folder: Path, family: str, seed: int = 0, max_shard_size: str | None = None,
                          overrides: dict | None = None) -> Path:
    """Save a random `family` model (every weight, norms and biases included, drawn at random) to `folder`;
    `overrides` replace entries of its config (e.g. a real tokenizer's `vocab_size`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    cfg_dict = {**copy.deepcopy(TINY_CONFIGS[family]), **(overrides or {})}
    (folder / "config.json").write_text(json.dumps(cfg_dict))
    config = AutoConfig.from_pretrained(folder)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if p.dim() == 1 and "norm" in name else 0.0
            p.copy_(base + 0.2 * torch.randn_like(p))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    (folder / "config.json").write_text(json.dumps(cfg_dict))  # keep the classic format, not the re-saved one
    return folder

