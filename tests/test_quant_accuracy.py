"""Accuracy of the at-load quantizations on the default model (real weights), with the benchmark's own measures
(benchmarks/quant_accuracy.py) on the start of the shipped public-domain text: perplexity within a ratio of the
unquantized model's, logits within a relative deviation, and greedy continuations measured (not bounded: a tiny
model flips near-ties). Bounds are what round-to-nearest gives this 135M model, with margin; FP8 must stay far
closer than int4."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "quant_accuracy.py"
TOKENS, PROMPTS, NEW_TOKENS = 384, 2, 6
# scheme -> (perplexity ratio bound, logit relative deviation bound)
BOUNDS = {"fp8": (1.06, 0.2), "int4-g32": (1.35, 0.6), "gguf-q8_0": (1.02, 0.06)}


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("radixgen_bench_quant_accuracy", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference(bench, default_model_path):
    from radixgen.runtime.download import cache_dir
    from radixgen.runtime.loader import load_model
    from radixgen.tokenizer import Tokenizer

    ids = bench.corpus_ids(Tokenizer.from_file(str(default_model_path)), TOKENS)
    model, config = load_model(default_model_path, weight_cache_dir=cache_dir())
    harness = bench.Harness(model, config, TOKENS + 8, PROMPTS)
    return model, config, ids, harness, bench.reference_accuracy(harness, ids, TOKENS, 0), {}


def test_the_corpus_is_a_few_thousand_tokens(bench, default_model_path):
    from radixgen.tokenizer import Tokenizer

    assert 2000 <= len(bench.corpus_ids(Tokenizer.from_file(str(default_model_path)))) <= 8000


@pytest.mark.parametrize("scheme", sorted(BOUNDS))
def test_quantized_default_model_stays_near_it(bench, reference, scheme):
    model, config, ids, ref, base, cache = reference
    quant = bench.Harness(bench.quantized_copy(model, scheme), config, TOKENS + 8, PROMPTS)
    got = bench.evaluate(ref, quant, ids, TOKENS, bench.prompt_set(ids, PROMPTS, 16), NEW_TOKENS, scheme, 0, cache)
    ppl_bound, dev_bound = BOUNDS[scheme]
    print(f"\nACCURACY {scheme}: perplexity {got.perplexity:.3f} vs {base.perplexity:.3f}, logit dev "
          f"{got.logit_rel_dev:.4f}, KL {got.mean_kl:.5f}, greedy {got.greedy_prefix:.1f} of {NEW_TOKENS}")
    assert got.perplexity / base.perplexity < ppl_bound
    assert got.logit_rel_dev < dev_bound
    assert 0 <= got.greedy_prefix <= NEW_TOKENS and torch.isfinite(torch.tensor(got.mean_kl))
