"""Attention kernels on the GPU: ours (reading K/V by slot from the pool) against torch SDPA (contiguous K/V).

decode: achieved bandwidth = bytes of K and V read / time, at batch 1/64/256 and contexts 1k-32k, 32 query /
8 KV heads, head dim 128, bf16. Ours reads a pool whose slots are contiguous per request (what a fresh
allocation gives) and, in the rows marked "shuffled", a random permutation of slots. Both are timed as CUDA
graph replays (the engine replays decode steps as graphs), median of many.
prefill: TFLOP/s of causal attention (4 * B * Hq * L^2 * D / 2 FLOPs) over the same heads, ours against SDPA
is_causal=True.
multi-query: rows of k = 4 or 8 new tokens after a cached context (speculative verify, multi-token rows), at
batch 1/8/32 and contexts 1k/4k: the multi-query decode kernel against the extend kernel (what such rows ran
before) and a 1-token decode step over the same contexts, all CUDA-graph replays with the split count a graph
of an 8,192-token model bakes in (max_seq_len = GRAPH_CONTEXT, as CudaGraphRunner captures them).

    python benchmarks/kernels_bench.py                 # the tables
    python benchmarks/kernels_bench.py --only multi    # only the multi-query table (also: decode, prefill)
    python benchmarks/kernels_bench.py --sweep all     # also try launch configs and print the best ones
    python benchmarks/kernels_bench.py --sweep multi   # only the multi-query kernel's launch configs
    python benchmarks/kernels_bench.py --json out.json # also write every number
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
import time

import torch
import torch.nn.functional as F
import triton
from triton.runtime.errors import OutOfResources

from radixgen.kernels.decode_attention_triton import DecodeConfig, decode_attention_triton
from radixgen.kernels.extend_attention_triton import (
    ExtendConfig,
    extend_attention_triton,
)
from radixgen.kernels.multi_query_decode_triton import multi_query_decode_attention_triton

HQ, HKV, D = 32, 8, 128
DTYPE = torch.bfloat16
DECODE_SHAPES = [(1, 1024), (1, 4096), (1, 16384), (1, 32768), (64, 1024), (64, 4096), (64, 16384),
                 (64, 32768), (256, 1024), (256, 2048), (256, 4096), (256, 8192)]
PREFILL_SHAPES = [(1, 2048), (4, 4096), (1, 16384), (16, 1024)]
MULTI_SHAPES = [(b, ctx, k) for b in (1, 8, 32) for ctx in (1024, 4096) for k in (4, 8)]  # (batch, context, new)
GRAPH_CONTEXT = 8192  # Llama-3-8B's context length: the max_seq_len the engine's graphs are captured with


def bench_graph(fn) -> float:
    """Median milliseconds of `fn` replayed as a CUDA graph (falls back to plain launches)."""
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    except RuntimeError as exc:  # capture can fail on a runtime quirk; the plain timing still means something
        print(f"  (graph capture failed: {type(exc).__name__}; timing plain launches)", file=sys.stderr)
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


class DecodeProblem:
    """Random q and a K/V pool for `batch` requests of `ctx` tokens each, plus the contiguous SDPA twin."""

    def __init__(self, batch: int, ctx: int, shuffled: bool = False, with_sdpa: bool = True):
        dev = "cuda"
        self.batch, self.ctx = batch, ctx
        slots = batch * ctx
        self.k_cache = torch.randn(slots, HKV, D, device=dev, dtype=DTYPE)
        self.v_cache = torch.randn(slots, HKV, D, device=dev, dtype=DTYPE)
        order = torch.randperm(slots, device=dev) if shuffled else torch.arange(slots, device=dev)
        self.req_to_token = order.view(batch, ctx).to(torch.int32)
        self.req_pool_indices = torch.arange(batch, device=dev)
        self.seq_lens = torch.full((batch,), ctx, device=dev, dtype=torch.int32)
        self.q = torch.randn(batch, HQ, D, device=dev, dtype=DTYPE)
        self.bytes = 2 * slots * HKV * D * DTYPE.itemsize
        if with_sdpa:  # [B, H, L, D] views of the same numbers, contiguous per (request, head)
            self.k = self.k_cache.view(batch, ctx, HKV, D).transpose(1, 2).contiguous()
            self.v = self.v_cache.view(batch, ctx, HKV, D).transpose(1, 2).contiguous()

    def ours(self, config: DecodeConfig | None = None):
        return decode_attention_triton(self.q, self.k_cache, self.v_cache, self.req_to_token,
                                       self.req_pool_indices, self.seq_lens, D ** -0.5, None, self.ctx,
                                       config=config)

    def sdpa(self):
        return F.scaled_dot_product_attention(self.q.unsqueeze(2), self.k, self.v, scale=D ** -0.5,
                                              enable_gqa=True)

    def check(self) -> float:
        ref = self.sdpa().squeeze(2).float()
        return ((self.ours().float() - ref).norm() / ref.norm()).item()


class PrefillProblem:
    def __init__(self, batch: int, length: int):
        dev = "cuda"
        self.batch, self.length = batch, length
        tokens = batch * length
        self.q = torch.randn(tokens, HQ, D, device=dev, dtype=DTYPE)
        self.k_cache = torch.randn(tokens, HKV, D, device=dev, dtype=DTYPE)
        self.v_cache = torch.randn(tokens, HKV, D, device=dev, dtype=DTYPE)
        self.req_to_token = torch.arange(tokens, device=dev, dtype=torch.int32).view(batch, length)
        self.req_pool_indices = torch.arange(batch, device=dev)
        self.prefix_lens = torch.zeros(batch, device=dev, dtype=torch.int32)
        self.extend_lens = torch.full((batch,), length, device=dev, dtype=torch.int32)
        self.start = torch.arange(batch, device=dev, dtype=torch.int32) * length
        self.qs = self.q.view(batch, length, HQ, D).transpose(1, 2).contiguous()
        self.ks = self.k_cache.view(batch, length, HKV, D).transpose(1, 2).contiguous()
        self.vs = self.v_cache.view(batch, length, HKV, D).transpose(1, 2).contiguous()
        self.flops = 4 * batch * HQ * length * length * D / 2

    def ours(self, config: ExtendConfig | None = None):
        return extend_attention_triton(self.q, self.k_cache, self.v_cache, self.req_to_token,
                                       self.req_pool_indices, self.prefix_lens, self.extend_lens, self.start,
                                       D ** -0.5, None, self.length, config=config)

    def sdpa(self):
        return F.scaled_dot_product_attention(self.qs, self.ks, self.vs, is_causal=True, scale=D ** -0.5,
                                              enable_gqa=True)

    def check(self) -> float:
        ref = self.sdpa().transpose(1, 2).reshape(-1, HQ, D).float()
        return ((self.ours().float() - ref).norm() / ref.norm()).item()


class MultiQueryProblem:
    """`batch` requests of `ctx` cached tokens plus `k` new ones each (slots contiguous per request), their queries
    packed as the engine packs them, and a 1-token decode query per request over the same contexts."""

    def __init__(self, batch: int, ctx: int, k: int):
        dev = "cuda"
        self.batch, self.ctx, self.k = batch, ctx, k
        seq = ctx + k
        self.k_cache = torch.randn(batch * seq, HKV, D, device=dev, dtype=DTYPE)
        self.v_cache = torch.randn(batch * seq, HKV, D, device=dev, dtype=DTYPE)
        self.req_to_token = torch.arange(batch * seq, device=dev, dtype=torch.int32).view(batch, seq)
        self.req_pool_indices = torch.arange(batch, device=dev)
        self.prefix_lens = torch.full((batch,), ctx, device=dev, dtype=torch.int32)
        self.extend_lens = torch.full((batch,), k, device=dev, dtype=torch.int32)
        self.start = torch.arange(batch, device=dev, dtype=torch.int32) * k
        self.q = torch.randn(batch * k, HQ, D, device=dev, dtype=DTYPE)
        self.q1 = torch.randn(batch, HQ, D, device=dev, dtype=DTYPE)
        self.seq_lens1 = torch.full((batch,), ctx + 1, device=dev, dtype=torch.int32)

    def multi(self, config: DecodeConfig | None = None):
        return multi_query_decode_attention_triton(self.q, self.k_cache, self.v_cache, self.req_to_token,
                                                   self.req_pool_indices, self.prefix_lens, self.extend_lens,
                                                   self.start, D ** -0.5, None, self.k, GRAPH_CONTEXT,
                                                   config=config)

    def extend(self):
        return extend_attention_triton(self.q, self.k_cache, self.v_cache, self.req_to_token, self.req_pool_indices,
                                       self.prefix_lens, self.extend_lens, self.start, D ** -0.5, None, self.k)

    def decode(self):
        return decode_attention_triton(self.q1, self.k_cache, self.v_cache, self.req_to_token,
                                       self.req_pool_indices, self.seq_lens1, D ** -0.5, None, GRAPH_CONTEXT)

    def check(self) -> float:
        ref = self.extend().float()
        return ((self.multi().float() - ref).norm() / ref.norm()).item()


def multi_query_table(records: list[dict]) -> list[str]:
    lines = ["| batch | context | new tokens | multi-query us | extend us | decode (1 token) us | multi / decode | "
             "extend / decode | extend / multi | rel err |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for batch, ctx, k in MULTI_SHAPES:
        prob = MultiQueryProblem(batch, ctx, k)
        t_multi, t_ext, t_dec = bench_graph(prob.multi), bench_graph(prob.extend), bench_graph(prob.decode)
        rec = {"kind": "multi-query", "batch": batch, "ctx": ctx, "new_tokens": k, "multi_ms": t_multi,
               "extend_ms": t_ext, "decode_ms": t_dec, "rel_err": prob.check()}
        records.append(rec)
        lines.append(f"| {batch} | {ctx} | {k} | {t_multi * 1e3:.1f} | {t_ext * 1e3:.1f} | {t_dec * 1e3:.1f} | "
                     f"{t_multi / t_dec:.2f}x | {t_ext / t_dec:.2f}x | {t_ext / t_multi:.2f}x | "
                     f"{rec['rel_err']:.1e} |")
        print(lines[-1], flush=True)
        del prob
        torch.cuda.empty_cache()
    return lines


def sweep_multi_query(records: list[dict]) -> list[str]:
    """Try multi-query launch configs (block_n, warps, stages) on four shapes; the best three per shape against
    the default (`default_multi_query_config`)."""
    lines = []
    for batch, ctx, k in [(1, 1024, 4), (1, 4096, 8), (8, 4096, 4), (32, 4096, 8)]:
        prob = MultiQueryProblem(batch, ctx, k)
        results = []
        for bn, warps, stages in itertools.product((32, 64, 128), (4, 8), (2, 3, 4)):
            cfg = DecodeConfig(block_n=bn, num_warps=warps, num_stages=stages)
            try:
                t = bench_graph(functools.partial(prob.multi, cfg))
            except (RuntimeError, OutOfResources) as exc:
                print(f"  multi-query {cfg} failed: {type(exc).__name__}", file=sys.stderr)
                continue
            results.append((t, cfg))
            records.append({"kind": "sweep-multi-query", "batch": batch, "ctx": ctx, "new_tokens": k,
                            "cfg": repr(cfg), "ms": t})
        results.sort(key=lambda r: r[0])
        base = bench_graph(prob.multi)
        for t, cfg in results[:3]:
            lines.append(f"multi-query {batch}x{ctx}+{k}: {t * 1e3:.1f} us {cfg}; default {base * 1e3:.1f} us")
        print("\n".join(lines[-3:]), flush=True)
        del prob
        torch.cuda.empty_cache()
    return lines


def decode_table(records: list[dict]) -> list[str]:
    lines = ["| batch | context | slots | ours us | ours TB/s | SDPA us | SDPA TB/s | ours/SDPA | rel err |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    shapes = DECODE_SHAPES + [(1, 32768, "shuffled"), (64, 4096, "shuffled")]
    for shape in shapes:
        batch, ctx = shape[:2]
        shuffled = len(shape) > 2
        prob = DecodeProblem(batch, ctx, shuffled=shuffled, with_sdpa=not shuffled)
        t_ours = bench_graph(prob.ours)
        rec = {"kind": "decode", "batch": batch, "ctx": ctx, "shuffled": shuffled, "ours_ms": t_ours,
                   "ours_tbs": prob.bytes / t_ours / 1e9}
        if not shuffled:
            t_sdpa = bench_graph(prob.sdpa)
            rec.update(sdpa_ms=t_sdpa, sdpa_tbs=prob.bytes / t_sdpa / 1e9, rel_err=prob.check())
        records.append(rec)
        sd = (f"{rec['sdpa_ms'] * 1e3:.1f} | {rec['sdpa_tbs']:.2f} | {rec['ours_tbs'] / rec['sdpa_tbs']:.0%} | "
              f"{rec['rel_err']:.1e}") if not shuffled else "- | - | - | -"
        lines.append(f"| {batch} | {ctx} | {'shuffled' if shuffled else 'contiguous'} | {t_ours * 1e3:.1f} | "
                     f"{rec['ours_tbs']:.2f} | {sd} |")
        print(lines[-1], flush=True)
        del prob
        torch.cuda.empty_cache()
    return lines


def prefill_table(records: list[dict]) -> list[str]:
    lines = ["| batch | length | ours ms | ours TFLOP/s | SDPA ms | SDPA TFLOP/s | ours/SDPA | rel err |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for batch, length in PREFILL_SHAPES:
        prob = PrefillProblem(batch, length)
        t_ours, t_sdpa = bench(prob.ours), bench(prob.sdpa)
        rec = {"kind": "prefill", "batch": batch, "length": length, "ours_ms": t_ours, "sdpa_ms": t_sdpa,
                   "ours_tflops": prob.flops / t_ours / 1e9, "sdpa_tflops": prob.flops / t_sdpa / 1e9,
                   "rel_err": prob.check()}
        records.append(rec)
        lines.append(f"| {batch} | {length} | {t_ours:.3f} | {rec['ours_tflops']:.0f} | {t_sdpa:.3f} | "
                     f"{rec['sdpa_tflops']:.0f} | {rec['ours_tflops'] / rec['sdpa_tflops']:.0%} | "
                     f"{rec['rel_err']:.1e} |")
        print(lines[-1], flush=True)
        del prob
        torch.cuda.empty_cache()
    return lines


EXTEND_SWEEP = [(128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 8, 3), (128, 64, 4, 3), (128, 64, 4, 4),
                (128, 64, 4, 2), (128, 32, 4, 3), (128, 128, 4, 3), (64, 128, 4, 3), (64, 64, 4, 3), (64, 64, 4, 4)]


def sweep_decode(records: list[dict]) -> list[str]:
    """Try decode launch configs on three shapes; the best three per shape against the default."""
    lines = []
    for batch, ctx in [(1, 32768), (64, 4096), (256, 2048)]:
        prob = DecodeProblem(batch, ctx, with_sdpa=False)
        results = []
        for bn, warps, stages, pps in itertools.product((32, 64, 128), (4, 8), (2, 3, 4), (2, 4, 8)):
            if pps != 4 and batch != 1:
                continue
            cfg = DecodeConfig(block_n=bn, num_warps=warps, num_stages=stages, programs_per_sm=pps)
            try:
                t = bench_graph(functools.partial(prob.ours, cfg))
            except (RuntimeError, OutOfResources) as exc:
                print(f"  decode {cfg} failed: {type(exc).__name__}", file=sys.stderr)
                continue
            results.append((t, cfg))
            records.append({"kind": "sweep-decode", "batch": batch, "ctx": ctx, "cfg": repr(cfg), "ms": t})
        results.sort(key=lambda r: r[0])
        base = bench_graph(prob.ours)
        for t, cfg in results[:3]:
            lines.append(f"decode {batch}x{ctx}: {t * 1e3:.1f} us ({prob.bytes / t / 1e9:.2f} TB/s) {cfg}; "
                         f"default {base * 1e3:.1f} us")
        print("\n".join(lines[-3:]), flush=True)
        del prob
        torch.cuda.empty_cache()
    return lines


def sweep_extend(records: list[dict]) -> list[str]:
    """Try extend tile shapes (block_m, block_n, warps, stages) on every prefill shape; TFLOP/s of each."""
    lines = ["| batch x length | " + " | ".join(f"{bm}x{bn} w{w} s{st}" for bm, bn, w, st in EXTEND_SWEEP) + " |",
             "| --- |" + " ---: |" * len(EXTEND_SWEEP)]
    for batch, length in PREFILL_SHAPES:
        prob = PrefillProblem(batch, length)
        cells = []
        for bm, bn, warps, stages in EXTEND_SWEEP:
            cfg = ExtendConfig(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)
            try:
                t = bench(functools.partial(prob.ours, cfg))
            except (RuntimeError, OutOfResources) as exc:
                print(f"  extend {cfg} failed: {type(exc).__name__}", file=sys.stderr)
                cells.append("-")
                continue
            cells.append(f"{prob.flops / t / 1e9:.0f}")
            records.append({"kind": "sweep-extend", "batch": batch, "length": length, "cfg": repr(cfg), "ms": t})
        lines.append(f"| {batch} x {length} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
        del prob
        torch.cuda.empty_cache()
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", choices=("none", "all", "extend", "multi"), default="none",
                        help="also try launch configs (all: decode, extend and multi-query; extend / multi: that "
                             "kernel only)")
    parser.add_argument("--only", choices=("all", "decode", "prefill", "multi"), default="all",
                        help="which tables to print")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("kernels_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    header = (f"{props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}, triton "
              f"{triton.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
              f"{HQ} q / {HKV} kv heads, d={D}, bf16")
    records: list[dict] = []
    sweep_lines = sweep_decode(records) if args.sweep == "all" else []
    if args.sweep in ("all", "extend"):
        sweep_lines += ["", "extend tile sweep, TFLOP/s:"] + sweep_extend(records)
    if args.sweep in ("all", "multi"):
        sweep_lines += ["", "multi-query launch sweep:"] + sweep_multi_query(records)
    decode_lines = decode_table(records) if args.only in ("all", "decode") else []
    prefill_lines = prefill_table(records) if args.only in ("all", "prefill") else []
    multi_lines = multi_query_table(records) if args.only in ("all", "multi") else []
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"header": header, "records": records}, fh, indent=1)
    print("\n" + header)
    if sweep_lines:
        print("\nconfig sweep:\n" + "\n".join(sweep_lines))
    if decode_lines:
        print("\ndecode attention (bandwidth = K+V bytes / time; CUDA-graph replays, median)\n"
              + "\n".join(decode_lines))
    if prefill_lines:
        print("\nprefill attention (causal, no prefix)\n" + "\n".join(prefill_lines))
    if multi_lines:
        print(f"\nmulti-query decode (k new tokens per row after the context; CUDA-graph replays, median; split "
              f"counts for max_seq_len {GRAPH_CONTEXT})\n" + "\n".join(multi_lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
