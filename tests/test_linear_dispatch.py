"""`kernels.linear`: oneDNN's matmul for fp32 on an AMD CPU (when torch has it), `F.linear` otherwise; same results."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixgen import kernels
from radixgen.kernels import cpu_features, linear_onednn

CASES = [
    # (input shape, out features, bias, strided input)
    ((1, 64), 96, False, False),  # one decode row
    ((20, 576), 960, True, False),
    ((300, 128), 48, False, True),  # a prefill chunk read out of a wider buffer
    ((2, 5, 64), 32, True, False),  # leading batch dims
]


@pytest.mark.parametrize("impl", ["dispatch", "onednn", "packed"])
@pytest.mark.parametrize("shape,n,bias,strided", CASES)
def test_fp32_linear_matches_f_linear(shape, n, bias, strided, impl):
    """`kernels.linear` (whatever it picks on this CPU) and the oneDNN path itself (wherever it runs)."""
    if impl == "onednn" and not linear_onednn.runs():
        pytest.skip("this torch build has no oneDNN fp32 linear")
    if impl == "packed" and not linear_onednn.packing_runs():
        pytest.skip("this torch build does not pack oneDNN linear weights")
    linear = kernels.linear if impl != "onednn" else linear_onednn.linear_onednn
    g = torch.Generator().manual_seed(sum(shape) + n)
    k = shape[-1]
    x = torch.randn(*shape[:-1], 2 * k if strided else k, generator=g)[..., :k]
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    got = linear(x, linear_onednn.pack_weight(w) if impl == "packed" else w, b)  # packed: dispatch must see it
    assert got.dtype == torch.float32 and got.shape == (*shape[:-1], n)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


def test_fp32_cpu_takes_onednn_when_available(monkeypatch):
    calls = []
    monkeypatch.setattr(linear_onednn, "linear_onednn", lambda *a: calls.append(a) or F.linear(*a))
    x, w = torch.randn(3, 8), torch.randn(4, 8)
    kernels.linear(x, w)
    kernels.linear(x.bfloat16(), w.bfloat16())  # bf16 already runs oneDNN through F.linear
    assert len(calls) == (1 if linear_onednn.available() else 0)
    monkeypatch.setenv("RADIXGEN_FORCE_REFERENCE", "1")
    assert torch.equal(kernels.linear(x, w), F.linear(x, w))
    assert len(calls) == (1 if linear_onednn.available() else 0)


@pytest.mark.parametrize("vendor,expected", [("AuthenticAMD", True), ("GenuineIntel", False), ("", False)])
def test_onednn_only_where_mkl_is_slow(vendor, expected, monkeypatch):
    monkeypatch.setattr(cpu_features, "cpu_vendor", lambda: vendor)
    linear_onednn.available.cache_clear()
    try:
        assert linear_onednn.available() == (expected and linear_onednn.runs())
    finally:
        linear_onednn.available.cache_clear()


def test_packed_weight_holds_the_same_values():
    if not linear_onednn.packing_runs():
        pytest.skip("this torch build does not pack oneDNN linear weights")
    w = torch.randn(48, 40)
    packed = linear_onednn.pack_weight(w)
    assert packed.is_mkldnn and tuple(packed.shape) == (48, 40) and torch.equal(packed.to_dense(), w)


@pytest.mark.parametrize("dtype,device,vendor,force,expected", [
    (torch.float32, "cpu", "AuthenticAMD", None, True),
    (torch.float32, "cpu", "AuthenticAMD", "1", False),  # RADIXGEN_FORCE_REFERENCE=1: F.linear, plain weights
    (torch.float32, "cpu", "GenuineIntel", None, False),  # MKL is the fast one there
    (torch.bfloat16, "cpu", "AuthenticAMD", None, False),
    (torch.float32, "cuda", "AuthenticAMD", None, False),
])
def test_weights_are_packed_only_where_onednn_runs_the_linears(dtype, device, vendor, force, expected, monkeypatch):
    monkeypatch.setattr(cpu_features, "cpu_vendor", lambda: vendor)
    if force:
        monkeypatch.setenv("RADIXGEN_FORCE_REFERENCE", force)
    else:
        monkeypatch.delenv("RADIXGEN_FORCE_REFERENCE", raising=False)
    linear_onednn.available.cache_clear()
    try:
        packer = kernels.linear_weight_packer(dtype, torch.device(device))
        assert (packer is linear_onednn.pack_weight) == (expected and linear_onednn.packing_runs())
    finally:
        linear_onednn.available.cache_clear()
