"""End-to-end generation throughput: radixgen's engine against transformers `generate`, same weights, same run.

The model is Llama-3-8B-shaped (32 layers, hidden 4096, MLP 14336, 32 query / 8 KV heads, vocab 128,256) with
random weights (`load_format="dummy"`); transformers' LlamaForCausalLM is built from the same config and gets a
copy of radixgen's weights (through `checkpoint_targets()`, which names every tensor the HF way), bf16, SDPA
attention, its default cache. Each batch of B prompts of `--input-len` random token ids generates exactly
`--output-len` tokens greedily (ignore_eos), prompts fresh for every run so nothing is served from the prefix
cache.

Tokenizer: the engine detokenizes every output. A dummy model samples any id below 128,256, more than Llama 3's
own tokenizer would be shipped here for; the Qwen3 tokenizer in tests/fixtures (151,669 ids) covers every one
of them, so prompts go in as ids and every generated id detokenizes to (meaningless) text, the engine doing all
of its per-token work.

Columns: "e2e" = B * output_len / wall time of the whole generate call (prefill included); "decode" = B *
(output_len - 1) / (time of that call - time of the same call with max_new_tokens=1): the decode phase alone;
"graph step" = GPU time of one replay of the batch's decode graph at the run's mean length (CUDA events), and
the tokens/s it alone would give; every row reads one request's KV there, so its attention is L2-resident and
the figure is a lower bound of the real step. `--sync-too` also times each batch with the overlap schedule off
(the same engine, switched between runs): the gap shows the per-step host work (schedule, batch building,
sampling, stop checks, detokenization) that the overlapped loop hides behind the GPU.

`--quantization` quantizes the random weights at load (`EngineConfig.quantization`: int4 round-to-nearest group
128, FP8 e4m3 per-channel, GGUF Q4_K / Q8_0 blocks) and reports the layer linears' weight memory; transformers is
not run then (it has no such weights to copy). `--kv-cache-dtype fp8_e4m3` stores the KV cache in FP8
(`EngineConfig.kv_cache_dtype`; transformers is not run either).

    python benchmarks/throughput.py                          # Llama-3-8B shape on CUDA, batches 1 16 64 256
    python benchmarks/throughput.py --quantization int4 --batches 1 64 256
    python benchmarks/throughput.py --quantization fp8 --kv-cache-dtype fp8_e4m3 --batches 256
    python benchmarks/throughput.py --small --device cpu     # a tiny model, a smoke run of the script
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
QWEN3_TOKENIZER = REPO / "tests" / "fixtures" / "tokenizers" / "qwen3" / "tokenizer.json"

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "hidden_act": "silu", "bos_token_id": 128000, "eos_token_id": 128001,
}
# --quantization -> EngineConfig.quantization
QUANTIZATIONS = {"none": "auto", "fp8": "fp8", "int4": "int4", "gguf-q4k": "gguf-q4_k", "gguf-q8": "gguf-q8_0"}
SMALL = {**LLAMA3_8B, "vocab_size": 2048, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512, "bos_token_id": 1,
         "eos_token_id": 2}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _prompts(rng: np.random.Generator, batch: int, length: int, vocab: int) -> list[list[int]]:
    return rng.integers(0, vocab, size=(batch, length)).tolist()


def run_radixgen(engine, rng: np.random.Generator, batch: int, input_len: int, output_len: int) -> dict:
    """Times one generate call of `batch` prompts (and a prefill-only call for the decode split)."""
    vocab = engine.model_config.vocab_size
    device = engine.runner.device
    times = {}
    # Untimed first: a batch size's first steps may compile Triton variants (shape specializations).
    engine.generate(input_ids=_prompts(rng, batch, input_len, vocab),
                    sampling_params={"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True})
    for new in (1, output_len):
        engine.flush_cache()
        prompts = _prompts(rng, batch, input_len, vocab)
        params = {"max_new_tokens": new, "temperature": 0.0, "ignore_eos": True}
        _sync(device)
        start = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        _sync(device)
        times[new] = time.perf_counter() - start
        assert all(len(o["output_ids"]) == new for o in outs), "a request stopped early"
    full, prefill = times[output_len], times[1]
    return {"batch": batch, "seconds": full, "prefill_seconds": prefill, "prefill_tok_s": batch * input_len / prefill,
            "e2e_tok_s": batch * output_len / full,
            "decode_tok_s": batch * (output_len - 1) / max(full - prefill, 1e-9)}


def graph_step_ms(graph_runner, batch: int, seq_len: int, iters: int = 20) -> float:
    """GPU time of one decode step alone: the bucket's CUDA graph replayed with every row at `seq_len`.

    Every row reads request row 0 of req_to_token (any slots: only the time matters) and writes the padding
    slot; the rows are reset to padding afterwards. Step time minus this is the engine's per-step CPU cost.
    """
    bs = graph_runner.bucket(batch)
    graph_runner.seq_lens[:bs].fill_(seq_len)
    ms = replay_ms(graph_runner.graphs[bs], iters)
    graph_runner.seq_lens[:bs].zero_()
    return ms


def replay_ms(graph, iters: int = 20) -> float:
    """GPU ms of one replay of a captured graph (CUDA events around `iters` replays, after one warm replay)."""
    graph.replay()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / iters


def weight_gib(model) -> float:
    """GiB of the model's layer matmul weights as stored (packed data, scales and zeros included)."""
    from radixgen.kernels import weight_nbytes

    return sum(weight_nbytes(slot.weight) for slot in model.linear_slots()) / 2**30


