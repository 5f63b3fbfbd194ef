"""Model loading: a path (HF folder, GGUF file) or a config, to a LlamaForCausalLM on the target device and dtype.

    load_model(path, load_format, device, dtype) -> (model, config)

Formats: "safetensors" (HF folder), "gguf" (one .gguf file, or a folder holding exactly one), "dummy" (random
weights; the config comes from the folder's config.json or from `dummy_config`, an HF-style dict), "auto" (by
what the path is). Every failure a user can fix raises a ModelLoadError subclass with a one-line message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from radixgen.runtime.config import ModelConfig
from radixgen.runtime.errors import ModelLoadError, ModelNotFoundError
from radixgen.runtime.loader.dummy import init_dummy_weights
from radixgen.runtime.loader.gguf_file import load_gguf_weights, open_gguf, read_gguf_config
from radixgen.runtime.loader.hf import load_safetensors_weights, read_hf_config, safetensors_files
from radixgen.runtime.loader.weight_sink import WeightSink
from radixgen.runtime.models.llama import LlamaForCausalLM

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")

__all__ = ["LOAD_FORMATS", "load_model", "read_model_config", "resolve_format"]


def resolve_format(path: Path, load_format: str) -> tuple[str, Path]:
    """(format of the weights, the file or folder to read) for an existing path ("dummy" reads like "auto")."""
    if load_format not in LOAD_FORMATS:
        raise ModelLoadError(f"unknown load format {load_format!r}; known: {', '.join(LOAD_FORMATS)}")
    if not path.exists():
        raise ModelNotFoundError(f"model path {path} does not exist")
    if path.is_file():
        if load_format == "safetensors":
            raise ModelLoadError(f"{path}: load_format 'safetensors' needs a folder with config.json")
        return "gguf", path
    if load_format == "gguf" or not (path / "config.json").exists():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return "gguf", ggufs[0]
        if load_format == "gguf" or ggufs:
            raise ModelNotFoundError(f"{path}: expected exactly one .gguf file, found {len(ggufs)}; pass the file")
    return "safetensors", path


def read_model_config(path: str | Path, load_format: str = "auto") -> ModelConfig:
    """The ModelConfig of a model folder or GGUF file, without loading weights."""
    fmt, target = resolve_format(Path(path), load_format)
    if fmt == "gguf":
        return read_gguf_config(open_gguf(target), target)
    return read_hf_config(target)


def load_model(path: str | Path | None, load_format: str = "auto", device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32, dummy_config: Mapping[str, Any] | None = None,
               max_position_embeddings: int | None = None, seed: int = 0) -> tuple[LlamaForCausalLM, ModelConfig]:
    """Build the model for `path` with its weights on `device` in `dtype`.

    `max_position_embeddings` overrides the config's context length (sizes the rotary table).
    """
    device = torch.device(device)
    if load_format == "dummy" and dummy_config is not None:
        config = ModelConfig.from_hf(dummy_config, source="dummy_config")
        fmt, target, gguf_file = "dummy", None, None
    elif path is None:
        raise ModelNotFoundError("no model path given (a dummy model without a path needs dummy_config)")
    else:
        # A dummy model over a path takes the config of whatever the path holds.
        fmt, target = resolve_format(Path(path), load_format)
        gguf_file = open_gguf(target) if fmt == "gguf" else None
        config = read_gguf_config(gguf_file, target) if gguf_file is not None else read_hf_config(target)
        if load_format == "dummy":
            fmt = "dummy"
    if max_position_embeddings is not None:
        config = replace(config, max_position_embeddings=max_position_embeddings)

    model = LlamaForCausalLM(config, device=device, dtype=dtype)
    if fmt == "dummy":
        init_dummy_weights(model, seed=seed)
    else:
        assert target is not None  # only a dummy model goes without a path
        sink = WeightSink(model, str(target))
        if fmt == "gguf":
            assert gguf_file is not None
            load_gguf_weights(sink, gguf_file, config, target, device)
        else:
            load_safetensors_weights(sink, safetensors_files(target), device)
        sink.finish()
    model.eval()
    return model, config
