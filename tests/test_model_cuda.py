"""The model on CUDA: same logits as on the CPU (float32), a working bfloat16 path, GGUF dequantized on the GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_fixtures import TINY_CONFIGS, write_tiny_checkpoint

from radixgen.runtime.attention import attention_backend_for
from radixgen.runtime.engine_config import EngineConfig
from radixgen.runtime.forward_batch import forward_batch_from_lists
from radixgen.runtime.kv_pool import KVPool
from radixgen.runtime.loader import load_model
from radixgen.runtime.loader.dequant import dequantize_to_torch
from radixgen.runtime.model_runner import ModelRunner

pytestmark = pytest.mark.gpu

PROMPT = [1, 17, 200, 33, 5, 99, 250, 3, 8]


def _logits(model, config, device: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """Prefill PROMPT, then 4 greedy decode steps; the logits of each step on the CPU in fp32."""
    pool = KVPool.for_model(config, 32, dtype, device)
    attention = attention_backend_for(config, pool.device, dtype)
    table = torch.zeros((1, 32), dtype=torch.int32, device=device)
    table[0] = torch.arange(1, 33, dtype=torch.int32)
    ids, cached, out = list(PROMPT), 0, []
    for _ in range(5):
        slots = torch.arange(cached + 1, cached + 1 + len(ids))
        batch = forward_batch_from_lists([ids], [cached], [0], table, slots)
        with torch.inference_mode():
            logits = model(batch, pool, attention, attention.plan(batch))[0].float().cpu()
        out.append(logits)
        cached += len(ids)
        ids = [int(logits.argmax())]
    return out


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_cuda_float32_matches_cpu(tmp_path, family):
    pytest.importorskip("transformers")
    folder = write_tiny_checkpoint(tmp_path / family, family)
    cpu_model, config = load_model(folder)
    cuda_model, _ = load_model(folder, device="cuda")
    # The Triton kernels multiply fp32 in TF32 (10-bit mantissa): agreement to ~1e-3 relative, not 1e-6.
    for want, got in zip(_logits(cpu_model, config, "cpu", torch.float32),
                         _logits(cuda_model, config, "cuda", torch.float32)):
        assert (want - got).abs().max().item() < 1e-2 * want.abs().max().item()


def test_bfloat16_on_cuda_tracks_float32(tmp_path):
    pytest.importorskip("transformers")
    folder = write_tiny_checkpoint(tmp_path / "llama", "llama")
    ref, config = load_model(folder, device="cuda")
    bf16, _ = load_model(folder, device="cuda", dtype=torch.bfloat16)
    want = _logits(ref, config, "cuda", torch.float32)[0]
    got = _logits(bf16, config, "cuda", torch.bfloat16)[0]
    assert torch.isfinite(got).all()
    assert (want - got).abs().max().item() < 0.1 * want.abs().max().item()


def test_runner_auto_picks_cuda_bfloat16_and_sizes_the_pool_from_free_memory():
    cfg = dict(TINY_CONFIGS["qwen3"])
    runner = ModelRunner(EngineConfig(load_format="dummy", dummy_config=cfg, mem_fraction=0.01))
    assert runner.device.type == "cuda" and runner.dtype == torch.bfloat16
    free, _ = torch.cuda.mem_get_info()
    per_token = runner.model_config.kv_bytes_per_token(2)
    assert runner.max_total_tokens > 0.005 * free / per_token  # a real share of free memory, not a fixed size


@pytest.mark.parametrize("qtype_name", ["Q8_0", "Q4_0", "Q4_1"])
def test_gpu_dequantization_is_bit_identical_to_cpu(qtype_name):
    gguf = pytest.importorskip("gguf")
    qtype = gguf.GGMLQuantizationType[qtype_name]
    data = gguf.quants.quantize(np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32), qtype)
    cpu = dequantize_to_torch(data, qtype, (64, 256), torch.device("cpu"))
    gpu = dequantize_to_torch(data, qtype, (64, 256), torch.device("cuda"))
    assert torch.equal(cpu, gpu.cpu())
