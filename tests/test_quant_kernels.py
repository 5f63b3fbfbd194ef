"""The quantized matmuls: Triton kernels against their torch reference twin (tests/quant_kernel_cases.py), the
FP8 path against its reference on CUDA, the reference against plain dequantize-then-matmul, and the dispatch.

Under TRITON_INTERPRET=1 the small table runs on the CPU in a child process; on CUDA it runs compiled, with the
real (Llama-3-8B) shapes too.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from interpreted import run_interpreted
from quant_kernel_cases import TOLERANCE, Case, cases, make_weight, run_case

from radixgen import kernels
from radixgen.kernels import (
    Fp8Weight,
    Int8Weight,
    StackedWeight,
    dequantize_weight,
    pack_int8,
    quant_linear_reference,
    unpack_int8,
)
from radixgen.runtime.quant.rtn import quantize_fp8, quantize_int4_rtn

SMALL = cases("small")
CASES_SCRIPT = Path(__file__).with_name("quant_kernel_cases.py")


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted([str(CASES_SCRIPT), "small"],
                           "CUDA present: the table runs compiled in test_triton_cuda_matches_reference", timeout=900)


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.id)
def test_triton_interpret_matches_reference(case: Case, interpreted: dict) -> None:
    result = interpreted[case.id]
    assert "exception" not in result, f"{case.id} raised {result['exception']}"
    assert result["error"] <= result["tolerance"], f"{case.id}: relative error {result['error']:.3e}"


@pytest.mark.parametrize("shape", [(1, 64), (5, 300)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_triton_interpret_fp8_per_token_matches_reference(shape: tuple[int, int], interpreted: dict) -> None:
    result = interpreted[f"fp8-per-token-{shape[0]}x{shape[1]}"]
    assert "exception" not in result, result["exception"]
    assert result["error"] <= result["tolerance"]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 4096), (7, 300), (64, 14336)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_triton_cuda_fp8_per_token_matches_reference(shape: tuple[int, int]) -> None:
    from quant_kernel_cases import FP8_QUANT_TOLERANCE, fp8_quant_error

    seed = int.from_bytes(os.urandom(4), "little")
    assert fp8_quant_error(*shape, torch.device("cuda"), seed) <= FP8_QUANT_TOLERANCE["cuda"], f"seed {seed}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", cases("real") + SMALL, ids=lambda c: c.id)
def test_triton_cuda_matches_reference(case: Case) -> None:
    if case.kind.startswith("fp8") and kernels.fp8_unsupported_reason(torch.device("cuda")) is not None:
        pytest.skip("this GPU has no FP8 conversions")
    seed = int.from_bytes(os.urandom(4), "little")
    err = run_case(case, torch.device("cuda"), seed)
    # fp32 inputs go through tl.dot as TF32 on the GPU (10-bit mantissa): its rounding, not the interpreter's
    tolerance = 2e-3 if case.dtype == "float32" else TOLERANCE[getattr(torch, case.dtype)]
    assert err <= tolerance, f"{case.id}: relative error {err:.3e} (seed {seed})"


def test_fp8_gemv_cases_split_k_and_cover_both_kernels() -> None:
    """The small table reaches the one-row and the tensor-core kernels, each with K split among programs (the
    interpreter's device counts 4 SMs)."""
    pytest.importorskip("triton")
    from radixgen.kernels.fp8_gemv_triton import GEMV1_WIDE_TILES, GEMV_MMA_TILES, gemv_tiles, split_k

    seen = set()
    for case in SMALL:
        if case.kind.startswith("fp8"):
            tiles = {"fp8-mma": GEMV_MMA_TILES, "fp8-wide": GEMV1_WIDE_TILES}.get(case.kind) or gemv_tiles(
                case.rows, case.n, case.k)
            splits, _ = split_k(-(-case.n // tiles.block_n), case.k, tiles, num_sms=4)
            seen.add((tiles.kind, splits > 1))
    assert seen == {("fma", False), ("fma", True), ("mma", False), ("mma", True)}


def test_fp8_dispatch_takes_any_shape_for_few_rows() -> None:
    """The GEMV takes N and K of any size; `_scaled_mm` (16 rows or more) only multiples of 16, else the
    reference runs."""
    pytest.importorskip("triton")
    from radixgen.kernels.quant_fp8 import GEMV_ROWS_BELOW, fp8_cuda_runs

    odd, even = quantize_fp8(torch.randn(40, 300)), quantize_fp8(torch.randn(48, 320))
    assert fp8_cuda_runs(1, odd) and fp8_cuda_runs(GEMV_ROWS_BELOW - 1, odd)
    assert not fp8_cuda_runs(GEMV_ROWS_BELOW, odd) and fp8_cuda_runs(GEMV_ROWS_BELOW, even)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_reference_is_dequantize_then_matmul(group: int) -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(24, 256, generator=gen)
    q = quantize_int4_rtn(w, group)
    assert q.shape == (24, 256) and q.qweight.dtype == torch.int32 and q.scales.shape == (256 // group, 24)
    dense = dequantize_weight(q)
    # round-to-nearest: every element within half a step of its group's scale
    step = q.scales.float().repeat_interleave(group, 0).t()
    assert bool(((dense - w).abs() <= 0.5 * step + 1e-6).all())
    x = torch.randn(3, 256, generator=gen)
    torch.testing.assert_close(kernels.linear(x, q), F.linear(x, dense))


def test_int8_packs_signed_bytes_along_k_and_its_reference_is_dequantize_then_matmul() -> None:
    """Byte k % 4 of word [k // 4, n] is q[k, n] (two's complement, every value of -128..127); the reference
    multiplies by each group's scale."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-128, 128, (64, 5), generator=gen)
    q[:, 0] = torch.arange(-128, 128, 4)  # the extremes and every residue of k % 4
    words = pack_int8(q)
    assert words.dtype == torch.int32 and words.shape == (16, 5)
    assert torch.equal(unpack_int8(words), q)
    assert torch.equal((words[3, 1] >> 16) & 0xFF, q[14, 1] & 0xFF)
    scales = torch.rand(4, 5, generator=gen).half()
    w = Int8Weight(words, scales, 16)
    assert w.shape == (5, 64) and w.nbytes() == 16 * 5 * 4 + 4 * 5 * 2
    dense = dequantize_weight(w)
    assert torch.equal(dense, (q.float() * scales.float().repeat_interleave(16, 0)).t())
    x = torch.randn(3, 64, generator=gen)
    torch.testing.assert_close(kernels.linear(x, w), F.linear(x, dense))
    with pytest.raises(ValueError, match="group size"):
        Int8Weight(words, scales, 8)


# the packed-integer kernels at their launch settings: (id, kernel, constexprs, scales dtype, PTX it must hold)
_INT_KERNELS = [
    ("gemv-int4-zeros-g128", "_int_gemv1_kernel",
     {"FORMAT": 1000, "GROUP": 128, "BITS": 4, "BLOCK_N": 32, "BLOCK_K": 512, "HAS_BIAS": False}, "fp16",
     ("ld.global.v4",)),
    ("gemv-int8-g32", "_int_gemv1_kernel",
     {"FORMAT": 1002, "GROUP": 32, "BITS": 8, "BLOCK_N": 32, "BLOCK_K": 256, "HAS_BIAS": True}, "fp16",
     ("ld.global.v4",)),
    ("gemv-int8-g16", "_int_gemv1_kernel",
     {"FORMAT": 1002, "GROUP": 16, "BITS": 8, "BLOCK_N": 32, "BLOCK_K": 256, "HAS_BIAS": False}, "fp32",
     ("ld.global.v4",)),
    ("dequant-int8-g16", "_dequant_kernel",
     {"FORMAT": 1002, "GROUP": 16, "BITS": 8, "BLOCK_N": 64, "BLOCK_K": 32}, "fp32", ("ld.global.v4",)),
] + [(f"tiles-int8-g{g}-m{m}", "_dequant_matmul_kernel",
      {"FORMAT": 1002, "GROUP": g, "BITS": 8, "BLOCK_M": m, "BLOCK_N": 64 if m >= 16 else 32, "BLOCK_K": 32,
       "HAS_BIAS": False}, "fp16" if g == 32 else "fp32", ("mma",) if m >= 16 else ())
     for g in (32, 16) for m in (2, 16, 64)] + [
    ("tiles-int4-mins-g32-m16", "_dequant_matmul_kernel",
     {"FORMAT": 1001, "GROUP": 32, "BITS": 4, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 32, "HAS_BIAS": False},
     "fp32", ("mma",))]


@pytest.mark.parametrize(("name", "kernel", "constexprs", "scales", "needs"), _INT_KERNELS,
                         ids=[k[0] for k in _INT_KERNELS])
def test_integer_kernels_compile_for_h200(name: str, kernel: str, constexprs: dict, scales: str,
                                          needs: tuple[str, ...]) -> None:
    """Compiled for sm_90 on the CPU (the interpreter accepts code the compiler rejects): every step's words load
    16 bytes per thread, 16 rows and more run on tensor cores, and no value goes through an int-to-float
    conversion."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from radixgen.kernels import dequant_matmul_triton

    fn = getattr(dequant_matmul_triton, kernel)
    pointers = {"x": "bf16", "w0": "i32", "qweight": "i32", "w1": scales, "scales": scales, "w2": scales,
                "offsets": scales, "out": "bf16", "partial": "fp32", "locks": "i32", "bias": "bf16"}
    signature: dict[str, str] = {}
    attrs: dict[tuple[int, ...], list[list[object]]] = {}
    for i, arg in enumerate(fn.arg_names):
        signature[arg] = "constexpr" if arg in constexprs else "*" + pointers[arg] if arg in pointers else "i32"
        if arg in pointers or arg in ("N", "K", "stride_xm", "K_PER_SPLIT"):  # as specialized at launch
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=fn, signature=signature, attrs=attrs,
                       constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    for instruction in needs:
        assert instruction in ptx, f"{name}: no {instruction} in the sm_90 PTX"
    assert "cvt.rn.f32.s32" not in ptx, name


def test_fp8_reference_quantizes_activations_per_token() -> None:
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(32, 64, generator=gen), torch.randn(5, 64, generator=gen)
    x[2] *= 100.0  # one loud row must not cost the others their precision
    q = quantize_fp8(w)
    assert q.weight.dtype == torch.float8_e4m3fn and q.scale.shape == (32,)
    out = kernels.linear(x, q)
    ref = F.linear(x, w)
    rel = (out - ref).norm(dim=1) / ref.norm(dim=1)
    assert bool((rel < 0.08).all()), rel


def test_stacked_weight_concatenates_its_parts() -> None:
    gen = torch.Generator().manual_seed(0)
    a = make_weight(Case("Q4_K", 1, 16, 256), torch.device("cpu"), gen)
    b = make_weight(Case("Q6_K", 1, 8, 256), torch.device("cpu"), gen)
    x, bias = torch.randn(2, 256, generator=gen), torch.randn(24, generator=gen)
    out = kernels.linear(x, StackedWeight((a, b)), bias)
    want = F.linear(x, torch.cat([dequantize_weight(a), dequantize_weight(b)]), bias)
    torch.testing.assert_close(out, want)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4, 7, 15, 16, 64, 300])
@pytest.mark.parametrize("shape", [(512, 1024), (40, 300)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_fp8_linear_matches_reference_on_cuda(rows: int, shape: tuple[int, int]) -> None:
    """Through `kernels.linear` as the model calls it: one row weight-only through the GEMV, else the Triton
    quantization, then the GEMV (fewer than 16 rows), `_scaled_mm` or, for a shape it cannot take, the reference;
    with a bias and a leading batch dim."""
    if kernels.fp8_unsupported_reason(torch.device("cuda")) is not None:
        pytest.skip("this GPU has no FP8 tensor cores")
    gen = torch.Generator(device="cuda").manual_seed(0)
    n, k = shape
    w = torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.05
    x = torch.randn(1, rows, k, device="cuda", generator=gen, dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", generator=gen, dtype=torch.bfloat16)
    q = quantize_fp8(w)
    for b in (None, bias):
        out = kernels.linear(x, q, b).float()
        assert out.shape == (1, rows, n)
        ref_bias = None if b is None else b.float()
        ref = (F.linear(x.float(), dequantize_weight(q), ref_bias) if rows == 1
               else quant_linear_reference(x.float(), q, ref_bias))
        assert ((out - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.gpu
def test_quantized_linears_capture_in_a_cuda_graph() -> None:
    """No host syncs or data-dependent allocations inside: the graph replays the eager result (int4, FP8, GGUF
    blocks, int8 at groups 32 and 16)."""
    if kernels.fp8_unsupported_reason(torch.device("cuda")) is not None:
        pytest.skip("this GPU has no FP8 tensor cores")
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(1024, 512, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.05
    cases = (Case("Q4_K", 1, 1024, 512), Case("int8", 1, 1024, 512, 32), Case("int8", 1, 1024, 512, 16))
    weights = [quantize_int4_rtn(w, 128), quantize_fp8(w)] + [
        make_weight(c, torch.device("cuda"), torch.Generator().manual_seed(1)) for c in cases]
    for weight, rows in itertools.product(weights, (1, 4)):  # the one-row GEMVs, the tiled kernels
        x = torch.randn(rows, 512, device="cuda", generator=gen, dtype=torch.bfloat16)
        eager = kernels.linear(x, weight)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            kernels.linear(x, weight)  # warm-up (compiles) outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = kernels.linear(x, weight)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, eager)


def test_dispatch_sends_cpu_quantized_weights_to_the_reference() -> None:
    w = quantize_fp8(torch.randn(8, 16))
    assert isinstance(w, Fp8Weight)
    x = torch.randn(2, 16)
    assert torch.equal(kernels.linear(x, w), quant_linear_reference(x, w))
