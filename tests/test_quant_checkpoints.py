"""Pre-quantized checkpoints (GPTQ with and without act-order, AWQ, FP8 per tensor / per channel / per block)
load packed, and run like the dense model of the weights they dequantize to; unsupported schemes are refused."""

from __future__ import annotations

import json

import pytest
import torch
from quant_fixtures import CONFIG, SMOLLM2_TOKENIZER, prefill_logits, write_fp8_checkpoint, write_int4_checkpoint

from radixgen.kernels import Fp8Weight, Int4Weight, dequantize_weight
from radixgen.runtime.errors import UnsupportedQuantizationError
from radixgen.runtime.loader import load_model

PROMPT = [1, 17, 2000, 33, 5, 99, 250, 4000, 12, 7]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize(("method", "group", "act_order"),
                         [("gptq", 32, False), ("gptq", 64, True), ("gptq", 128, True), ("awq", 32, False),
                          ("awq", 64, False), ("awq", 128, False)])
def test_int4_checkpoint_loads_packed_and_matches_its_dequantized_model(tmp_path, method, group, act_order):
    packed_dir, dense_dir = write_int4_checkpoint(tmp_path, method, group, act_order)
    model, config = load_model(packed_dir)
    dense, _ = load_model(dense_dir)
    for packed_layer, dense_layer in zip(model.decoder_layers(), dense.decoder_layers()):
        for attr, owner in (("qkv_proj", "self_attn"), ("o_proj", "self_attn"), ("gate_up_proj", "mlp"),
                            ("down_proj", "mlp")):
            w = getattr(getattr(packed_layer, owner), attr)
            assert isinstance(w, Int4Weight) and w.group_size == group
            want = getattr(getattr(dense_layer, owner), attr)
            if w.perm is not None:
                want = want[:, w.perm]
            assert (w.perm is not None) == (act_order and w.shape[1] > group)  # one group needs no order
            torch.testing.assert_close(dequantize_weight(w), want, rtol=0, atol=0)
    assert _rel(prefill_logits(model, config, PROMPT), prefill_logits(dense, config, PROMPT)) < 1e-5


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_engine_greedy_on_an_int4_checkpoint_equals_its_dequantized_model(tmp_path, method):
    from radixgen.runtime.engine import Engine

    packed_dir, dense_dir = write_int4_checkpoint(tmp_path, method, 64, act_order=method == "gptq")
    params = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    prompts = [PROMPT, PROMPT[:4], [3, 1000, 20000, 5]]
    outs = []
    for folder in (packed_dir, dense_dir):
        with Engine(str(folder), tokenizer_path=str(SMOLLM2_TOKENIZER), device="cpu", max_total_tokens=512,
                    max_running_requests=4) as engine:
            outs.append([o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("layout", ["fp8-tensor", "compressed-tensors", "fp8-block"])
def test_fp8_checkpoint_loads_packed(tmp_path, layout):
    packed_dir, dense_dir = write_fp8_checkpoint(tmp_path, layout)
    model, config = load_model(packed_dir)
    dense, _ = load_model(dense_dir)
    layer, dense_layer = next(model.decoder_layers()), next(dense.decoder_layers())
    w = layer.self_attn.qkv_proj
    assert isinstance(w, Fp8Weight) and w.weight.dtype == torch.float8_e4m3fn
    got, want = dequantize_weight(w), dense_layer.self_attn.qkv_proj
    if layout == "fp8-block":  # block scales become row scales: quantized again, within e4m3's precision
        assert _rel(got, want) < 0.05
    else:  # the stored e4m3 values and scales are taken over as they are
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # activations are quantized per token to e4m3 (3 mantissa bits) at every matmul: near the dense model only
    assert _rel(prefill_logits(model, config, PROMPT), prefill_logits(dense, config, PROMPT)) < 0.2


def test_quantization_none_dequantizes_a_checkpoint(tmp_path):
    packed_dir, dense_dir = write_int4_checkpoint(tmp_path, "gptq", 32)
    model, config = load_model(packed_dir, quantization="none")
    dense, _ = load_model(dense_dir)
    assert isinstance(next(model.decoder_layers()).mlp.down_proj, torch.nn.Parameter)
    assert _rel(prefill_logits(model, config, PROMPT), prefill_logits(dense, config, PROMPT)) < 1e-6


def _with_quant(tmp_path, quant: dict):
    packed_dir, _ = write_int4_checkpoint(tmp_path, "gptq", 32)
    (packed_dir / "config.json").write_text(json.dumps({**CONFIG, "quantization_config": quant}))
    return packed_dir


@pytest.mark.parametrize(("quant", "supported"), [
    ({"quant_method": "bitsandbytes"}, "gptq, awq, fp8, compressed-tensors"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 96}, "32, 64, 128"),
    ({"quant_method": "gptq", "bits": 4, "group_size": -1}, "32, 64, 128"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "bits=4"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "version gemm"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int",
                                                                                "strategy": "group"}}}},
     "8-bit float weights"),
])
def test_unsupported_schemes_are_refused_in_one_line(tmp_path, quant, supported):
    folder = _with_quant(tmp_path, quant)
    with pytest.raises(UnsupportedQuantizationError) as info:
        load_model(folder)
    message = str(info.value)
    assert "\n" not in message and "supported" in message and supported in message


