"""KV memory, slot allocation and the request-to-token table, checked against plain Python sets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_fixtures import TINY_CONFIGS

from radixgen.runtime.config import ModelConfig
from radixgen.runtime.kv_pool import KVPool, ReqToTokenPool, SlotAllocator, kv_pool_num_slots


def test_slot_allocator_never_hands_out_slot_zero_or_a_slot_twice():
    alloc = SlotAllocator(9)
    assert alloc.num_free == 8
    a = alloc.alloc(5)
    assert a.dtype == np.int64 and sorted(a.tolist()) == [1, 2, 3, 4, 5]
    assert alloc.alloc(4) is None and alloc.num_free == 3  # short: nothing taken
    b = alloc.alloc(3)
    assert set(a.tolist()).isdisjoint(b.tolist()) and alloc.num_free == 0
    alloc.free(a[:2])
    c = alloc.alloc(2)
    assert set(c.tolist()) == set(a[:2].tolist())


def test_slot_allocator_random_ops_match_a_set():
    rng = np.random.default_rng(0)
    alloc, held = SlotAllocator(33), []
    for _ in range(500):
        if held and rng.random() < 0.5:
            alloc.free(held.pop(rng.integers(len(held))))
        else:
            got = alloc.alloc(int(rng.integers(0, 6)))
            if got is not None:
                held.append(got)
        owned = np.concatenate(held) if held else np.zeros(0, np.int64)
        assert len(set(owned.tolist())) == owned.size and 0 not in owned
        assert alloc.num_free == 32 - owned.size


def test_slot_allocator_rejects_bad_frees():
    alloc = SlotAllocator(5)
    with pytest.raises(ValueError):
        alloc.free(np.array([0]))
    with pytest.raises(ValueError):
        alloc.free(torch.tensor([1]))  # all slots are already free


def test_req_to_token_pool_rows_and_writes():
    pool = ReqToTokenPool(2, 8, "cpu")
    r0, r1 = pool.alloc(), pool.alloc()
    assert {r0, r1} == {0, 1} and pool.alloc() is None
    pool.write(r1, 3, np.array([7, 8], dtype=np.int64))
    assert pool.req_to_token.dtype == torch.int32 and pool.req_to_token[r1, 3:5].tolist() == [7, 8]
    with pytest.raises(ValueError):
        pool.write(r1, 7, np.array([1, 2]))
    pool.free(r0)
    with pytest.raises(ValueError):
        pool.free(r0)
    assert pool.alloc() == r0


def test_kv_pool_shapes_and_sizing():
    config = ModelConfig.from_hf(TINY_CONFIGS["qwen3"])
    pool = KVPool.for_model(config, 10, torch.bfloat16, "cpu")
    assert len(pool.k_buffers) == config.num_hidden_layers
    assert pool.k_buffers[0].shape == (10, config.num_key_value_heads, config.head_dim)
    assert pool.v_buffers[1].dtype == torch.bfloat16 and pool.num_usable_slots == 9
    assert pool.nbytes() == 10 * config.kv_bytes_per_token(2)
    assert kv_pool_num_slots(config, torch.float32, torch.device("cpu"), 100, 0.9) == 101
    per_token = config.kv_bytes_per_token(4)
    slots = kv_pool_num_slots(config, torch.float32, torch.device("cpu"), None, 0.9, cpu_budget_bytes=per_token * 1000)
    assert slots == 1001


def test_cuda_pool_leaves_room_for_a_draft_models_slots_and_weights(monkeypatch):
    """With a companion (a draft model holding a slot per target slot), the target's pool and the companion's
    pool and weights together fit the share of free memory one pool alone would take."""
    config = ModelConfig.from_hf(TINY_CONFIGS["llama"])
    per_token = config.kv_bytes_per_token(2)
    free = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 2 * free))
    cuda = torch.device("cuda")
    alone = kv_pool_num_slots(config, torch.bfloat16, cuda, None, 0.9) - 1
    companion = (per_token // 2, 100 << 20)
    shared = kv_pool_num_slots(config, torch.bfloat16, cuda, None, 0.9, companion=companion) - 1
    assert alone == int(free * 0.9) // per_token
    assert shared * (per_token + companion[0]) + companion[1] <= int(free * 0.9)
    assert (shared + 1) * (per_token + companion[0]) + companion[1] > int(free * 0.9)


@pytest.mark.parametrize("arch", sorted(TINY_CONFIGS))
def test_num_parameters_counts_what_the_model_holds(arch):
    from radixgen.runtime.loader import load_model

    model, config = load_model(None, "dummy", "cpu", torch.float32, dummy_config=TINY_CONFIGS[arch])
    held = sum(p.numel() for name, p in model.named_parameters() if not name.endswith("bias"))
    assert config.num_parameters() == held
