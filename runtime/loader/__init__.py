"""Model loading: a path (HF folder, GGUF file) or a config, to a LlamaForCausalLM on the target device and dtype.

    load_model(path, load_format, device, dtype) -> (model, config)

Formats: "safetensors" (HF folder), "gguf" (one .gguf file, or a folder holding exactly one), "dummy" (random
weights; the config comes from the folder's config.json or from `dummy_config`, an HF-style dict), "auto" (by
what the path is). Every failure a user can fix raises a ModelLoadError subclass with a one-line message.

`quantization` (runtime/quant/scheme.py) says what the layer linears become: GPTQ / AWQ / FP8 checkpoints
(`quantization_config` in config.json) load packed through a PackedLinearSink, a GGUF file's blocks stay packed
on CUDA (GGUFLinearBlocks), and a dense model is quantized after loading when asked to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from radixgen.kernels import fp8_unsupported_reason
from radixgen.runtime.config import ModelConfig
from radixgen.runtime.errors import ModelLoadError, ModelNotFoundError, UnsupportedQuantizationError
from radixgen.runtime.loader.dummy import init_dummy_weights
from radixgen.runtime.loader.gguf_file import hf_name, load_gguf_weights, open_gguf, read_gguf_config
from radixgen.runtime.loader.hf import (
    load_safetensors_weights,
    read_hf_config,
    read_json,
    safetensors_files,
)
from radixgen.runtime.loader.packed_sink import PackedLinearSink
from radixgen.runtime.loader.weight_cache import (
    load_cached_weights,
    save_cached_weights,
    weight_cache_file,
    worth_caching,
)
from radixgen.runtime.loader.weight_sink import WeightSink
from radixgen.runtime.models.llama import LlamaForCausalLM
from radixgen.runtime.quant.apply import quantize_linears
from radixgen.runtime.quant.gguf_linears import GGUFLinearBlocks
from radixgen.runtime.quant.scheme import (
    CheckpointQuant,
    Fp8Checkpoint,
    Int4Checkpoint,
    LoadQuant,
    RtnTarget,
    checkpoint_quant,
    plan_load,
)
from radixgen.tokenizer.loaders.gguf_reader import GGUFFile

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
               max_position_embeddings: int | None = None, seed: int = 0,
               weight_cache_dir: Path | None = None,
               quantization: str = "auto") -> tuple[LlamaForCausalLM, ModelConfig]:
    """Build the model for `path` with its weights on `device` in `dtype`.

    `max_position_embeddings` overrides the config's context length (sizes the rotary table).
    `weight_cache_dir`, when given, keeps a quantized GGUF's decoded weights there for the next load
    (runtime/loader/weight_cache.py). `quantization`: see the module docstring.
    """
    device = torch.device(device)
    hf_quant: Mapping[str, Any] | None = None
    if load_format == "dummy" and dummy_config is not None:
        config = ModelConfig.from_hf(dummy_config, source="dummy_config")
        fmt, target, gguf_file = "dummy", None, None
        hf_quant = dummy_config.get("quantization_config")
    elif path is None:
        raise ModelNotFoundError("no model path given (a dummy model without a path needs dummy_config)")
    else:
        # A dummy model over a path takes the config of whatever the path holds.
        fmt, target = resolve_format(Path(path), load_format)
        gguf_file = open_gguf(target) if fmt == "gguf" else None
        config = read_gguf_config(gguf_file, target) if gguf_file is not None else read_hf_config(target)
        if gguf_file is None:
            hf_quant = read_json(target / "config.json").get("quantization_config")
        if load_format == "dummy":
            fmt = "dummy"
    if max_position_embeddings is not None:
        config = replace(config, max_position_embeddings=max_position_embeddings)
    source = str(target) if target is not None else "dummy_config"
    plan = plan_load(quantization, checkpoint_quant(hf_quant, source), gguf_file is not None,
                     device.type == "cuda", source)
    _check_device(plan, device)

    if fmt == "dummy":  # random dense weights, quantized as a checkpoint of that scheme would be
        model = LlamaForCausalLM(config, device=device, dtype=dtype)
        init_dummy_weights(model, seed=seed)
        rtn = plan.rtn or _dummy_rtn(plan.checkpoint, plan.dequantize)
        if rtn is not None:
            quantize_linears(model, rtn)
        model.eval()
        return model, config
    assert target is not None  # only a dummy model goes without a path
    model = LlamaForCausalLM(config, device=device, dtype=dtype, dense_linears=plan.dense_linears)
    if gguf_file is not None:
        _load_gguf(model, gguf_file, config, target, device, weight_cache_dir, plan.gguf_blocks)
    else:
        sink = (WeightSink(model, str(target)) if plan.checkpoint is None
                else PackedLinearSink(model, str(target), plan.checkpoint, plan.dequantize))
        load_safetensors_weights(sink, safetensors_files(target), device)
        sink.finish()
        model.checkpoint_kv_scales = sink.kv_scales()
    if plan.rtn is not None:
        quantize_linears(model, plan.rtn)
    model.eval()
    return model, config


def _dummy_rtn(checkpoint: CheckpointQuant | None, dequantize: bool) -> RtnTarget | None:
    if checkpoint is None or dequantize:
        return None
    if isinstance(checkpoint, Int4Checkpoint):
        return RtnTarget("int4", group_size=checkpoint.group_size)
    return RtnTarget("fp8")


def _check_device(plan: LoadQuant, device: torch.device) -> None:
    """Refuse FP8 linears on a GPU without FP8 tensor cores."""
    fp8 = isinstance(plan.checkpoint, Fp8Checkpoint) and not plan.dequantize
    if fp8 or (plan.rtn is not None and plan.rtn.scheme == "fp8"):
        reason = fp8_unsupported_reason(device)
        if reason is not None:
            raise UnsupportedQuantizationError(reason)


def _load_gguf(model: LlamaForCausalLM, gguf_file: GGUFFile, config: ModelConfig, path: Path, device: torch.device,
               weight_cache_dir: Path | None, keep_blocks: bool) -> None:
    """The GGUF's weights into `model`: the layer linears' blocks as they are (`keep_blocks`), or everything
    from the weight cache when it holds them, else decoded (and cached)."""
    if keep_blocks:
        names = {hf_name(t.name): t.tensor_type.value for t in gguf_file.tensors}
        blocks = GGUFLinearBlocks(model, {n: v for n, v in names.items() if n is not None}, str(path))
        sink = WeightSink(model, str(path), exclude=blocks.names)
        load_gguf_weights(sink, gguf_file, config, path, device, blocks)
        sink.finish()
        blocks.finish()
        return
    cache = None
    if weight_cache_dir is not None and worth_caching(gguf_file, model):
        cache = weight_cache_file(path, next(model.parameters()).dtype, weight_cache_dir)
        if load_cached_weights(model, cache, device):
            return
    sink = WeightSink(model, str(path))
    load_gguf_weights(sink, gguf_file, config, path, device)
    sink.finish()
    if cache is not None:
        save_cached_weights(model, cache, path)
