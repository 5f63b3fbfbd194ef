"""The FP8 (e4m3) KV cache: kv_cache_dtype="fp8_e4m3" stores codes x / scale with per (layer, KV head) scales.

- the torch reference on an FP8 cache against full-precision attention (within what e4m3 rounding costs), and
  the batched CPU ops against the reference on the same cache;
- the Triton store/decode/extend kernels on an FP8 cache against the reference on it, under TRITON_INTERPRET=1
  in a child process (tests/kv_fp8_cases.py), and on the GPU at real sizes (marked gpu);
- the pool: twice a 16-bit cache's tokens for the same bytes; the option's validation;
- an engine on a tiny dummy model: greedy decode with an FP8 cache keeps its logits near the full cache's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from interpreted import run_interpreted
from kv_fp8_cases import FP8, AttentionCase, cases, rel_error, run_attention, run_store
from model_fixtures import TINY_CONFIGS

from radixgen import kernels
from radixgen.kernels import attention_ref, kv_quant
from radixgen.runtime import kv_pool
from radixgen.runtime.engine_config import EngineConfig
from radixgen.runtime.forward_batch import forward_batch_from_lists
from radixgen.runtime.model_runner import ModelRunner

HERE = Path(__file__).resolve().parent
TOKENIZER = HERE / "fixtures" / "tokenizers" / "smollm2-135m-instruct.tokenizer.gguf"


def _fp8_pool(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """k, v [S, Hkv, D] stored through the reference store with amax / 448 scales per head."""
    ks, vs = k.abs().amax(dim=(0, 2)) / 448.0, v.abs().amax(dim=(0, 2)) / 448.0
    kc, vc = torch.zeros(k.shape, dtype=FP8), torch.zeros(v.shape, dtype=FP8)
    attention_ref.store_kv_reference(kc, vc, torch.arange(k.shape[0]), k, v, ks, vs)
    return kc, vc, ks, vs


def test_store_reference_quantizes_by_head_and_saturates() -> None:
    k = torch.tensor([[[1.0, -3.0, 900.0, 1e-3]], [[2.0, 2.5, -2000.0, 0.0]]]).transpose(0, 1)  # [1, Hkv=2, 4]
    kc, vc = torch.zeros(2, 2, 4, dtype=FP8), torch.zeros(2, 2, 4, dtype=FP8)
    scale = torch.tensor([1.0, 2.0])
    kernels.store_kv_reference(kc, vc, torch.tensor([1]), k, k, scale, scale)
    assert kc[1, 0].float().tolist() == [1.0, -3.0, 448.0, 2.0**-9]  # the smallest subnormal, nearest to 1e-3
    assert kc[1, 1].float().tolist() == [1.0, 1.25, -448.0, 0.0]  # x / 2, saturated at -448
    assert kv_quant.dequantize_kv(kc[1:], scale, torch.float32)[0, 1].tolist() == [2.0, 2.5, -896.0, 0.0]
    assert (kc[0].float() == 0).all() and torch.equal(kc.view(torch.uint8), vc.view(torch.uint8))


def test_fp8_cache_needs_its_scales() -> None:
    kc = torch.zeros(4, 2, 16, dtype=FP8)
    with pytest.raises(ValueError, match="needs its k_scale and v_scale"):
        kernels.store_kv(kc, kc.clone(), torch.tensor([1]), torch.ones(1, 2, 16), torch.ones(1, 2, 16))
    table = torch.tensor([[1, 2]], dtype=torch.int32)
    with pytest.raises(ValueError, match="needs its k_scale and v_scale"):
        kernels.decode_attention(torch.ones(1, 2, 16), kc, kc, table, torch.tensor([0]), torch.tensor([2]), 0.25)


@pytest.mark.parametrize("window", [None, 6])
def test_reference_on_fp8_cache_is_close_to_full_precision(window: int | None) -> None:
    """Attention over e4m3 codes (3 mantissa bits: a relative rounding of at most 1/16 per element) stays within
    a few percent of the same attention over the fp32 K/V."""
    gen = torch.Generator().manual_seed(0)
    hq, hkv, d, seq = 8, 2, 32, [37, 5, 60]
    num_slots = sum(seq) + 1
    k = torch.randn(num_slots, hkv, d, generator=gen) * torch.tensor([1.0, 4.0])[None, :, None]  # per-head ranges
    v = torch.randn(num_slots, hkv, d, generator=gen)
    kc, vc, ks, vs = _fp8_pool(k, v)
    table = torch.zeros(len(seq), max(seq), dtype=torch.int32)
    perm, at = torch.randperm(num_slots - 1, generator=gen) + 1, 0
    for b, n in enumerate(seq):
        table[b, :n], at = perm[at : at + n].to(torch.int32), at + n
    req, seq_t, scale = torch.arange(len(seq)), torch.tensor(seq), d ** -0.5
    q = torch.randn(len(seq), hq, d, generator=gen)
    full = attention_ref.decode_attention_reference(q, k, v, table, req, seq_t, scale, window)
    fp8 = attention_ref.decode_attention_reference(q, kc, vc, table, req, seq_t, scale, window, k_scale=ks,
                                                   v_scale=vs)
    assert rel_error(fp8, full) < 0.05
    prefix, ext = torch.tensor([30, 0, 52]), torch.tensor([7, 5, 8])
    start = torch.cumsum(ext, 0) - ext
    qe = torch.randn(int(ext.sum()), hq, d, generator=gen)
    full = attention_ref.extend_attention_reference(qe, k, v, table, req, prefix, ext, start, scale, window)
    fp8 = attention_ref.extend_attention_reference(qe, kc, vc, table, req, prefix, ext, start, scale, window,
                                                   k_scale=ks, v_scale=vs)
    assert rel_error(fp8, full) < 0.05


@pytest.mark.parametrize("case", [c for c in cases("small")], ids=lambda c: c.name)
def test_batched_cpu_ops_match_reference_on_fp8_cache(case: AttentionCase) -> None:
    """The CPU path (kernels.decode_attention / extend_attention: attention_torch) dequantizes as the reference."""
    error = run_attention(case, "cpu", 7, kernels.decode_attention_torch, kernels.extend_attention_torch)
    assert error < (1e-5 if case.dtype == torch.float32 else 2e-3)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    """tests/kv_fp8_cases.py under the Triton interpreter in a child process (the variable must be set before
    Triton is imported). Skipped where CUDA is available: the GPU test runs the kernels compiled."""
    return run_interpreted([str(HERE / "kv_fp8_cases.py"), "--device", "cpu", "--size", "small"],
                           "CUDA present: test_triton_cuda_fp8_matches_reference runs the kernels compiled")


@pytest.mark.parametrize("name", [c.name for c in cases("small")])
def test_triton_interpret_fp8_attention_matches_reference(name: str, interpreted: dict) -> None:
    error = interpreted[name]
    assert isinstance(error, float), f"{name} raised {error}"
    assert error < 1e-3, f"{name}: relative error {error:.3e}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_triton_interpret_fp8_store_matches_reference(dtype: str, interpreted: dict) -> None:
    result = interpreted[f"store-{dtype}"]
    assert isinstance(result, list), f"store-{dtype} raised {result}"
    _mismatches, unexplained = result
    assert unexplained == 0, f"store-{dtype}: {unexplained} codes differ beyond the interpreter's own conversion"


def test_pool_holds_twice_the_tokens_in_fp8() -> None:
    from radixgen.runtime.config import ModelConfig

    config = ModelConfig.from_hf(TINY_CONFIGS["llama"])
    cpu, budget = torch.device("cpu"), 64 << 20
    bf16 = kv_pool.kv_pool_num_slots(config, torch.bfloat16, cpu, None, 0.9, cpu_budget_bytes=budget)
    fp8 = kv_pool.kv_pool_num_slots(config, FP8, cpu, None, 0.9, cpu_budget_bytes=budget)
    assert fp8 - 1 == 2 * (bf16 - 1)
    pool16 = kv_pool.KVPool.for_model(config, 100, torch.bfloat16, cpu)
    pool8 = kv_pool.KVPool.for_model(config, 100, FP8, cpu)
    assert pool8.nbytes() * 2 == pool16.nbytes()
    assert pool16.scales(0) is None and pool16.k_scales is None
    scales = pool8.scales(1)
    assert scales is not None and scales[0].shape == (config.num_key_value_heads,) and bool((scales[0] == 1).all())
    pool8.set_scales(torch.tensor([[0.5], [2.0]]), 0.25)  # per layer, broadcast to the heads
    assert pool8.scales(1)[0].tolist() == [2.0, 2.0] and scales[0].tolist() == [2.0, 2.0]  # views: graphs see it
    assert pool8.v_scales is not None and bool((pool8.v_scales == 0.25).all())
    with pytest.raises(ValueError, match="finite and positive"):
        pool8.set_scales(0.0, 1.0)
    with pytest.raises(ValueError, match="takes no scales"):
        pool16.set_scales(1.0, 1.0)


def test_kv_cache_dtype_option(monkeypatch: pytest.MonkeyPatch) -> None:
    assert EngineConfig().kv_cache_dtype == "auto"
    for name in ("auto", "fp8_e4m3", "fp8"):
        EngineConfig.from_options(kv_cache_dtype=name)
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be auto\|fp8_e4m3\|fp8"):
        EngineConfig.from_options(kv_cache_dtype="fp8_e5m2")
    assert kv_pool.kv_cache_dtype("auto", torch.float32, torch.device("cpu")) == torch.float32
    assert kv_pool.kv_cache_dtype("fp8", torch.bfloat16, torch.device("cpu")) == FP8
    monkeypatch.setattr(kv_pool, "FP8_KV_DTYPE", None)  # a torch without float8 dtypes
    with pytest.raises(ValueError, match="needs a torch with float8 dtypes"):
        EngineConfig.from_options(kv_cache_dtype="fp8_e4m3")


def _greedy_logits(kv_cache_dtype: str, prompts: list[list[int]], forced: list[list[int]] | None, steps: int,
                   device: str = "cpu", **options: object) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Prefill the prompts as one batch, then `steps` decode steps of them all, each feeding `forced`'s tokens
    (None: the greedy ones). Returns the logits [B, vocab] of every step and the greedy tokens."""
    config = EngineConfig(load_format="dummy", dummy_config=TINY_CONFIGS["llama"], device=device,
                          max_total_tokens=512, max_running_requests=4, context_length=128,
                          kv_cache_dtype=kv_cache_dtype, **options)  # type: ignore[arg-type]
    runner = ModelRunner(config)
    table = runner.req_to_token_pool.req_to_token
    rows = [runner.req_to_token_pool.alloc() for _ in prompts]
    lens = [len(p) for p in prompts]
    slots = []
    for row, n in zip(rows, lens):
        s = runner.slot_allocator.alloc(n)
        runner.req_to_token_pool.write(row, 0, s)
        slots.append(torch.from_numpy(s))
    logits = [runner.forward(forward_batch_from_lists(prompts, [0] * len(prompts), rows, table, torch.cat(slots)))]
    tokens: list[list[int]] = [[] for _ in prompts]
    for step in range(steps):
        nxt = logits[-1].argmax(-1).tolist()
        for b, t in enumerate(nxt):
            tokens[b].append(t)
        feed = [[forced[b][step] if forced is not None else nxt[b]] for b in range(len(prompts))]
        new = []
        for b, row in enumerate(rows):
            s = runner.slot_allocator.alloc(1)
            runner.req_to_token_pool.write(row, lens[b], s)
            new.append(torch.from_numpy(s))
        logits.append(runner.forward(forward_batch_from_lists(feed, lens, rows, table, torch.cat(new))))
        lens = [n + 1 for n in lens]
    return [x.cpu() for x in logits], tokens


