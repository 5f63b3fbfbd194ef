"""ModelRunner: device/dtype choice, model path resolution, pool sizes, forward on a dummy model."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import TINY_CONFIGS

from radixgen.runtime.engine_config import EngineConfig
from radixgen.runtime.errors import ModelNotFoundError
from radixgen.runtime.forward_batch import forward_batch_from_lists
from radixgen.runtime.model_runner import ModelRunner, resolve_device_dtype, resolve_model_path


def test_auto_device_and_dtype():
    device, dtype = resolve_device_dtype("auto", "auto")
    if torch.cuda.is_available():
        assert (device.type, dtype) == ("cuda", torch.bfloat16)
    else:
        assert (device.type, dtype) == ("cpu", torch.float32)
    assert resolve_device_dtype("cpu", "bfloat16") == (torch.device("cpu"), torch.bfloat16)
    with pytest.raises(ValueError, match="dtype must be"):
        resolve_device_dtype("cpu", "int8")


def test_model_path_resolution(tmp_path, default_model_path):
    assert resolve_model_path(EngineConfig()) == default_model_path  # no path: the default model
    (tmp_path / "tokenizer.json").write_text("{}")  # a folder without one is refused (tests/test_model_path.py)
    assert resolve_model_path(EngineConfig(model_path=str(tmp_path))) == tmp_path
    assert resolve_model_path(EngineConfig(load_format="dummy", dummy_config=TINY_CONFIGS["llama"])) is None
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model_path(EngineConfig(model_path=str(tmp_path / "missing")))


def test_dummy_runner_pools_and_forward():
    config = EngineConfig(load_format="dummy", dummy_config=TINY_CONFIGS["mistral"], device="cpu",
                          max_total_tokens=40, max_running_requests=3, context_length=64)
    runner = ModelRunner(config)
    assert runner.max_total_tokens == 40 and runner.slot_allocator.num_free == 40
    assert runner.req_to_token_pool.req_to_token.shape == (3, 64) and runner.context_length == 64
    assert runner.model.cos_sin_cache.shape[0] == 64
    row = runner.req_to_token_pool.alloc()
    slots = runner.slot_allocator.alloc(5)
    runner.req_to_token_pool.write(row, 0, slots)
    batch = forward_batch_from_lists([[1, 2, 3, 4, 5]], [0], [row], runner.req_to_token_pool.req_to_token,
                                     torch.from_numpy(slots), logits_indices=torch.tensor([1, 4]))
    logits = runner.forward(batch)
    assert logits.shape == (2, TINY_CONFIGS["mistral"]["vocab_size"]) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("family", ["qwen2", "llama"])  # a tied LM head, an untied one
def test_packed_linear_weights_give_the_same_logits(monkeypatch, family):
    """Where oneDNN runs fp32 linears (forced here by claiming an AMD CPU), the runner packs every matmul weight
    but a tied LM head (kernels/linear_onednn.py) and the logits stay those of plain weights."""
    from radixgen.kernels import cpu_features, linear_onednn

    if not linear_onednn.packing_runs():
        pytest.skip("this torch build does not pack oneDNN linear weights")
    config = EngineConfig(load_format="dummy", dummy_config=TINY_CONFIGS[family], device="cpu",
                          max_total_tokens=40, max_running_requests=3, context_length=64)
    logits = {}
    for vendor in ("GenuineIntel", "AuthenticAMD"):
        monkeypatch.setattr(cpu_features, "cpu_vendor", lambda v=vendor: v)
        linear_onednn.available.cache_clear()
        runner = ModelRunner(config)
        attn = runner.model.layers[0].self_attn
        assert attn.qkv_proj.is_mkldnn == (vendor == "AuthenticAMD")
        # a tied LM head stays the (plain) embedding table: packed, it would be a second copy of it
        tied = runner.model_config.tie_word_embeddings
        assert runner.model.lm_head.is_mkldnn == (vendor == "AuthenticAMD" and not tied)
        row, slots = runner.req_to_token_pool.alloc(), runner.slot_allocator.alloc(6)
        runner.req_to_token_pool.write(row, 0, slots)
        logits[vendor] = runner.forward(forward_batch_from_lists([[5, 1, 7, 2, 9, 3]], [0], [row],
                                                                 runner.req_to_token_pool.req_to_token,
                                                                 torch.from_numpy(slots)))
    linear_onednn.available.cache_clear()
    torch.testing.assert_close(logits["AuthenticAMD"], logits["GenuineIntel"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("arch", ["llama", "mistral"])  # mistral: sliding window
def test_mixed_batch_runs_decode_rows_through_the_decode_kernel(device, arch):
    """A batch of running decodes followed by prefill chunks: attention splits it at num_decode_rows (decode
    kernel, then extend kernel); the logits equal running every row through the extend kernel."""
    import dataclasses

    import numpy as np

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    config = EngineConfig(load_format="dummy", dummy_config=TINY_CONFIGS[arch], device=device,
                          max_total_tokens=400, max_running_requests=6, context_length=128)
    runner = ModelRunner(config)
    rng = np.random.default_rng(0)
    vocab = TINY_CONFIGS[arch]["vocab_size"]
    # Three decodes (contexts 40, 7, 75 of which all but the last token cached), then chunks of 9 and 20 tokens
    # after cached prefixes of 30 and 0.
    contexts, new = [40, 7, 75, 39, 20], [1, 1, 1, 9, 20]
    prefix = [c - n for c, n in zip(contexts, new)]
    rows = [runner.req_to_token_pool.alloc() for _ in contexts]
    pool = runner.req_to_token_pool.req_to_token
    for r, c in zip(rows, contexts):
        runner.req_to_token_pool.write(r, 0, runner.slot_allocator.alloc(c))
    k_all, v_all = runner.kv_pool.k_buffers, runner.kv_pool.v_buffers
    for buf in k_all + v_all:
        buf.copy_(torch.randn_like(buf))  # the cached prefixes' K/V
    ids = [rng.integers(0, vocab, size=n).tolist() for n in new]
    loc = torch.cat([pool[r, p : p + n].long().cpu() for r, p, n in zip(rows, prefix, new)])
    batch = forward_batch_from_lists(ids, prefix, rows, pool, loc)
    assert batch.num_decode_rows == 3
    split = runner.forward(batch)
    whole = runner.forward(dataclasses.replace(batch, num_decode_rows=0))
    err = float((split.double() - whole.double()).norm() / whole.double().norm())
    assert err < (1e-5 if device == "cpu" else 2e-2)
