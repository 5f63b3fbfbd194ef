"""The quantized matmuls' case table: each Triton kernel against `quant_linear_reference` on the same weights.

Run as a script under TRITON_INTERPRET=1 (CPU, small shapes) it prints one JSON line, case id -> relative error;
tests/test_quant_kernels.py runs it in a child process (the variable must be set before Triton imports) and runs
the same table on CUDA.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from radixgen.kernels import (
    Fp8Weight,
    GGUFWeight,
    Int4Weight,
    Int8Weight,
    QuantizedWeight,
    dequantize_weight,
    pack_int4,
    pack_int8,
    quant_linear_reference,
)
from radixgen.kernels.gguf_ref import Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0
from radixgen.kernels.quant_ref import quantize_fp8_per_token
from radixgen.runtime.quant.gguf_blocks import QUANTIZABLE_TYPES, quantize_blocks
from radixgen.runtime.quant.rtn import quantize_fp8

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
FP8_QUANT_TOLERANCE = {"cpu": 0.2, "cuda": 0.02}


@dataclass(frozen=True)
class Case:
    kind: str  # "int4" (zero points), "int4-mins" (group minimums), "int8" (group scales only: fp16 at group
    # 32 as Q8_0 repacked, fp32 at group 16 as Q6_K), a GGUF type name, "fp8" (the FP8 GEMV's
    # tiles for the rows), "fp8-mma" (its tensor-core tiles at any row count), "fp8-wo" (one row, weight-only:
    # x as it is) or "fp8-wide" (the same with the one-row tiles for many channels over a short K)
    rows: int  # M
    n: int
    k: int
    group: int = 128
    act_order: bool = False
    dtype: str = "float32"
    bias: bool = False

    @property
    def id(self) -> str:
        extra = f"-g{self.group}{'-act' if self.act_order else ''}" if self.kind.startswith("int") else ""
        return f"{self.kind}{extra}-m{self.rows}-{self.n}x{self.k}{'-bias' if self.bias else ''}-{self.dtype}"


def cases(size: str) -> list[Case]:
    if size == "small":
        out = [Case("int4", m, 48, 256, g, act, dt) for m in (1, 3, 20, 130) for g in (32, 64, 128)
               for act in (False, True) for dt in ("float32",) if not (act and m == 130)]
        out += [Case("int4", m, 40, 256, 64, True, "float16") for m in (1, 17)]
        # K split among programs at every row count (the last slice of a tile adds the partial sums)
        out += [Case(kind, m, 72, 2048, 32) for kind in ("int4", "int4-mins") for m in (1, 3, 20)]
        # int8: one group per tensor-core step (32) or two (16), the GEMV's ragged last step and a step of one
        # group 16 where K is no multiple of 32 (272), split-K (2048), the dense path (130 rows), bias, fp16
        out += [Case("int8", m, 48, 256, g) for m in (1, 2, 3, 20, 130) for g in (16, 32)]
        out += [Case("int8", m, 40, 272, 16) for m in (1, 5, 17)]
        out += [Case("int8", m, 72, 2048, g) for m in (1, 3, 20) for g in (16, 32)]
        out += [Case("int8", m, 72, 1024, g, dtype="float16", bias=True) for m in (1, 4, 17) for g in (16, 32)]
        out += [Case(t.name, m, 40, 512) for t in (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K) for m in (1, 5, 17)]
        # FP8 GEMV: a partial channel tile and a ragged (masked) last step (K = 256, 1200, 300), K split among
        # programs (2048), the tensor-core tiles at 1 row too, a bias, half-precision outputs
        out += [Case("fp8", m, 40, k) for m in (1, 3, 15) for k in (256, 2048)]
        out += [Case("fp8", 1, 40, 1200), Case("fp8", 1, 24, 8192), Case("fp8", 5, 72, 300),
                Case("fp8-mma", 1, 40, 2048)]
        out += [Case("fp8", m, 72, 1024, dtype=dt, bias=True) for m in (1, 4) for dt in ("float16", "bfloat16")]
        out += [Case("fp8-wo", 1, n, k) for n, k in ((40, 256), (40, 1200), (24, 8192))]
        out += [Case("fp8-wide", 1, n, k) for n, k in ((40, 1024), (24, 4096), (40, 300))]
        out += [Case("fp8-wo", 1, 72, 1024, dtype=dt, bias=True) for dt in ("float16", "bfloat16")]
        return out
    shapes = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))
    out = [Case("int4", m, n, k, 128, act, "bfloat16") for m in (1, 16, 64, 256) for n, k in shapes
           for act in (False, True) if not act or m == 1]
    out += [Case("int4-mins", m, n, k, 32, False, "bfloat16") for m in (1, 4, 16, 64) for n, k in shapes]
    out += [Case("int8", m, n, k, g, dtype="bfloat16") for g in (32, 16) for m in (1, 4, 16, 64, 256)
            for n, k in shapes]
    out += [Case("int8", m, 6144, 4096, 32, dtype="bfloat16", bias=True) for m in (1, 4)]
    out += [Case(t.name, m, n, k, dtype="bfloat16") for t in (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K) for m in (1, 16, 256)
            for n, k in shapes[:2]]
    out += [Case("fp8", m, n, k, dtype="bfloat16") for m in (1, 4, 15) for n, k in shapes]
    out += [Case("fp8-mma", 1, n, k, dtype="bfloat16") for n, k in shapes]
    out += [Case("fp8-wo", 1, n, k, dtype="bfloat16") for n, k in shapes]
    out += [Case("fp8", m, 6144, 4096, dtype="bfloat16", bias=True) for m in (1, 4)]
    return out


def fp8_quant_error(rows: int, k: int, device: torch.device, seed: int) -> float:
    """Share of e4m3 values of the Triton per-token FP8 quantization that differ from the reference's, plus the
    largest relative difference of the scales. (The interpreter's e4m3 emulation halves some values that round
    up into the next binade, so the CPU bound is looser than the GPU's, where the conversion is the hardware's.)"""
    from radixgen.kernels.fp8_quant_triton import quantize_fp8_per_token_triton
    from radixgen.kernels.quant_ref import quantize_fp8_per_token

    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, k, generator=gen) * torch.logspace(-2, 2, rows)[:, None]).to(device=device,
                                                                                      dtype=torch.bfloat16)
    xq, xs = quantize_fp8_per_token_triton(x)
    rq, rs = quantize_fp8_per_token(x)
    differ = (xq.float() != rq.float()).double().mean().item()
    return differ + ((xs - rs).abs() / rs).max().item()


def make_weight(case: Case, device: torch.device, gen: torch.Generator) -> QuantizedWeight:
    if case.kind.startswith("fp8"):
        return quantize_fp8((torch.randn(case.n, case.k, generator=gen) * 0.05).to(device))
    if case.kind == "int4":
        q = torch.randint(0, 16, (case.k, case.n), generator=gen)
        groups = case.k // case.group
        scales = (torch.rand(groups, case.n, generator=gen) * 0.02 + 0.001).half()
        zeros = torch.randint(0, 16, (groups, case.n), generator=gen).half()
        perm = torch.randperm(case.k, generator=gen).to(device) if case.act_order else None
        return Int4Weight(pack_int4(q).to(device), scales.to(device), zeros.to(device), case.group, perm)
    if case.kind == "int4-mins":  # GGUF's Q4_K repacked: fp32 scales and minimums
        q = torch.randint(0, 16, (case.k, case.n), generator=gen)
        groups = case.k // case.group
        scales = torch.rand(groups, case.n, generator=gen) * 0.02 + 0.001
        mins = torch.rand(groups, case.n, generator=gen) * 0.1
        return Int4Weight(pack_int4(q).to(device), scales.to(device), None, case.group, mins=mins.to(device))
    if case.kind == "int8":  # GGUF's Q8_0 (fp16 scales, group 32) or Q6_K (fp32, group 16) repacked
        q = torch.randint(-128, 128, (case.k, case.n), generator=gen)
        scales = torch.rand(case.k // case.group, case.n, generator=gen) * 0.002 + 0.0001
        scales = scales if case.group == 16 else scales.half()
        return Int8Weight(pack_int8(q).to(device), scales.to(device), case.group)
    fmt = {f.name: f for f in (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)}[case.kind]
    dense = torch.randn(case.n, case.k, generator=gen) * 0.05
    if fmt.code in QUANTIZABLE_TYPES:
        blocks = quantize_blocks(dense, fmt.code)
    else:
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        raw = quantize(dense.numpy(), GGMLQuantizationType(fmt.code))
        blocks = torch.from_numpy(np.ascontiguousarray(raw)).reshape(case.n, -1)
    return GGUFWeight(blocks.to(device), fmt.code, case.k)


def _fp8_gemv(case: Case) -> Callable[[Tensor, QuantizedWeight, Tensor | None], Tensor]:
    """The FP8 GEMV on x quantized by the reference (the interpreter's e4m3 rounding is not the hardware's, see
    `fp8_quant_error`; on CUDA the Triton quantization is tested by that function and the linear tests)."""
    from radixgen.kernels.fp8_gemv_triton import GEMV1_WIDE_TILES, GEMV_MMA_TILES, fp8_gemv_triton

    def gemv(x: Tensor, w: QuantizedWeight, bias: Tensor | None) -> Tensor:
        assert isinstance(w, Fp8Weight)
        if case.kind in ("fp8-wo", "fp8-wide"):
            return fp8_gemv_triton(x, None, w, bias, x.dtype, GEMV1_WIDE_TILES if case.kind == "fp8-wide" else None)
        xq, xs = quantize_fp8_per_token(x)
        return fp8_gemv_triton(xq, xs, w, bias, x.dtype, GEMV_MMA_TILES if case.kind == "fp8-mma" else None)

    return gemv


def run_case(case: Case, device: torch.device, seed: int) -> float:
    """Relative error of the Triton matmul against the reference on fp32 copies of the same inputs."""
    from radixgen.kernels.dequant_matmul_triton import dequant_matmul_triton

    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, case.dtype)
    w = make_weight(case, device, gen)
    x = torch.randn(case.rows, case.k, generator=gen)
    if case.kind.startswith("fp8"):  # rows of different sizes: each has its own scale
        x = x * torch.logspace(-1, 1, case.rows)[:, None]
    x = x.to(device=device, dtype=dtype)
    bias = torch.randn(case.n, generator=gen).to(device=device, dtype=dtype) if case.bias else None
    matmul = _fp8_gemv(case) if case.kind.startswith("fp8") else dequant_matmul_triton
    out = matmul(x, w, bias)
    if not torch.equal(out, matmul(x, w, bias)):  # a second call: the split-K counters were reset
        return float("inf")
    ref_bias = None if bias is None else bias.float()
    if case.kind in ("fp8-wo", "fp8-wide"):  # weight-only: dequantize, then multiply
        ref = torch.nn.functional.linear(x.float(), dequantize_weight(w), ref_bias).double()
    else:
        ref = quant_linear_reference(x.float(), w, ref_bias).double()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    return err if bool(out.isfinite().all()) else float("inf")


def main() -> int:
    size = sys.argv[1] if len(sys.argv) > 1 else "small"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results: dict[str, dict[str, float | str]] = {}
    for case in cases(size):
        try:
            error = run_case(case, device, seed=1234)
            results[case.id] = {"error": error, "tolerance": TOLERANCE[getattr(torch, case.dtype)]}
        except Exception as e:  # reported per case by the test
            results[case.id] = {"exception": f"{type(e).__name__}: {e}"}
    for rows, k in ((1, 4096), (7, 300), (64, 14336)) if size == "real" else ((1, 64), (5, 300)):
        key = f"fp8-per-token-{rows}x{k}"
        try:
            results[key] = {"error": fp8_quant_error(rows, k, device, seed=1234),
                            "tolerance": FP8_QUANT_TOLERANCE[device.type]}
        except Exception as e:
            results[key] = {"exception": f"{type(e).__name__}: {e}"}
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
