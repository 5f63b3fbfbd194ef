"""fp32 linear layers on the CPU through oneDNN's matmul instead of MKL's sgemm.

torch runs an fp32 `F.linear` on the CPU as an MKL sgemm. MKL takes a slow path on AMD processors: on the 2-core
AMD EPYC VM this project is measured on, oneDNN's matmul (the primitive torch's inductor calls through
`torch.ops.mkldnn._linear_pointwise`) runs the model's layers about 2.2x faster, from one row (a decode step) to
hundreds (a prefill). On an Intel Xeon (the H200 host) MKL is the faster one (oneDNN at 0.75-0.92x), so only AMD
processors take this path; docs/benchmarks.md has the numbers. bf16 and fp16 already go through oneDNN. The op is
internal to torch, so it is probed once and `F.linear` stays the fallback.

`pack_weight` stores a weight in oneDNN's blocked layout once (an opaque mkldnn tensor), so the matmul skips
re-laying it out on every call: 1.25-1.35x faster at 1-20 rows (decode steps), ~1.07x at 256.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

AMD_VENDORS = ("AuthenticAMD", "HygonGenuine")  # x86 vendors for which MKL does not select its fast kernels


def cpu_vendor() -> str:
    """The x86 `vendor_id` of /proc/cpuinfo ("" where there is none: another OS or architecture)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether fp32 linears should run oneDNN here: an AMD processor and a torch build whose oneDNN linear runs
    (probed on a tiny input, once per process)."""
    if cpu_vendor() not in AMD_VENDORS:
        return False
    return runs()


@functools.lru_cache(maxsize=1)
def runs() -> bool:
    """Whether this torch build runs oneDNN's fp32 linear at all."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 4), torch.ones(3, 4), None, "none", [], "")
        return tuple(out.shape) == (2, 3) and bool((out == 4).all())
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


PACK_ROWS_HINT = 256  # rows oneDNN chooses the packed layout for; measured as fast as any hint from 1 to 2,048 rows


@functools.lru_cache(maxsize=1)
def packing_runs() -> bool:
    """Whether this torch build packs fp32 linear weights for oneDNN (and its matmul takes them)."""
    if not runs():
        return False
    try:
        w = torch.arange(12.0).view(3, 4)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 4), pack_weight(w), None, "none", [], "")
        return bool(torch.equal(out, torch.ones(2, 4) @ w.T))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def pack_weight(weight: Tensor) -> Tensor:
    """An fp32 weight [N, K] in oneDNN's blocked layout: an opaque mkldnn tensor (`is_mkldnn`) that only
    `linear_onednn` reads; `.to_dense()` gives the plain weight back."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_ROWS_HINT)


def linear_onednn(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [..., K] @ weight[N, K].T (+ bias [N]) -> [..., N], on the CPU, fp32 accumulation; `weight` plain or
    packed by `pack_weight`."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
