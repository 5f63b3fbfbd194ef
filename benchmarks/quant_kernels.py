"""Quantized matmuls at batch 1 (and a few larger batches): achieved weight bandwidth against the device's copy
bandwidth, for every Llama-3-8B linear shape, bf16 (cuBLAS) against int4 (Triton), FP8 (`torch._scaled_mm` or
the FP8 GEMV), GGUF Q4_K / Q8_0 / Q5_K / Q6_K blocks (Triton's block kernels), and each repacked as a GGUF file's
blocks are on CUDA (runtime/quant/gguf_repack.py): Q4_K as int4 with group minimums, Q5_K as int8 with group
minimums, Q8_0 and Q6_K as int8 with group
scales (`gguf-*-repacked`: the int4 / int8 kernels).

Bandwidth = bytes of the weight (packed data, scales and zeros) / time per matmul. Each timing replays a CUDA
graph of matmuls over enough distinct copies of the weight (>= 256 MiB) that none is served from L2, median of
several replays; "copy" is a device-to-device copy of 1 GiB (read + write bytes / time).

    python benchmarks/quant_kernels.py                    # the table, batch 1
    python benchmarks/quant_kernels.py --rows 1 16 64     # more batch sizes
    python benchmarks/quant_kernels.py --json out.json    # also write every number
    python benchmarks/quant_kernels.py --schemes bf16 gguf-q8_0 gguf-q8_0-repacked --rows 1 4 16 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from radixgen import kernels
from radixgen.kernels import GGUFWeight, LinearWeight, weight_nbytes
from radixgen.kernels.gguf_ref import Q4_K, Q5_K, Q6_K, Q8_0
from radixgen.runtime.quant.gguf_blocks import quantize_blocks
from radixgen.runtime.quant.gguf_repack import repack_blocks
from radixgen.runtime.quant.rtn import quantize_fp8, quantize_int4_rtn

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
GGUF_TYPES = {"gguf-q4_k": Q4_K.code, "gguf-q8_0": Q8_0.code, "gguf-q5_k": Q5_K.code, "gguf-q6_k": Q6_K.code}
SCHEMES = ("bf16", "int4", "fp8", "gguf-q4_k", "gguf-q4_k-repacked", "gguf-q8_0", "gguf-q8_0-repacked", "gguf-q5_k",
           "gguf-q5_k-repacked", "gguf-q6_k", "gguf-q6_k-repacked")
MIN_BYTES = 256 << 20


def make(scheme: str, dense: torch.Tensor) -> LinearWeight:
    if scheme == "bf16":
        return dense.clone()
    if scheme == "int4":
        return quantize_int4_rtn(dense, 128)
    if scheme == "fp8":
        return quantize_fp8(dense)
    code = GGUF_TYPES[scheme.removesuffix("-repacked")]
    blocks = quantize_blocks(dense, code)
    if scheme.endswith("-repacked"):
        return repack_blocks(blocks, code, dense.shape[1])
    return GGUFWeight(blocks, code, dense.shape[1])


def time_graph(fn, replays: int = 7) -> float:
    """Median seconds of one replay of a CUDA graph of `fn`."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(replays):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    return statistics.median(times)


def copy_bandwidth() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / time_graph(lambda: dst.copy_(src))


def bench(scheme: str, n: int, k: int, rows: int) -> dict:
    dense = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    first = make(scheme, dense)
    nbytes = weight_nbytes(first)
    weights = [first] + [make(scheme, dense) for _ in range(max(1, -(-MIN_BYTES // nbytes)) - 1)]
    del dense
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    seconds = time_graph(lambda: [kernels.linear(x, w) for w in weights]) / len(weights)
    return {"scheme": scheme, "n": n, "k": k, "rows": rows, "weight_bytes": nbytes, "us": seconds * 1e6,
            "GB_s": nbytes / seconds / 1e9, "TFLOP_s": 2 * rows * n * k / seconds / 1e12}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1])
    ap.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if kernels.fp8_unsupported_reason(torch.device("cuda")) is not None and "fp8" in args.schemes:
        args.schemes.remove("fp8")
    copy = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {copy / 1e9:,.0f} GB/s (read + write)")
    print("| rows | linear | N x K | scheme | weight MiB | us | GB/s | % of copy | TFLOP/s |")
    print("| ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    results = []
    for rows in args.rows:
        for name, (n, k) in SHAPES.items():
            for scheme in args.schemes:
                r = bench(scheme, n, k, rows)
                results.append(r)
                print(f"| {rows} | {name} | {n} x {k} | {scheme} | {r['weight_bytes'] / 2**20:,.1f} | {r['us']:,.1f} "
                      f"| {r['GB_s']:,.0f} | {100 * r['GB_s'] * 1e9 / copy:.0f}% | {r['TFLOP_s']:.2f} |", flush=True)
                torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_GB_s": copy / 1e9, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
