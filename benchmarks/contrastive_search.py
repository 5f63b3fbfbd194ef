"""Contrastive search in the engine against greedy decoding of the same prompts, in one run.

transformers 5 moved contrastive search out of the library (`generate(penalty_alpha=...)` loads it from a hub
repository, which this workplace cannot reach), so the baseline is the engine's own greedy decoding: the ratio
is what verifying `top_k` candidates per step (and running those steps eagerly, with hidden states) costs. Each
cell: one generate call of distinct prompts from an empty prefix cache, after an untimed call of the same shape;
`--output-len` tokens per request (EOS ignored), so both sides produce the same number of tokens.

    python benchmarks/contrastive_search.py --device cpu                 # the default model, batches 1 and 16
    python benchmarks/contrastive_search.py --device cuda --batches 1 16 # the same on the GPU
    python benchmarks/contrastive_search.py --llama8b --input-len 512 --output-len 128  # 8B shape, random weights
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from throughput import LLAMA3_8B, QWEN3_TOKENIZER

from radixgen import Engine


def timed(engine: Engine, prompts: list[list[int]], params: dict) -> tuple[float, int]:
    engine.flush_cache()
    engine.generate(input_ids=prompts, sampling_params=params)  # untimed: the first call of a shape compiles
    engine.flush_cache()
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0, sum(len(o["output_ids"]) for o in outs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default=None, help="model folder or GGUF file (default: the default model)")
    ap.add_argument("--llama8b", action="store_true", help="the Llama-3-8B shape with random weights (bf16 on CUDA)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=0.6)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    args = ap.parse_args()
    rows_needed = max(64, args.top_k * max(args.batches))
    if args.llama8b:
        engine = Engine(load_format="dummy", dummy_config=LLAMA3_8B, tokenizer_path=str(QWEN3_TOKENIZER),
                        device=args.device, dtype="bfloat16" if args.device == "cuda" else "float32",
                        max_running_requests=rows_needed, cuda_graph_max_bs=rows_needed)
    else:
        engine = Engine(args.model, device=args.device, max_running_requests=rows_needed)
    vocab = min(engine.tokenizer.vocab_size, engine.model_config.vocab_size)
    rng = np.random.default_rng(0)
    base = {"temperature": 0, "max_new_tokens": args.output_len, "ignore_eos": True}
    rows = []
    try:
        for b in args.batches:
            prompts = rng.integers(100, vocab, size=(b, args.input_len)).tolist()
            greedy = timed(engine, prompts, base)
            contrastive = timed(engine, prompts, {**base, "top_k": args.top_k, "penalty_alpha": args.alpha})
            rows.append((b, greedy, contrastive))
    finally:
        engine.shutdown()
    print(f"\n## contrastive search (top_k {args.top_k}, penalty_alpha {args.alpha}) against greedy decoding, "
          f"{args.device}, {args.input_len} in / {args.output_len} out")
    print(f"{'decoding':<12} {'batch':>5} {'seconds':>8} {'tok/s':>9} {'vs greedy':>9}")
    for b, (g_s, g_n), (c_s, c_n) in rows:
        print(f"{'greedy':<12} {b:>5} {g_s:>8.2f} {g_n / g_s:>9.1f} {'1.00x':>9}")
        print(f"{'contrastive':<12} {b:>5} {c_s:>8.2f} {c_n / c_s:>9.1f} {(c_n / c_s) / (g_n / g_s):>8.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
