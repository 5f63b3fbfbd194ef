"""Hugging Face folders: config.json (+ generation_config.json) and safetensors shards, loaded memory-mapped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from radixgen.runtime.config import ModelConfig
from radixgen.runtime.errors import CorruptModelFileError, ModelNotFoundError
from radixgen.runtime.loader.weight_sink import WeightSink

INDEX_FILE = "model.safetensors.index.json"


def read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise CorruptModelFileError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CorruptModelFileError(f"{path}: expected a JSON object")
    return data


def read_hf_config(folder: Path) -> ModelConfig:
    """ModelConfig from folder/config.json, with EOS ids from generation_config.json when present."""
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ModelNotFoundError(f"{folder}: no config.json (expected a Hugging Face model folder or a .gguf file)")
    gen_path = folder / "generation_config.json"
    gen = read_json(gen_path) if gen_path.is_file() else None
    return ModelConfig.from_hf(read_json(cfg_path), gen, source=str(cfg_path))


def safetensors_files(folder: Path) -> list[Path]:
    """The shards named by the index file, or every *.safetensors file of the folder."""
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CorruptModelFileError(f"{index}: no weight_map")
        files = [folder / name for name in sorted(set(weight_map.values()))]
        for f in files:
            if not f.is_file():
                raise CorruptModelFileError(f"{index}: names shard {f.name}, which is missing from {folder}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"{folder}: no *.safetensors weights (PyTorch .bin checkpoints are not supported)")
    return files


def load_safetensors_weights(sink: WeightSink, files: list[Path], device: torch.device) -> None:
    """Stream every wanted tensor of every shard into the sink, one tensor at a time, memory-mapped."""
    for path in files:
        try:
            with safe_open(str(path), framework="pt", device=str(device)) as f:
                names = f.keys()  # safe_open is not iterable
                for name in names:
                    if sink.wants(name):
                        sink.put(name, f.get_tensor(name), origin=str(path))
                    else:
                        sink.skip(name, origin=str(path))
        except (SafetensorError, OSError) as e:  # truncated or malformed file
            raise CorruptModelFileError(f"{path}: truncated or corrupt safetensors file ({e})") from None
