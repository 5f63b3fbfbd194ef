"""fp32 linear layers on the CPU: `F.linear` (MKL's sgemm) against oneDNN's matmul, and what `kernels.linear`
picks here (oneDNN on AMD processors, where MKL takes a slow path; MKL elsewhere).

The weights of `--layers` layers of the default model's MLP shape are cycled, so each matmul reads its weight
from memory as in a forward pass (not from cache); rows = tokens in the step (1 for a batch-1 decode step).

    python benchmarks/cpu_matmul.py [--rows 1 20 256] [--layers 60] [--out 3072] [--in 576]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from radixgen import kernels
from radixgen.kernels import cpu_features, linear_onednn


def best_ms(fn, weights: list[torch.Tensor], x: torch.Tensor, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for w in weights:
            fn(x, w)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="*", type=int, default=[1, 20, 256])
    ap.add_argument("--layers", type=int, default=60)
    ap.add_argument("--out", type=int, default=3072)
    ap.add_argument("--in", dest="inp", type=int, default=576)
    args = ap.parse_args()
    weights = [torch.randn(args.out, args.inp) for _ in range(args.layers)]
    print(f"CPU vendor {cpu_features.cpu_vendor() or '?'}; oneDNN fp32 linear runs: {linear_onednn.runs()}, "
          f"kernels.linear uses it: {linear_onednn.available()}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {args.layers} x [{args.out}, {args.inp}] fp32 weights")
    print(f"{'rows':>5} {'F.linear ms':>12} {'oneDNN ms':>10} {'oneDNN x':>9} {'kernels.linear ms':>18}")
    for m in args.rows:
        x = torch.randn(m, args.inp)
        ref = best_ms(F.linear, weights, x)
        onednn = best_ms(linear_onednn.linear_onednn, weights, x) if linear_onednn.runs() else float("nan")
        ours = best_ms(kernels.linear, weights, x)
        print(f"{m:>5} {ref:>12.1f} {onednn:>10.1f} {ref / onednn:>8.2f}x {ours:>18.1f}")


if __name__ == "__main__":
    main()
