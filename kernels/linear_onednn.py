"""fp32 linear layers on the CPU through oneDNN's matmul instead of MKL's sgemm.

torch runs an fp32 `F.linear` on the CPU as an MKL sgemm. On the 2-core AMD EPYC VM this project is measured on,
oneDNN's matmul (the primitive torch's inductor calls through `torch.ops.mkldnn._linear_pointwise`) runs the
model's layers about 2.2x faster, from one row (a decode step) to hundreds (a prefill); docs/benchmarks.md has the
numbers. bf16 and fp16 already go through oneDNN. The op is internal to torch, so it is probed once and
`F.linear` stays the fallback.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether this torch build runs oneDNN's fp32 linear (probed on a tiny input, once per process)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 4), torch.ones(3, 4), None, "none", [], "")
        return tuple(out.shape) == (2, 3) and bool((out == 4).all())
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def linear_onednn(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [..., K] @ weight[N, K].T (+ bias [N]) -> [..., N], on the CPU, fp32 accumulation."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
