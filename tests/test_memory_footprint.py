"""What an engine holds in memory: every weight once (a tied LM head is the embedding table itself), and KV
buffers that cost resident memory only for what requests wrote.

The KV pool, the request table and the CPU decode copies are sized for the worst case (every slot, every
request row, every buffer row) but live in anonymous memory maps: a page is resident only once written.
`resident_bytes` asks the kernel (mincore) which pages under a tensor are, so the checks are counts of pages,
not timings or machine-dependent totals.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import pytest
import torch
from model_fixtures import TINY_CONFIGS, write_tiny_checkpoint

from radixgen.runtime.config import ModelConfig
from radixgen.runtime.kv_pool import KVPool, ReqToTokenPool, lazy_zeros
from radixgen.runtime.loader import load_model

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore as Linux reports it")

TOKENIZER = Path(__file__).resolve().parent / "fixtures" / "tokenizers" / "smollm2-135m-instruct.tokenizer.gguf"
PAGE = os.sysconf("SC_PAGE_SIZE")
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True}


def resident_bytes(t: torch.Tensor) -> int:
    """Bytes of the pages under `t`'s storage that are in memory."""
    storage = t.untyped_storage()
    start, nbytes = storage.data_ptr(), storage.nbytes()
    lo = start - start % PAGE
    pages = -(-(start + nbytes - lo) // PAGE)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    if libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(pages * PAGE), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return sum(v & 1 for v in vec) * PAGE


def parameter_count(c: ModelConfig) -> int:
    """The parameters a Llama-family config implies (no biases, no Q/K norms), the LM head counted once if tied."""
    h, inter = c.hidden_size, c.intermediate_size
    layer = (c.q_size + 2 * c.kv_size) * h + h * c.q_size + 3 * inter * h + 2 * h
    head = 0 if c.tie_word_embeddings else c.vocab_size * h
    return c.vocab_size * h + head + c.num_hidden_layers * layer + h


def held_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the distinct storages under the model's parameters (a oneDNN-packed weight, as on AMD CPUs, has
    no storage to share: its own elements)."""
    storages: dict[int, int] = {}
    for p in model.parameters():
        if p.is_mkldnn:
            storages[id(p)] = p.numel() * p.element_size()
        else:
            storages[p.untyped_storage().data_ptr()] = p.untyped_storage().nbytes()
    return sum(storages.values())


def test_lazy_zeros_cost_only_the_pages_written():
    t = lazy_zeros((1024, 1024), torch.float32, "cpu")  # 4 MiB
    assert resident_bytes(t) == 0
    t[10, :] = 1.0  # one 4 KiB row
    assert resident_bytes(t) <= 2 * PAGE
    # (mincore also counts a page only read, which maps the shared zero page: checked last, on one row.)
    assert float(t[10].sum()) == 1024 and not t[500].any()


@pytest.mark.parametrize("source", ["dummy", "checkpoint"])
def test_a_tied_lm_head_is_the_embedding_table(source, tmp_path):
    if source == "dummy":
        model, config = load_model(None, "dummy", "cpu", torch.float32, dummy_config=TINY)
    else:
        model, config = load_model(write_tiny_checkpoint(tmp_path / "qwen2", "qwen2"), device="cpu")
        assert TINY_CONFIGS["qwen2"]["tie_word_embeddings"]
    assert config.tie_word_embeddings
    assert model.lm_head.data_ptr() == model.embed_tokens.data_ptr()
    extra = sum(p.numel() for name, p in model.named_parameters() if "bias" in name)  # qwen2's QKV bias
    assert held_weight_bytes(model) == (parameter_count(config) + extra) * 4


def test_an_untied_lm_head_is_its_own_table():
    model, config = load_model(None, "dummy", "cpu", torch.float32, dummy_config={**TINY, "tie_word_embeddings": False})
    assert model.lm_head.data_ptr() != model.embed_tokens.data_ptr()
    assert held_weight_bytes(model) == parameter_count(config) * 4


def test_kv_pool_and_request_table_cost_only_what_is_written():
    config = ModelConfig.from_hf(TINY)
    pool = KVPool.for_model(config, 1 << 16, torch.float32, "cpu")
    table = ReqToTokenPool(64, config.max_position_embeddings, "cpu")
    buffers = [*pool.k_buffers, *pool.v_buffers]
    assert sum(resident_bytes(b) for b in buffers) == 0 and resident_bytes(table.req_to_token) == 0
    slots = torch.arange(1, 101)
    for b in buffers:
        b[slots] = 1.0
    table.write(table.alloc(), 0, slots)
    row_bytes = config.num_key_value_heads * config.head_dim * 4
    per_buffer = -(-(101 * row_bytes) // PAGE) * PAGE + PAGE  # the pages of slots 0..100, one more if unaligned
    assert sum(resident_bytes(b) for b in buffers) <= len(buffers) * per_buffer
    assert resident_bytes(table.req_to_token) <= 2 * PAGE


def test_an_engine_holds_its_weights_once_and_kv_memory_for_what_it_ran():
    from radixgen import Engine

    with Engine(load_format="dummy", dummy_config=TINY, tokenizer_path=str(TOKENIZER), device="cpu",
                cpu_threads=1, max_running_requests=64) as engine:
        runner = engine.runner
        out = engine.generate("Hello there", {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True})
        assert len(out["output_ids"]) == 24
        config = runner.model_config
        # Once, also where weights are packed for oneDNN (AMD CPUs): a tied LM head stays the embedding table.
        assert held_weight_bytes(runner.model) == parameter_count(config) * 4
        tokens = out["meta_info"]["prompt_tokens"] + 24
        row_bytes = config.num_key_value_heads * config.head_dim * 4
        pool = [*runner.kv_pool.k_buffers, *runner.kv_pool.v_buffers]
        # The request's slots (and the padding slot) in each layer's K and V buffer: a few pages, of 1 GiB mapped.
        assert sum(resident_bytes(b) for b in pool) <= len(pool) * (-(-(tokens + 1) * row_bytes // PAGE) + 1) * PAGE
        assert runner.kv_pool.nbytes() > 1000 * len(pool) * PAGE
        table = runner.req_to_token_pool.req_to_token
        assert resident_bytes(table) <= 2 * PAGE < table.numel() * table.element_size() // 100
        # The decode copies reserve rows for requests to join; only the one request's row was written.
        copies = runner.attention.decode_kv_copies
        assert copies is not None and copies.nbytes() > 0
        row = copies.buffers()[0][0].numel() * 4  # one request's row of one buffer
        assert sum(resident_bytes(b) for b in copies.buffers()) <= len(copies.buffers()) * (row + 2 * PAGE)
        assert copies.buffers()[0].shape[0] > 1
