"""ModelRunner: device/dtype choice, model path resolution, pool sizes, forward on a dummy model."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import TINY_CONFIGS
from radixgen.runtime.engine_config import EngineConfig
from radixgen.runtime.errors import ModelNotFoundError
from radixgen.runtime.forward_batch import build_forward_batch
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
    batch = build_forward_batch([[1, 2, 3, 4, 5]], [0], [row], runner.req_to_token_pool.req_to_token,
                                torch.from_numpy(slots), logits_indices=torch.tensor([1, 4]))
    logits = runner.forward(batch)
    assert logits.shape == (2, TINY_CONFIGS["mistral"]["vocab_size"]) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
