"""GGUF files (llama.cpp's format): metadata -> ModelConfig, tensors dequantized one at a time to the target dtype.

radixgen.tokenizer.loaders.gguf_reader parses the file (memory-mapped); the `gguf` package dequantizes the block
formats. Two llama.cpp conventions are undone here: tensor names (`blk.N.attn_q.weight` ->
`model.layers.N.self_attn.q_proj.weight`), and for the `llama` architecture the row permutation of the Q and K
projections (llama.cpp interleaves the two rotary halves of each head; the HF layout our rope uses keeps them as two
contiguous halves).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from gguf import GGMLQuantizationType

from radixgen.runtime.config import ModelConfig
from radixgen.runtime.errors import CorruptModelFileError, UnsupportedQuantizationError
from radixgen.runtime.loader.dequant import dequantize_to_torch
from radixgen.runtime.loader.weight_sink import WeightSink
from radixgen.tokenizer.loaders.gguf_reader import GGUFFile, GGUFFormatError, GGUFTensor, GGUFTypeError, read_gguf

Q = GGMLQuantizationType
SUPPORTED_TYPES: frozenset[GGMLQuantizationType] = frozenset(
    {Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K}
)

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_CONFIG_TENSORS = frozenset({"rope_freqs.weight"})  # read into ModelConfig, not weights
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_name(gguf_name: str) -> str | None:
    """The HF checkpoint name of a GGUF tensor, or None when it has no counterpart."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    return None


def open_gguf(path: Path) -> GGUFFile:
    """`read_gguf(path)` with its format errors as the loader's ModelLoadError subclasses."""
    try:
        return read_gguf(path)
    except GGUFTypeError as e:
        raise UnsupportedQuantizationError(str(e)) from None
    except GGUFFormatError as e:
        raise CorruptModelFileError(str(e)) from None


def read_gguf_config(gguf_file: GGUFFile, path: Path) -> ModelConfig:
    meta = dict(gguf_file.metadata)
    arch = meta.get("general.architecture")
    if f"{arch}.vocab_size" not in meta:  # older files: the vocabulary is the embedding's row count
        for t in gguf_file.tensors:
            if t.name == "token_embd.weight":
                meta[f"{arch}.vocab_size"] = int(t.shape[0])
    factors = None
    for t in gguf_file.tensors:
        if t.name == "rope_freqs.weight":
            factors = tuple(float(f) for f in dequantize_tensor(t, path).flatten())
    return ModelConfig.from_gguf(meta, {t.name for t in gguf_file.tensors}, source=str(path),
                                 rope_freq_factors=factors)


def unpermute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's rotary row permutation of a Q or K weight [heads * head_dim, ...] (or bias).

    llama.cpp stores, within each head, row 2i + half for HF row half * head_dim / 2 + i.
    """
    rows = w.shape[0]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def dequantize_tensor(tensor: GGUFTensor, path: Path, device: torch.device | str = "cpu") -> torch.Tensor:
    """A GGUF tensor as an fp32 torch tensor on `device`, in HF orientation ([out, in] for matrices)."""
    if tensor.tensor_type not in SUPPORTED_TYPES:
        raise UnsupportedQuantizationError(_unsupported_message(path, tensor))
    try:
        return dequantize_to_torch(tensor.data, tensor.tensor_type, tensor.shape, torch.device(device))
    except (ValueError, RuntimeError) as e:  # byte count does not fit the shape
        raise CorruptModelFileError(f"{path}: tensor {tensor.name} could not be dequantized ({e})") from None


class BlockSink(Protocol):
    """Takes the still-packed blocks of the tensors it wants (runtime/quant/gguf_linears.py)."""

    def wants_blocks(self, name: str) -> bool: ...

    def put_blocks(self, name: str, blocks: torch.Tensor, qtype: int, in_features: int) -> None: ...


def tensor_blocks(tensor: GGUFTensor, device: torch.device) -> torch.Tensor:
    """A quantized matrix's bytes as stored, uint8 [rows, bytes per row], on `device`."""
    return torch.from_numpy(np.array(tensor.data, copy=True)).reshape(tensor.shape[0], -1).to(device)


def load_gguf_weights(sink: WeightSink, gguf_file: GGUFFile, config: ModelConfig, path: Path,
                      device: torch.device, blocks: BlockSink | None = None) -> None:
    """Dequantize, un-permute and copy every tensor into the sink, one tensor at a time; the tensors `blocks`
    wants go to it packed (rows un-permuted all the same)."""
    for t in gguf_file.tensors:  # check every type first: fail before spending time on the others
        if t.tensor_type not in SUPPORTED_TYPES:
            raise UnsupportedQuantizationError(_unsupported_message(path, t))
    permuted = config.architecture == "llama"
    for t in gguf_file.tensors:
        name = hf_name(t.name)
        if t.name in _CONFIG_TENSORS:
            continue
        if name is None:
            sink.skip(t.name, origin=str(path))
            continue
        if blocks is not None and blocks.wants_blocks(name):
            w = tensor_blocks(t, device)
        elif not sink.wants(name):
            sink.skip(name, origin=str(path))
            continue
        else:
            w = dequantize_tensor(t, path, device)
        if permuted and ".self_attn.q_proj." in name:
            w = unpermute_qk(w, config.num_attention_heads)
        elif permuted and ".self_attn.k_proj." in name:
            w = unpermute_qk(w, config.num_key_value_heads)
        if blocks is not None and blocks.wants_blocks(name):
            blocks.put_blocks(name, w, t.tensor_type.value, int(t.shape[1]))
        else:
            sink.put(name, w, origin=str(path))


def _unsupported_message(path: Path, tensor: GGUFTensor) -> str:
    supported = ", ".join(sorted(q.name for q in SUPPORTED_TYPES))
    return (f"{path}: tensor {tensor.name} uses quantization {tensor.tensor_type.name}, which is not supported "
            f"(supported: {supported})")
