"""fp32 linear layers on the CPU through oneDNN's matmul instead of MKL's sgemm.

torch runs an fp32 `F.linear` on the CPU as an MKL sgemm. MKL takes a slow path on AMD processors, where
oneDNN's matmul (the primitive torch's inductor calls through `torch.ops.mkldnn._linear_pointwise`) runs the
model's layers faster, from one row (a decode step) to hundreds (a prefill); on Intel processors MKL is the faster
one, so only AMD processors take this path (the vendor policy lives in `cpu_features`; docs/performance-notes.md
has the numbers).
bf16 and fp16 already go through oneDNN. The op is internal to torch, so it is probed once and `F.linear` stays
the fallback.

`pack_weight` stores a weight in oneDNN's blocked layout once (an opaque mkldnn tensor), so the matmul skips
re-laying it out on every call (the gain is largest at the few rows of a decode step).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from radixgen.kernels import cpu_features


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether fp32 linears should run oneDNN here: a processor where MKL is slow (`cpu_features`) and a torch
    build whose oneDNN linear runs (probed on a tiny input, once per process)."""
    if not cpu_features.fp32_linears_on_onednn():
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


PACK_ROWS_HINT = 256  # rows oneDNN chooses the packed layout for (any hint from 1 to 2,048 rows runs as fast)


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
