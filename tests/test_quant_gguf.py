"""GGUF kept in its blocks (the CUDA default) runs like the dequantized model; the block decoders and quantizers
agree with gguf.quants; dense models quantized at load (`quantization=...`) track the dense model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from quant_fixtures import prefill_logits

from radixgen.kernels import BLOCK_FORMATS, GGUFWeight, Int4Weight, LinearWeight, StackedWeight
from radixgen.kernels.gguf_ref import dequantize_blocks
from radixgen.runtime.loader import _load_gguf, load_model
from radixgen.runtime.loader.gguf_file import open_gguf, read_gguf_config
from radixgen.runtime.models.llama import LlamaForCausalLM
from radixgen.runtime.quant.gguf_blocks import QUANTIZABLE_TYPES, quantize_blocks

PROMPT = [1, 17, 2000, 33, 5, 99, 250, 4000, 12, 7]
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4096, "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def _packed_kinds(model: LlamaForCausalLM) -> set[str]:
    def kind(w: LinearWeight) -> str:
        if isinstance(w, StackedWeight):
            return "+".join(kind(p) for p in w.parts)
        if isinstance(w, GGUFWeight):
            return BLOCK_FORMATS[w.qtype].name
        return type(w).__name__
    return {kind(slot.weight) for slot in model.linear_slots()}


@pytest.mark.parametrize("qtype", sorted(BLOCK_FORMATS))
def test_block_decoder_is_bit_identical_to_gguf(qtype: int) -> None:
    gguf = pytest.importorskip("gguf")
    w = torch.from_numpy(np.random.default_rng(0).standard_normal((16, 512)).astype(np.float32)) * 0.05
    if qtype in QUANTIZABLE_TYPES:
        blocks = quantize_blocks(w, qtype)
    else:
        raw = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType(qtype))
        blocks = torch.from_numpy(np.ascontiguousarray(raw)).reshape(16, -1)
    want = np.asarray(gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType(qtype)), dtype=np.float32)
    got = dequantize_blocks(blocks, qtype)
    assert torch.equal(got, torch.from_numpy(want).reshape(16, 512))
    assert _rel(got, w) < 0.1  # a round-to-nearest quantization of w


def test_default_gguf_kept_in_blocks_matches_dequantize_at_load(default_model_path) -> None:
    """The CUDA layout, run through the reference on the CPU: the same logits as the dense load."""
    gguf_file = open_gguf(default_model_path)
    config = read_gguf_config(gguf_file, default_model_path)
    packed = LlamaForCausalLM(config, dense_linears=False)
    _load_gguf(packed, gguf_file, config, default_model_path, torch.device("cpu"), None, keep_blocks=True)
    dense, _ = load_model(default_model_path)
    assert _packed_kinds(packed) <= {f.name for f in BLOCK_FORMATS.values()} | {"Q4_1+Q4_1"}
    torch.testing.assert_close(prefill_logits(packed.eval(), config, PROMPT), prefill_logits(dense, config, PROMPT),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("quantization", "kind", "bound"),
                         [("int4", "Int4Weight", 0.3), ("int4-g32", "Int4Weight", 0.25), ("fp8", "Fp8Weight", 0.1),
                          ("gguf-q8_0", "Q8_0", 0.02), ("gguf-q4_k", "Q4_K", 0.25), ("gguf-q6_k", "Q6_K", 0.06)])
def test_dense_model_quantized_at_load_tracks_it(quantization: str, kind: str, bound: float) -> None:
    """Random Gaussian weights are the worst case for 4 bits (no outliers to spend the range on, nothing
    redundant): bounds are about 1.5x what each scheme gives here, in their expected order."""
    dense, config = load_model(None, "dummy", dummy_config=TINY, seed=3)
    quant, _ = load_model(None, "dummy", dummy_config=TINY, seed=3, quantization=quantization)
    assert _packed_kinds(quant) == {kind}
    assert _rel(prefill_logits(quant, config, PROMPT), prefill_logits(dense, config, PROMPT)) < bound


def test_int4_falls_back_to_a_group_that_divides_the_inputs() -> None:
    cfg = {**TINY, "hidden_size": 192, "intermediate_size": 320}  # 192 = 3 x 64, 320 = 5 x 64
    model, _ = load_model(None, "dummy", dummy_config=cfg, quantization="int4")
    groups = {slot.weight.group_size for slot in model.linear_slots() if isinstance(slot.weight, Int4Weight)}
    assert groups == {64}


def test_engine_option_quantization_is_validated() -> None:
    from radixgen.runtime.engine_config import EngineConfig

    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineConfig.from_options(quantization="int3")


@pytest.mark.gpu
def test_default_gguf_on_cuda_keeps_blocks_and_tracks_the_cpu_model(default_model_path) -> None:
    from test_quant_checkpoints import _cuda_logits

    model, config = load_model(default_model_path, device="cuda", dtype=torch.bfloat16, quantization="gguf")
    assert all(isinstance(s.weight, GGUFWeight | StackedWeight) for s in model.linear_slots())
    dense, _ = load_model(default_model_path)
    assert _rel(_cuda_logits(model, config), prefill_logits(dense, config, [1, 17, 2000, 33, 5, 99, 250, 4000, 12,
                                                                           7])) < 5e-2
