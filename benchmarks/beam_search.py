"""Beam search: radixgen's engine against transformers' `generate(num_beams=...)` on the same weights.

A random-weight checkpoint (on CUDA the Llama-3-8B shape with the Qwen3 tokenizer's vocabulary, bf16; on the CPU
a tiny one, fp32) is written once; transformers runs each batch of prompts as one `generate` call (its beams
batched, `num_beams` rows per prompt), then radixgen's engine runs the same prompts as one `generate` call of
beam-search requests. Both are made to decode exactly `--output-len` tokens per beam (EOS banned until then:
`min_new_tokens`), so both do the same number of steps. Columns: seconds of the call, output tokens per second
(prompts x output_len / seconds), the ratio to transformers, "same": prompts whose best beam is the same token
for token (bf16 on CUDA rounds differently in the two, so near ties may go either way), and radixgen's engine
steps with their wall ms and the loop's split of it ("fwd": the forward, "beam": scoring and choosing beams).

    python benchmarks/beam_search.py                       # CUDA: 8B shape, batches 1 and 16, 4 beams, 512 in / 128 out
    python benchmarks/beam_search.py --device cpu --small  # a tiny model, for a quick check
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from throughput import LLAMA3_8B, QWEN3_TOKENIZER, SMALL

from radixgen import Engine


def write_checkpoint(folder: Path, config: dict, dtype: torch.dtype, device: str) -> None:
    """transformers' own random init of `config`, saved as a Hugging Face folder with the Qwen3 tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=dtype)
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copy(QWEN3_TOKENIZER, folder / "tokenizer.json")
    del model


def run_transformers(folder: Path, prompts: list[list[int]], beams: int, out_len: int, dtype: torch.dtype,
                     device: str) -> tuple[float, list[list[int]]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, device_map=device).eval()
    ids = torch.tensor(prompts, device=device)
    kwargs = {"num_beams": beams, "do_sample": False, "max_new_tokens": out_len, "min_new_tokens": out_len,
              "early_stopping": False, "pad_token_id": 0, "attention_mask": torch.ones_like(ids)}
    with torch.inference_mode():
        model.generate(ids[:1, :16], **{**kwargs, "attention_mask": torch.ones_like(ids[:1, :16]),
                                        "max_new_tokens": 4, "min_new_tokens": 4})
        _sync(device)
        t0 = time.perf_counter()
        out = model.generate(ids, **kwargs)
        _sync(device)
        seconds = time.perf_counter() - t0
    best = [row[len(prompts[0]):].tolist() for row in out]
    del model, out
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return seconds, best


def run_radixgen(engine: Engine, prompts: list[list[int]], beams: int, out_len: int,
                 device: str) -> tuple[float, list[list[int]], tuple[float, ...]]:
    """Seconds of the call, the best beams, and (steps, ms per step, forward ms, beam-choice ms per step)."""
    params = {"temperature": 0, "num_beams": beams, "max_new_tokens": out_len, "min_new_tokens": out_len}
    engine.generate(input_ids=[p[:16] for p in prompts[:1]], sampling_params={**params, "max_new_tokens": 4,
                                                                               "min_new_tokens": 4})
    engine.flush_cache()
    _sync(device)
    before = engine.get_stats()
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    _sync(device)
    seconds = time.perf_counter() - t0
    after = engine.get_stats()
    steps = max(after["steps"] - before["steps"], 1)
    split = tuple(1e3 * (after[k] - before[k]) / steps for k in ("forward_seconds", "sample_seconds"))
    return seconds, [o["output_ids"] for o in outs], (steps, 1e3 * seconds / steps, *split)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="a tiny random model instead of the Llama-3-8B shape")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args()
    small = args.small or args.device == "cpu"
    from radixgen.tokenizer import Tokenizer

    vocab = Tokenizer.from_file(str(QWEN3_TOKENIZER)).vocab_size
    config = {**(SMALL if small else LLAMA3_8B), "vocab_size": vocab, "max_position_embeddings": 4096}
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    rng = np.random.default_rng(0)
    batches = {b: rng.integers(0, vocab, size=(b, args.input_len)).tolist() for b in args.batches}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        write_checkpoint(folder, config, dtype, args.device)
        reference = {b: run_transformers(folder, prompts, args.beams, args.output_len, dtype, args.device)
                     for b, prompts in batches.items()}
        engine = Engine(str(folder), device=args.device, dtype="bfloat16" if dtype == torch.bfloat16 else "float32",
                        max_running_requests=max(64, args.beams * max(args.batches)))
        try:
            for b, prompts in batches.items():
                seconds, ids, split = run_radixgen(engine, prompts, args.beams, args.output_len, args.device)
                ref_seconds, ref_ids = reference[b]
                same = sum(a == r for a, r in zip(ids, ref_ids))
                rows.append((b, seconds, ref_seconds, same, split))
        finally:
            engine.shutdown()
    name = "tiny random model" if small else "Llama-3-8B shape (random weights, Qwen3 vocabulary)"
    print(f"\n## beam search: {name}, {args.device}, {args.beams} beams, {args.input_len} in / {args.output_len} out")
    print(f"{'engine':<13} {'batch':>5} {'seconds':>8} {'tok/s':>9} {'vs hf':>7} {'same':>6} {'steps':>6} "
          f"{'ms/step':>7} {'fwd':>6} {'beam':>6}")
    for b, seconds, ref_seconds, same, (steps, per_step, fwd, choice) in rows:
        tokens = b * args.output_len
        print(f"{'transformers':<13} {b:>5} {ref_seconds:>8.2f} {tokens / ref_seconds:>9.1f} {'1.00x':>7} {'-':>6}")
        print(f"{'radixgen':<13} {b:>5} {seconds:>8.2f} {tokens / seconds:>9.1f} {ref_seconds / seconds:>6.2f}x "
              f"{same:>3}/{b} {steps:>6} {per_step:>7.2f} {fwd:>6.2f} {choice:>6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