def test_a_quantized_checkpoint_refuses_another_scheme(tmp_path):
    packed_dir, _ = write_int4_checkpoint(tmp_path, "gptq", 32)
    with pytest.raises(UnsupportedQuantizationError, match="already quantized"):
        load_model(packed_dir, quantization="fp8")
    model, _ = load_model(packed_dir, quantization="int4")  # what it is already: loads as it is
    assert isinstance(next(model.decoder_layers()).self_attn.o_proj, Int4Weight)


@pytest.mark.gpu
def test_fp8_is_refused_on_a_gpu_without_fp8_tensor_cores(tmp_path):
    if torch.cuda.get_device_capability() >= (8, 9):
        pytest.skip("this GPU runs FP8")
    packed_dir, _ = write_fp8_checkpoint(tmp_path, "compressed-tensors")
    with pytest.raises(UnsupportedQuantizationError, match=r"compute capability >= 8\.9"):
        load_model(packed_dir, device="cuda", dtype=torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_int4_checkpoint_on_cuda_tracks_its_dequantized_model(tmp_path, method):
    packed_dir, dense_dir = write_int4_checkpoint(tmp_path, method, 128, act_order=method == "gptq")
    model, config = load_model(packed_dir, device="cuda", dtype=torch.bfloat16)
    dense, _ = load_model(dense_dir, device="cpu", dtype=torch.float32)
    got = _cuda_logits(model, config)
    assert _rel(got, prefill_logits(dense, config, PROMPT)) < 3e-2


def _cuda_logits(model, config) -> torch.Tensor:
    from radixgen.runtime.attention import attention_backend_for
    from radixgen.runtime.forward_batch import forward_batch_from_lists
    from radixgen.runtime.kv_pool import KVPool, ReqToTokenPool, SlotAllocator

    n = len(PROMPT)
    pool = KVPool.for_model(config, n + 8, model.dtype, model.device)
    attention = attention_backend_for(config, pool.device, model.dtype)
    table = ReqToTokenPool(1, n + 8, model.device)
    row = table.alloc()
    slots = SlotAllocator(n + 8).alloc(n)
    table.write(row, 0, slots)
    batch = forward_batch_from_lists([PROMPT], [0], [row], table.req_to_token, torch.from_numpy(slots).to("cuda"),
                                     logits_indices=torch.arange(n, device="cuda"))
    with torch.inference_mode():
        return model(batch, pool, attention, attention.plan(batch)).float().cpu()
