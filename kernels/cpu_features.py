"""Which CPU this is, and the implementation choices that follow from it: the one home of the vendor policy.

MKL takes a slow path on AMD processors (it does not select its fast kernels there), so on an AMD CPU fp32
linears run oneDNN's matmul (`linear_onednn`) and a decode step's attention runs as two matmuls instead of torch's
fused kernel (`attention_torch`); on an Intel CPU both stay on MKL and the fused kernel, the faster ones there
(docs/performance-notes.md has the measurements).
"""

from __future__ import annotations

import functools

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


def mkl_is_slow() -> bool:
    """Whether this is a processor on which MKL takes its slow path (read each call: tests claim vendors)."""
    return cpu_vendor() in AMD_VENDORS


def fp32_linears_on_onednn() -> bool:
    """Whether fp32 linears should run oneDNN's matmul rather than MKL's sgemm: where MKL is slow (the caller
    also checks that this torch build runs the op, `linear_onednn.available`)."""
    return mkl_is_slow()


@functools.lru_cache(maxsize=1)
def decode_attention_as_matmuls() -> bool:
    """Whether a decode step's fp32 attention runs as two matmuls rather than torch's fused kernel: faster where
    MKL is slow, slower elsewhere (docs/kernels.md). Decided once per process."""
    return mkl_is_slow()
