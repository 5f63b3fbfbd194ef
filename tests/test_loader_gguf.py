"""GGUF loading on tiny files we write with the gguf package: names, Q/K permutation, quantized types, errors.

A tiny HF checkpoint is converted the way llama.cpp does it (names mapped, Q/K rows permuted for `llama`), so
the GGUF model must produce the safetensors model's logits; quantized tensors must equal gguf's own
dequantization.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from model_fixtures import write_tiny_checkpoint
from safetensors.torch import load_file

from radixgen.runtime.attention import attention_backend_for
from radixgen.runtime.errors import (
    CorruptModelFileError,
    UnsupportedArchitectureError,
    UnsupportedQuantizationError,
)
from radixgen.runtime.forward_batch import forward_batch_from_lists
from radixgen.runtime.kv_pool import KVPool
from radixgen.runtime.loader import load_model
from radixgen.runtime.loader.gguf_file import dequantize_tensor
from radixgen.tokenizer.loaders.gguf_reader import read_gguf

pytest.importorskip("transformers")

_GGUF_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def _gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_GGUF_NAMES[module]}.{kind}"


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert script: interleave each head's two rotary halves."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, hf_folder: Path, arch: str, qtype: Q = Q.F32, extra_tensor=None) -> Path:
    """Convert a tiny HF checkpoint to GGUF; 2-D weights stored as `qtype`, norms and biases as F32."""
    import json

    cfg = json.loads((hf_folder / "config.json").read_text())
    tensors = load_file(str(hf_folder / "model.safetensors"))
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    if "head_dim" in cfg:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    w.add_bos_token_id(cfg["bos_token_id"])
    eos = cfg["eos_token_id"]
    w.add_eos_token_id(eos[0] if isinstance(eos, list) else eos)
    for name, t in tensors.items():
        a = t.float().numpy()
        if arch == "llama" and ".q_proj." in name:
            a = _llama_cpp_permute(a, cfg["num_attention_heads"])
        elif arch == "llama" and ".k_proj." in name:
            a = _llama_cpp_permute(a, cfg["num_key_value_heads"])
        if a.ndim == 2 and qtype != Q.F32:
            w.add_tensor(_gguf_name(name), gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(_gguf_name(name), np.ascontiguousarray(a))
    if extra_tensor is not None:
        w.add_tensor(*extra_tensor[:2], raw_dtype=extra_tensor[2])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf_src")
    return {f: write_tiny_checkpoint(root / f, f) for f in ("llama", "qwen2", "qwen3")}


def _prefill_logits(model, config, ids: list[int]) -> torch.Tensor:
    pool = KVPool.for_model(config, len(ids) + 1, torch.float32, "cpu")
    table = torch.zeros((1, len(ids)), dtype=torch.int32)
    slots = torch.arange(1, len(ids) + 1)
    table[0] = slots.int()
    batch = forward_batch_from_lists([ids], [0], [0], table, slots, logits_indices=torch.arange(len(ids)))
    attention = attention_backend_for(config, pool.device, torch.float32)
    with torch.inference_mode():
        return model(batch, pool, attention, attention.plan(batch))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_f32_gguf_matches_safetensors(hf_folders, tmp_path, family):
    path = write_gguf(tmp_path / "m.gguf", hf_folders[family], family)
    ours, cfg = load_model(path)
    ref, ref_cfg = load_model(hf_folders[family])
    assert (cfg.qk_norm, cfg.attention_bias, cfg.head_dim) == (ref_cfg.qk_norm, ref_cfg.attention_bias,
                                                              ref_cfg.head_dim)
    assert cfg.tie_word_embeddings == ref_cfg.tie_word_embeddings
    ids = [1, 9, 40, 200, 7, 3]
    diff = (_prefill_logits(ours, cfg, ids) - _prefill_logits(ref, ref_cfg, ids)).abs().max().item()
    assert diff < 1e-4


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1])
def test_quantized_weights_equal_gguf_dequantization(hf_folders, tmp_path, qtype):
    """Each fused parameter slice equals gguf.quants.dequantize of its tensor, permutation undone."""
    path = write_gguf(tmp_path / "m.gguf", hf_folders["llama"], "llama", qtype)
    model, cfg = load_model(path)
    reader = gguf.GGUFReader(str(path))
    raw = {t.name: t for t in reader.tensors}
    q_rows = cfg.q_size
    for layer in range(cfg.num_hidden_layers):
        t = raw[f"blk.{layer}.attn_q.weight"]
        assert t.tensor_type == qtype
        want = gguf.quants.dequantize(t.data, t.tensor_type)
        # undo the permutation independently: stored row (h, i, half) came from HF row (h, half, i)
        d2 = cfg.head_dim // 2
        want = want.reshape(cfg.num_attention_heads, d2, 2, -1).transpose(0, 2, 1, 3).reshape(q_rows, -1)
        got = model.layers[layer].self_attn.qkv_proj[:q_rows].numpy()
        np.testing.assert_array_equal(got, want)
        t = raw[f"blk.{layer}.ffn_up.weight"]
        got = model.layers[layer].mlp.gate_up_proj[cfg.intermediate_size:].numpy()
        np.testing.assert_array_equal(got, gguf.quants.dequantize(t.data, t.tensor_type))


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_k_quants_dequantize_like_gguf(tmp_path, qtype):
    """K-quant blocks (random bytes with finite scales) come out as gguf dequantizes them, shaped [rows, cols]."""
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = 3, 2 * block
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=(rows, cols // block * type_size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    for b in range(cols // block):  # d (and dmin) are the f16 fields at the start (Q6_K: at the end) of a block
        at = b * type_size + (type_size - 2 if qtype == Q.Q6_K else 0)
        data[:, at : at + 2] = scale
        if qtype != Q.Q6_K:
            data[:, at + 2 : at + 4] = scale
    w = gguf.GGUFWriter(str(tmp_path / "k.gguf"), "llama")
    w.add_tensor("t", data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tensor = read_gguf(tmp_path / "k.gguf").tensors[0]
    got = dequantize_tensor(tensor, tmp_path / "k.gguf")
    assert got.shape == (rows, cols) and torch.isfinite(got).all()
    np.testing.assert_array_equal(got.numpy(), gguf.quants.dequantize(tensor.data, qtype))


def test_llama3_rope_freq_factors_match_rope_scaling(tmp_path):
    """llama.cpp stores llama3 rope scaling as per-frequency factors (rope_freqs); both forms give one model."""
    transformers = pytest.importorskip("transformers")
    folder = write_tiny_checkpoint(tmp_path / "llama3", "llama3")
    hf_inv_freq = transformers.AutoModelForCausalLM.from_pretrained(folder).model.rotary_emb.inv_freq
    head_dim = 16
    plain = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    factors = (plain / hf_inv_freq).numpy().astype(np.float32)
    assert factors.max() > 2.0  # the scaling really changes some frequencies
    path = write_gguf(tmp_path / "m.gguf", folder, "llama", extra_tensor=("rope_freqs.weight", factors, None))
    ours, cfg = load_model(path)
    ref, ref_cfg = load_model(folder)
    assert cfg.rope_freq_factors is not None and cfg.rope_scaling is None
    ids = list(range(3, 40, 3))
    diff = (_prefill_logits(ours, cfg, ids) - _prefill_logits(ref, ref_cfg, ids)).abs().max().item()
    assert diff < 1e-4


def test_unsupported_quantization_names_tensor_and_type(hf_folders, tmp_path):
    _, type_size = gguf.GGML_QUANT_SIZES[Q.TQ1_0]
    extra = ("blk.0.extra.weight", np.zeros((2, type_size), dtype=np.uint8), Q.TQ1_0)
    path = write_gguf(tmp_path / "m.gguf", hf_folders["llama"], "llama", extra_tensor=extra)
    with pytest.raises(UnsupportedQuantizationError, match=r"blk\.0\.extra\.weight uses quantization TQ1_0"):
        load_model(path)


def test_truncated_gguf_is_reported_with_its_path(hf_folders, tmp_path):
    path = write_gguf(tmp_path / "m.gguf", hf_folders["llama"], "llama")
    data = path.read_bytes()
    for cut in (len(data) - 1000, 200):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(CorruptModelFileError, match=f"{bad}.*truncated"):
            load_model(bad)


def test_unsupported_gguf_architecture(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "gemma2")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedArchitectureError, match=r"'gemma2'.*supported: llama, qwen2, qwen3"):
        load_model(tmp_path / "g.gguf")


def test_reader_agrees_with_gguf_package(hf_folders, tmp_path):
    """Our lean parser sees the same metadata, tensor names, types, shapes and bytes as gguf.GGUFReader."""
    path = write_gguf(tmp_path / "m.gguf", hf_folders["qwen2"], "qwen2", Q.Q8_0)
    ours, ref = read_gguf(path), gguf.GGUFReader(str(path))
    for key, field in ref.fields.items():
        if not key.startswith("GGUF."):
            assert ours.metadata[key] == field.contents(), key
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(ours.tensors, ref.tensors):
        assert a.tensor_type == b.tensor_type and a.shape == tuple(reversed(b.shape.tolist()))
        assert a.data.tobytes() == np.asarray(b.data).tobytes()


def test_reader_on_the_default_model(default_model_path):
    ours, ref = read_gguf(default_model_path), gguf.GGUFReader(str(default_model_path))
    assert ours.array_lengths["tokenizer.ggml.tokens"] == 49152
    assert ours.metadata["llama.block_count"] == 30 and ours.metadata["tokenizer.chat_template"].startswith("{%")
    assert {t.name: t.shape for t in ours.tensors} == {t.name: tuple(reversed(t.shape.tolist())) for t in ref.tensors}
    for a, b in zip(ours.tensors[:3], ref.tensors[:3]):
        assert a.data.tobytes() == np.asarray(b.data).tobytes()
