"""Our decoder equals transformers on the same tiny random checkpoints (float32, max abs diff < 1e-4).

Every family goes through the real path: config.json -> ModelConfig, safetensors -> fused parameters, a KVPool
with slot bookkeeping, ForwardBatch from forward_batch_from_lists, prefill and then 8 decode steps.
"""

from __future__ import annotations

import pytest
import torch
from model_fixtures import TINY_CONFIGS, write_tiny_checkpoint

from radixgen.runtime.attention import attention_backend_for
from radixgen.runtime.forward_batch import forward_batch_from_lists
from radixgen.runtime.kv_pool import KVPool, ReqToTokenPool, SlotAllocator
from radixgen.runtime.loader import load_model

transformers = pytest.importorskip("transformers")

TOL = 1e-4
PROMPT = [1, 17, 200, 33, 5, 99, 250]
DECODE_STEPS = 8


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tiny")
    out = {family: write_tiny_checkpoint(root / family, family) for family in TINY_CONFIGS}
    out["llama_sharded"] = write_tiny_checkpoint(root / "llama_sharded", "llama", max_shard_size="40KB")
    return out


def _hf_model(folder):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                              attn_implementation="eager")
    return model.eval()


class Session:
    """One request driven through the KV pool the way the engine will: allocate slots, write the table, run."""

    def __init__(self, model, config, num_slots: int = 64) -> None:
        self.model = model
        self.pool = KVPool.for_model(config, num_slots, torch.float32, "cpu")
        self.attention = attention_backend_for(config, self.pool.device, torch.float32)
        self.slots = SlotAllocator(num_slots)
        self.table = ReqToTokenPool(2, 64, "cpu")

    def add_request(self) -> int:
        return self.table.alloc()

    def run(self, chunks: list[tuple[int, list[int], int]], all_logits: bool = False) -> torch.Tensor:
        """chunks: (request row, new token ids, tokens already cached) per request in this batch."""
        locs = []
        for row, ids, cached in chunks:
            slots = self.slots.alloc(len(ids))
            self.table.write(row, cached, slots)
            locs.append(torch.from_numpy(slots))
        total = sum(len(ids) for _, ids, _ in chunks)
        batch = forward_batch_from_lists(
            [ids for _, ids, _ in chunks], [c for *_, c in chunks], [r for r, *_ in chunks],
            self.table.req_to_token, torch.cat(locs), logits_indices=torch.arange(total) if all_logits else None,
        )
        with torch.inference_mode():
            return self.model(batch, self.pool, self.attention, self.attention.plan(batch))


@pytest.mark.parametrize("family", [*TINY_CONFIGS, "llama_sharded"])
def test_prefill_and_decode_match_transformers(checkpoints, family):
    folder = checkpoints[family]
    ours, config = load_model(folder)
    ref = _hf_model(folder)
    session = Session(ours, config)
    row = session.add_request()

    logits = session.run([(row, PROMPT, 0)], all_logits=True)
    with torch.inference_mode():
        expected = ref(torch.tensor([PROMPT])).logits[0]
    assert logits.dtype == torch.float32 and logits.shape == (len(PROMPT), config.vocab_size)
    assert (logits - expected).abs().max().item() < TOL

    tokens = list(PROMPT)
    for _ in range(DECODE_STEPS):
        tokens.append(int(expected[-1].argmax()))
        logits = session.run([(row, tokens[-1:], len(tokens) - 1)])
        with torch.inference_mode():
            expected = ref(torch.tensor([tokens])).logits[0]
        assert (logits[0] - expected[-1]).abs().max().item() < TOL, f"decode step at length {len(tokens)}"


def test_mixed_batch_with_chunked_prefill_matches_transformers(checkpoints):
    """Two requests in one extend batch: one finishing a chunked prefill over its cached first chunk, one fresh."""
    folder = checkpoints["mistral"]  # sliding window: the chunk boundary must respect it too
    ours, config = load_model(folder)
    ref = _hf_model(folder)
    session = Session(ours, config)
    a, b = session.add_request(), session.add_request()
    long_prompt, short_prompt = PROMPT + [7, 8, 9, 10], [3, 4, 5]
    session.run([(a, long_prompt[:5], 0)])
    logits = session.run([(a, long_prompt[5:], 5), (b, short_prompt, 0)])
    with torch.inference_mode():
        want_a = ref(torch.tensor([long_prompt])).logits[0, -1]
        want_b = ref(torch.tensor([short_prompt])).logits[0, -1]
    assert (logits[0] - want_a).abs().max().item() < TOL
    assert (logits[1] - want_b).abs().max().item() < TOL


def test_sharded_checkpoint_has_index(checkpoints):
    folder = checkpoints["llama_sharded"]
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("*.safetensors"))) > 1


def test_config_fields_per_family(checkpoints):
    from radixgen.runtime.loader import read_model_config

    cfg = {family: read_model_config(checkpoints[family]) for family in TINY_CONFIGS}
    assert cfg["qwen2"].attention_bias and not cfg["qwen2"].attention_out_bias and cfg["qwen2"].tie_word_embeddings
    assert cfg["qwen3"].qk_norm and cfg["qwen3"].head_dim == 32
    assert cfg["mistral"].sliding_window == 4 and cfg["mistral"].layer_sliding_window(0) == 4
    assert cfg["qwen2"].sliding_window is None  # use_sliding_window = false
    assert cfg["llama3"].rope_scaling["rope_type"] == "llama3" and cfg["llama3"].eos_token_ids == (2, 3)
    assert cfg["llama"].rope_scaling is None and cfg["llama"].sliding_window is None
    assert cfg["llama_bias"].attention_bias and cfg["llama_bias"].attention_out_bias and cfg["llama_bias"].mlp_bias