def _compare_fp8_engine(device: str, **options: object) -> None:
    """Greedy decode with an FP8 cache, the full cache's tokens fed to both (so every step compares logits of the
    same context): logits within a bound of the full cache's, relative to their spread."""
    prompts = [[5, 17, 99, 3, 42, 7, 8, 120, 33], [1, 2, 3], list(range(40, 72))]
    ref, tokens = _greedy_logits("auto", prompts, None, 12, device, **options)
    fp8, _ = _greedy_logits("fp8_e4m3", prompts, tokens, 12, device, **options)
    deviation = max(float((a - b).abs().max() / b.std()) for a, b in zip(fp8, ref))
    assert deviation < 0.25, f"FP8 cache logits deviate by {deviation:.3f} x their std from the full cache's"
    agree = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(fp8, ref)) / sum(len(b) for b in ref)
    assert agree >= 0.8, f"greedy agreement {agree:.2f}"


def test_engine_fp8_cache_greedy_logits_stay_close_cpu() -> None:
    _compare_fp8_engine("cpu")


def test_engine_generates_with_fp8_cache() -> None:
    from radixgen import Engine

    with Engine(load_format="dummy", dummy_config={**TINY_CONFIGS["llama"], "vocab_size": 49152},
                tokenizer_path=str(TOKENIZER), device="cpu", cpu_threads=1, kv_cache_dtype="fp8_e4m3",
                max_total_tokens=256, context_length=128) as engine:
        out = engine.generate(["a b c", "the"], {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True})
        assert isinstance(out, list) and [len(o["output_ids"]) for o in out] == [6, 6]
        assert engine.runner.kv_pool.dtype == FP8


