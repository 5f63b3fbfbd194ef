"""Dequantized GGUF weights kept on disk, so that a later start reads them instead of decoding every block again.

The first load of a quantized GGUF file writes the model's parameters, as they are after loading (fused, in the
target dtype), to one safetensors file under `<cache dir>/weights/`; a later load of the same file (same path,
size and modification time) with the same dtype copies them straight in. A missing, stale or unreadable cache
file only means the slow path: it is never an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from radixgen.runtime.models.llama import LlamaForCausalLM
from radixgen.tokenizer.loaders.gguf_reader import GGUFFile

logger = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when the parameter layout a cache file holds changes
MAX_CACHED_BYTES = 4 << 30  # larger models are decoded at every start rather than written out at full size
_UNQUANTIZED = {"F32", "F16", "BF16"}


def weight_cache_file(source: Path, dtype: torch.dtype, root: Path) -> Path:
    """Where the weights of GGUF file `source`, loaded as `dtype`, are cached under `root`."""
    stat = source.stat()
    return root / "weights" / (f"{_source_prefix(source, dtype)}"
                               f"{_digest(f'{CACHE_FORMAT}|{stat.st_size}|{stat.st_mtime_ns}')}.safetensors")


def _source_prefix(source: Path, dtype: torch.dtype) -> str:
    """The part of a cache file's name shared by every version of one source file in one dtype."""
    return f"{source.stem}-{_digest(f'{source.resolve()}|{dtype}')}-"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def worth_caching(gguf_file: GGUFFile, model: LlamaForCausalLM) -> bool:
    """Cache only what is slow to decode (quantized blocks) and not too large to write out."""
    quantized = any(t.tensor_type.name not in _UNQUANTIZED for t in gguf_file.tensors)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return quantized and size <= MAX_CACHED_BYTES


@torch.no_grad()
def load_cached_weights(model: LlamaForCausalLM, file: Path, device: torch.device) -> bool:
    """Copy the cached parameters into `model`; False (model untouched or to be overwritten) if the file is
    absent or does not match the model's parameters exactly."""
    if not file.is_file():
        return False
    params = dict(model.named_parameters())
    if device.type == "cpu":
        return _read_into(params, file)
    try:
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            if set(f.keys()) != set(params):
                return False
            for name, param in params.items():
                tensor = f.get_tensor(name)
                if tensor.shape != param.shape or tensor.dtype != param.dtype:
                    return False
                param.copy_(tensor)
    except (SafetensorError, OSError) as e:
        logger.warning("%s: unreadable weight cache, decoding the model again (%s)", file, e)
        return False
    return True


def _read_into(params: dict[str, torch.nn.Parameter], file: Path) -> bool:
    """Read each tensor of safetensors `file` straight into its CPU parameter's memory. A memory map of the file
    would hold the file's pages in the process beside the parameters until closed: twice the model at the peak."""
    try:
        with open(file, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(header_len))
            header.pop("__metadata__", None)
            if set(header) != set(params):
                return False
            for name, param in params.items():
                entry = header[name]
                start, stop = entry["data_offsets"]
                fits = (tuple(entry["shape"]) == tuple(param.shape) and param.is_contiguous()
                        and entry["dtype"] == _SAFETENSORS_DTYPES.get(param.dtype)
                        and stop - start == param.numel() * param.element_size())
                if not fits:
                    return False
                f.seek(8 + header_len + start)
                if f.readinto(param.data.view(-1).view(torch.uint8).numpy().data) != stop - start:
                    return False
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.warning("%s: unreadable weight cache, decoding the model again (%s)", file, e)
        return False
    return True


_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def save_cached_weights(model: LlamaForCausalLM, file: Path, source: Path) -> None:
    """Write the model's parameters to `file` (through a temporary file, so a reader never sees half of it),
    removing the cache files of older versions of `source`."""
    tensors = {name: p.detach().contiguous().cpu() for name, p in model.named_parameters()}
    dtype = next(iter(tensors.values())).dtype
    for stale in file.parent.glob(f"{_source_prefix(source, dtype)}*.safetensors"):
        if stale != file:
            stale.unlink(missing_ok=True)
    tmp = file.with_name(f"{file.name}.{os.getpid()}.tmp")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(tmp))
        os.replace(tmp, file)
    except OSError as e:
        logger.warning("%s: could not write the weight cache (%s); later starts decode the model again", file, e)
        tmp.unlink(missing_ok=True)