def build_hf_model(config: dict, ours: torch.nn.Module, device: torch.device, dtype: torch.dtype):
    """transformers' LlamaForCausalLM with the same config and a copy of our weights (HF tensor names)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_config = LlamaConfig.from_dict(config)
    hf_config._attn_implementation = "sdpa"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            hf = LlamaForCausalLM(hf_config)
    finally:
        torch.set_default_dtype(previous)
    targets = ours.checkpoint_targets()
    with torch.no_grad():
        names = dict(hf.named_parameters())
        missing = sorted(set(names) ^ set(targets))
        if missing:
            raise RuntimeError(f"parameter names differ between transformers and radixgen: {missing[:5]}")
        for name, param in names.items():
            t = targets[name]
            param.copy_(t.param[t.start : t.stop])
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf.eval()


@torch.inference_mode()
def greedy_agreement(engine, hf, rng: np.random.Generator, vocab: int, device: torch.device, n: int = 16) -> str:
    """Same weights, same greedy continuation? Leading tokens equal for 4 prompts (bf16 may flip near-ties)."""
    prompts = _prompts(rng, 4, 32, vocab)
    ours = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": n, "temperature": 0.0,
                                                             "ignore_eos": True})
    ids = torch.tensor(prompts, device=device)
    theirs = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False)[:, 32:].tolist()
    same = [next((j for j in range(n) if a["output_ids"][j] != b[j]), n) for a, b in zip(ours, theirs)]
    return f"greedy tokens equal before the first difference, 4 prompts: {same} of {n}"


@torch.inference_mode()
def run_hf(hf, rng: np.random.Generator, batch: int, input_len: int, output_len: int, vocab: int,
           device: torch.device) -> dict:
    ids = torch.tensor(_prompts(rng, batch, input_len, vocab), device=device)
    _sync(device)
    start = time.perf_counter()
    out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=output_len,
                      min_new_tokens=output_len, do_sample=False)
    _sync(device)
    seconds = time.perf_counter() - start
    assert out.shape == (batch, input_len + output_len)
    return {"batch": batch, "seconds": seconds, "e2e_tok_s": batch * output_len / seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--hf-batches", type=int, nargs="*", default=None, help="default: the same as --batches")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--small", action="store_true", help="a tiny model instead of the Llama-3-8B shape")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-cuda-graph", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="also write every number here")
    ap.add_argument("--quantization", default="none", choices=sorted(QUANTIZATIONS),
                    help="quantize the layer linears at load (transformers is then not run)")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8_e4m3"],
                    help="the KV cache's dtype (transformers is then not run)")
    ap.add_argument("--sync-too", action="store_true",
                    help="also time each batch with the overlap scheduler off (the synchronous loop), same engine")
    args = ap.parse_args(argv)

    from radixgen.runtime.engine import Engine

    config = SMALL if args.small else LLAMA3_8B
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    max_b = max(args.batches)
    hf_batches = args.batches if args.hf_batches is None else args.hf_batches
    if args.quantization != "none" or args.kv_cache_dtype != "auto":
        hf_batches = []
    rng = np.random.default_rng(0)

    start = time.perf_counter()
    engine = Engine(load_format="dummy", dummy_config=config, tokenizer_path=str(QWEN3_TOKENIZER),
                    device=args.device, dtype="bfloat16" if dtype == torch.bfloat16 else "float32",
                    max_total_tokens=max_b * (args.input_len + args.output_len) + 256,
                    max_running_requests=max_b, cuda_graph=not args.no_cuda_graph, cuda_graph_max_bs=max_b,
                    quantization=QUANTIZATIONS[args.quantization], kv_cache_dtype=args.kv_cache_dtype)
    graphs = engine.runner.graph_runner
    print(f"engine ready in {time.perf_counter() - start:.1f} s ({len(graphs.graphs) if graphs else 0} CUDA graphs)",
          flush=True)
    linear_gib = weight_gib(engine.runner.model)
    if args.quantization != "none" and isinstance(engine.runner.model.linear_slots()[0].weight, torch.Tensor):
        raise SystemExit("the engine's linears are dense: ModelRunner must pass EngineConfig.quantization to "
                         "load_model(quantization=...)")
    print(f"quantization {args.quantization}: layer linears {linear_gib:.2f} GiB", flush=True)
    engine.generate(input_ids=_prompts(rng, 2, args.input_len, config["vocab_size"]),
                    sampling_params={"max_new_tokens": 4, "ignore_eos": True})  # compile the prefill kernels
    ours = []
    for b in args.batches:
        if args.sync_too:  # the engine's switch behind disable_overlap_schedule, flipped between runs
            engine.core.scheduler.limits.overlap_schedule = False
            sync = run_radixgen(engine, rng, b, args.input_len, args.output_len)
            engine.core.scheduler.limits.overlap_schedule = True
        ours.append(run_radixgen(engine, rng, b, args.input_len, args.output_len))
        if args.sync_too:
            ours[-1].update(sync_e2e_tok_s=sync["e2e_tok_s"], sync_decode_tok_s=sync["decode_tok_s"])
        if graphs is not None:  # the decode step's GPU time alone, at the run's mean sequence length
            step_ms = graph_step_ms(graphs, b, args.input_len + args.output_len // 2)
            ours[-1].update(graph_step_ms=step_ms, graph_only_tok_s=b / step_ms * 1e3)
        print("radixgen", json.dumps(ours[-1]), flush=True)

    theirs = {}
    if hf_batches:
        hf = build_hf_model(config, engine.runner.model, device, dtype)
        print(greedy_agreement(engine, hf, rng, config["vocab_size"], device), flush=True)  # also a warm-up
        for b in hf_batches:
            theirs[b] = run_hf(hf, rng, b, args.input_len, args.output_len, config["vocab_size"], device)
            print("transformers", json.dumps(theirs[b]), flush=True)
        del hf
    engine.shutdown()

    name = "tiny" if args.small else "Llama-3-8B-shaped"
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"\n{name}, random weights, {dtype}, {gpu}; {args.input_len} prompt + {args.output_len} generated tokens "
          f"per request, greedy; CUDA graphs {'on' if graphs else 'off'}; quantization {args.quantization} "
          f"(layer linears {linear_gib:.2f} GiB); KV cache {args.kv_cache_dtype}")
    print("| batch | radixgen e2e tok/s | radixgen decode tok/s | graph step ms (tok/s) | radixgen s "
          "| synchronous loop e2e / decode tok/s | transformers tok/s | transformers s | e2e speedup |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in ours:
        t = theirs.get(r["batch"])
        hf_cols = (f"{t['e2e_tok_s']:,.1f} | {t['seconds']:.2f} | {r['e2e_tok_s'] / t['e2e_tok_s']:.1f}x" if t
                   else "- | - | -")
        step = (f"{r['graph_step_ms']:.2f} ({r['graph_only_tok_s']:,.0f})" if "graph_step_ms" in r else "-")
        sync = (f"{r['sync_e2e_tok_s']:,.1f} / {r['sync_decode_tok_s']:,.1f}" if "sync_decode_tok_s" in r else "-")
        print(f"| {r['batch']} | {r['e2e_tok_s']:,.1f} | {r['decode_tok_s']:,.1f} | {step} | {r['seconds']:.2f} "
              f"| {sync} | {hf_cols} |")
    if args.json:
        args.json.write_text(json.dumps({"config": config, "radixgen": ours, "transformers": list(theirs.values()),
                                         "device": gpu, "quantization": args.quantization,
                                         "kv_cache_dtype": args.kv_cache_dtype,
                                         "linear_gib": linear_gib}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
