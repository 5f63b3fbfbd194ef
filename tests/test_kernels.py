"""Every kernel against its torch reference, one case table (radixgen.kernels.verify) for every backend:

- triton-interpret: the Triton kernels on CPU tensors under TRITON_INTERPRET=1, small shapes. The variable must
  be set before Triton is imported, so the whole table runs once in a subprocess that prints JSON results;
  the test process itself never sees the variable.
- triton-cuda: the Triton kernels on the GPU at real sizes (and the small table too), marked `gpu`.
- dispatch-cpu: the public ops on CPU tensors, which must route to the reference.
"""

from __future__ import annotations

import os

import pytest
import torch
from interpreted import run_interpreted

from radixgen.kernels import dispatch, verify

SMALL = verify.cases("small")
REAL = verify.cases("real")


@pytest.fixture(scope="module")
def interpreted() -> dict:
    """Run the small table under the Triton interpreter in a child process; returns case id -> result.

    Skipped where CUDA is available: the GPU runs the same small table compiled (and the real one), and the GPU
    image's Triton 3.6 interpreter cannot run some cases (no bf16 scalar constants, 'get_bf16'; numpy 2.5's
    refusal to turn 1-element arrays into scalars), which Triton 3.9 on the CPU runs."""
    payload = run_interpreted(["-m", "radixgen.kernels.verify", "--size", "small", "--device", "cpu", "--json"],
                              "CUDA present: this table runs compiled in test_triton_cuda_matches_reference",
                              check_rc=False)
    return {case_id: dict(r, seed=payload["seed"]) for case_id, r in payload["results"].items()}


def _assert_ok(case: verify.Case, error: float, tolerance: float, extra: str = "") -> None:
    kind = "mismatching elements" if case.op in verify.EXACT_OPS else "relative error"
    assert error <= tolerance, f"{case.id}: {kind} {error:.3e} > {tolerance:.0e} {extra}"


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.id)
def test_triton_interpret_matches_reference(case: verify.Case, interpreted: dict) -> None:
    result = interpreted[case.id]
    assert "exception" not in result, f"{case.id} raised {result['exception']} (seed {result['seed']})"
    _assert_ok(case, result["error"], result["tolerance"], f"(seed {result['seed']})")


@pytest.mark.gpu
@pytest.mark.parametrize("case", REAL + SMALL, ids=lambda c: f"{'real' if c in REAL else 'small'}-{c.id}")
def test_triton_cuda_matches_reference(case: verify.Case) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    result = verify.run_case(case, verify.triton_impl(case.op), "cuda", seed)
    _assert_ok(case, result.error, result.tolerance, f"(seed {seed})")


@pytest.mark.parametrize("case", [c for c in SMALL if "splits" not in c.params], ids=lambda c: c.id)
def test_dispatch_cpu_matches_reference(case: verify.Case) -> None:
    result = verify.run_case(case, getattr(dispatch, case.op), "cpu", seed=1234)
    _assert_ok(case, result.error, result.tolerance)


def test_dispatch_routes_cpu_tensors_to_reference() -> None:
    assert not dispatch.use_triton(torch.randn(3))


@pytest.mark.gpu
def test_dispatch_routes_cuda_tensors_to_triton_unless_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(3, device="cuda")
    monkeypatch.delenv(dispatch.FORCE_REFERENCE_ENV, raising=False)
    assert dispatch.use_triton(x)
    monkeypatch.setenv(dispatch.FORCE_REFERENCE_ENV, "1")
    assert not dispatch.use_triton(x)


def test_decode_split_count_adapts_to_batch_and_length() -> None:
    decode = pytest.importorskip("radixgen.kernels.decode_attention_triton")
    cfg = decode.DecodeConfig()
    one_long = decode.num_kv_splits(1, 8, 32768, 132, cfg)
    many_short = decode.num_kv_splits(256, 8, 2048, 132, cfg)
    assert one_long >= 32  # 8 programs alone would leave 124 of 132 SMs idle
    assert many_short == 1  # 2048 programs already fill the chip several times
    assert decode.num_kv_splits(1, 8, 300, 132, cfg) == 1  # too short to be worth splitting
    assert decode.num_kv_splits(1, 8, 10**7, 132, cfg) == cfg.max_splits
