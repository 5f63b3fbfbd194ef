"""The default model (SmolLM2-135M-Instruct, GGUF Q4_1) loads and generates what transformers generates.

Fast tests compare against continuations recorded from transformers (4.x/5.x, float32, same file) and against
the gguf package's dequantization. The slow test loads the file in transformers (`gguf_file=`, ~20 s) and
compares 5 greedy continuations of 32 tokens, token for token, and every weight.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from radixgen.runtime.engine import Engine
from radixgen.runtime.model_runner import ModelRunner

# (prompt ids, greedy continuation) recorded from transformers on the same file.
RECORDED = [
    # "The capital of France is" -> " Paris.\n\nThe answer is: 201"
    ([504, 3575, 282, 4649, 314], [7042, 30, 198, 198, 504, 2988, 314, 42, 216, 34, 32, 33]),
    # "def fibonacci(n):"
    ([1604, 3987, 46477, 24, 94, 727], [472, 585, 304, 1758, 216, 32, 42, 448, 1003, 216, 33, 472]),
    # the chat template around "What is the capital of France?" -> "The capital of France is Paris.<|im_end|>"
    ([1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2,
      198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
     [504, 3575, 282, 4649, 314, 7042, 30, 2]),
]


@pytest.fixture(scope="module")
def engine(default_model_path):
    with Engine(str(default_model_path), device="cpu", dtype="float32", max_total_tokens=512,
                max_running_requests=4) as eng:
        yield eng


@pytest.fixture(scope="module")
def runner(engine) -> ModelRunner:
    return engine.runner


def generate_ids(engine: Engine, ids: list[int], n: int, temperature: float = 0.0, seed: int | None = None,
                 stop_at_eos: bool = False) -> list[int]:
    params = {"max_new_tokens": n, "temperature": temperature, "seed": seed, "ignore_eos": not stop_at_eos}
    return engine.generate(input_ids=ids, sampling_params=params)["output_ids"]


def _dense(weight: torch.Tensor) -> torch.Tensor:
    """A matmul weight as a plain tensor (the runner packs them for oneDNN on AMD CPUs, kernels/linear_onednn.py)."""
    return weight.to_dense() if weight.is_mkldnn else weight


def test_config_from_gguf_metadata(runner):
    c = runner.model_config
    assert (c.architecture, c.num_hidden_layers, c.hidden_size, c.intermediate_size) == ("llama", 30, 576, 1536)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.vocab_size) == (9, 3, 64, 49152)
    assert c.tie_word_embeddings and c.rope_theta == 100000.0 and c.eos_token_ids == (2,)
    assert torch.equal(_dense(runner.model.lm_head), runner.model.embed_tokens)  # tied (a packed copy on AMD)


@pytest.mark.parametrize("prompt,expected", RECORDED)
def test_greedy_continuation_matches_recorded_transformers_output(engine, prompt, expected):
    assert generate_ids(engine, prompt, len(expected), stop_at_eos=True) == expected
    assert engine.flush_cache()
    stats = engine.get_stats()
    assert stats["kv_slots_free"] == stats["kv_slots_total"]  # every slot returned


def test_generation_stops_at_eos(engine):
    prompt, expected = RECORDED[2]  # the chat answer ends with <|im_end|> (id 2) after 8 tokens
    assert generate_ids(engine, prompt, 30, stop_at_eos=True) == expected


def test_seeded_sampling_is_reproducible(engine):
    prompt = RECORDED[0][0]
    a = generate_ids(engine, prompt, 8, temperature=1.0, seed=7)
    b = generate_ids(engine, prompt, 8, temperature=1.0, seed=7)
    assert a == b


def test_weights_equal_gguf_dequantization(runner, default_model_path):
    """Fused rows equal gguf.quants.dequantize of each tensor, with llama.cpp's Q/K permutation undone here."""
    c, model = runner.model_config, runner.model
    tensors = {t.name: t for t in gguf.GGUFReader(str(default_model_path)).tensors}  # independent parser

    def deq(name: str) -> np.ndarray:
        t = tensors[name]
        return gguf.quants.dequantize(t.data, t.tensor_type)

    def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
        return w.reshape(heads, c.head_dim // 2, 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)

    np.testing.assert_array_equal(model.embed_tokens.numpy(), deq("token_embd.weight"))
    for layer in (0, 29):
        attn, mlp = model.layers[layer].self_attn, model.layers[layer].mlp
        qkv = _dense(attn.qkv_proj).numpy()
        np.testing.assert_array_equal(qkv[: c.q_size], unpermute(deq(f"blk.{layer}.attn_q.weight"), 9))
        np.testing.assert_array_equal(qkv[c.q_size : c.q_size + c.kv_size],
                                      unpermute(deq(f"blk.{layer}.attn_k.weight"), 3))
        np.testing.assert_array_equal(qkv[c.q_size + c.kv_size :], deq(f"blk.{layer}.attn_v.weight"))
        np.testing.assert_array_equal(_dense(mlp.gate_up_proj).numpy()[: c.intermediate_size],
                                      deq(f"blk.{layer}.ffn_gate.weight"))
        np.testing.assert_array_equal(_dense(mlp.down_proj).numpy(), deq(f"blk.{layer}.ffn_down.weight"))


PROMPTS = [
    ("plain", "The capital of France is"),
    ("plain", "def fibonacci(n):"),
    ("plain", "Once upon a time, in a small village,"),
    ("chat", "What is the capital of France?"),
    ("chat", "Write a haiku about the sea."),
]


@pytest.mark.slow
def test_greedy_32_tokens_and_weights_match_transformers_gguf(engine, runner, default_model_path):
    transformers = pytest.importorskip("transformers")
    folder, name = str(default_model_path.parent), default_model_path.name
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()

    ours = runner.model
    hf_layer = hf.model.layers[3]
    q, kv = runner.model_config.q_size, runner.model_config.kv_size
    fused = torch.cat([hf_layer.self_attn.q_proj.weight, hf_layer.self_attn.k_proj.weight,
                       hf_layer.self_attn.v_proj.weight])
    assert torch.equal(_dense(ours.layers[3].self_attn.qkv_proj), fused)
    assert q + 2 * kv == fused.shape[0]
    assert torch.equal(ours.embed_tokens, hf.model.embed_tokens.weight)

    for kind, text in PROMPTS:
        if kind == "chat":
            text = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
        ids = tok.encode(text)
        with torch.inference_mode():
            # An explicit mask: the prompt holds <|im_end|> (id 2), which transformers would take for padding.
            input_ids = torch.tensor([ids])
            want = hf.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=32,
                               do_sample=False, eos_token_id=None)[0, len(ids):].tolist()
        got = generate_ids(engine, ids, 32)
        assert got == want, f"{kind} prompt {text!r}"