def test_checkpoint_kv_scales_reach_the_fp8_pool(tmp_path: Path) -> None:
    """An FP8 checkpoint's `model.layers.N.self_attn.k_scale` / `v_scale` (vLLM's names, dequantized K = code *
    k_scale) become the pool's scales; without the FP8 cache they are ignored, and a checkpoint lacking some layer's
    scales leaves the defaults (1.0)."""
    from model_fixtures import write_tiny_checkpoint
    from safetensors.torch import load_file, save_file

    folder = write_tiny_checkpoint(tmp_path / "m", "llama")
    (weights,) = folder.glob("*.safetensors")
    tensors = load_file(weights)
    layers = TINY_CONFIGS["llama"]["num_hidden_layers"]
    for i in range(layers):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(0.5 + i)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(0.25 * (i + 1))
    save_file(tensors, weights)
    options = {"device": "cpu", "tokenizer_path": str(TOKENIZER), "max_total_tokens": 64, "context_length": 64}
    runner = ModelRunner(EngineConfig.from_options(str(folder), kv_cache_dtype="fp8_e4m3", **options))
    pool = runner.kv_pool
    assert pool.k_scales is not None and pool.v_scales is not None
    assert pool.k_scales[:, 0].tolist() == [0.5 + i for i in range(layers)]
    assert pool.v_scales[:, 0].tolist() == [0.25 * (i + 1) for i in range(layers)]
    assert bool((pool.k_scales == pool.k_scales[:, :1]).all())  # per tensor: every head of a layer alike
    assert ModelRunner(EngineConfig.from_options(str(folder), **options)).kv_pool.k_scales is None
    del tensors["model.layers.0.self_attn.v_scale"]
    save_file(tensors, weights)
    partial = ModelRunner(EngineConfig.from_options(str(folder), kv_cache_dtype="fp8_e4m3", **options)).kv_pool
    assert partial.k_scales is not None and bool((partial.k_scales == 1.0).all())


@pytest.mark.gpu
@pytest.mark.parametrize("case", cases("real"), ids=lambda c: c.name)
def test_triton_cuda_fp8_matches_reference(case: AttentionCase) -> None:
    from radixgen.kernels.decode_attention_triton import decode_attention_triton
    from radixgen.kernels.extend_attention_triton import extend_attention_triton

    seed = int.from_bytes(os.urandom(4), "little")
    error = run_attention(case, "cuda", seed, decode_attention_triton, extend_attention_triton)
    assert error < 2e-2, f"{case.name}: relative error {error:.3e} (seed {seed})"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_triton_cuda_fp8_store_is_exact(dtype: torch.dtype) -> None:
    from radixgen.kernels.store_kv_triton import store_kv_triton

    mismatches, _ = run_store("cuda", 3, store_kv_triton, dtype, 4096, 8, 128)
    assert mismatches == 0


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graph", [True, False])
def test_engine_fp8_cache_greedy_logits_stay_close_cuda(cuda_graph: bool) -> None:
    _compare_fp8_engine("cuda", cuda_graph=cuda_graph)
