"""How many threads torch's CPU ops use in a CPU engine.

A CPU engine runs one torch thread per core this process may run on (its affinity mask: a container's or
`taskset`'s limit, which torch's own default does not read). On a machine that runs other work as well, fewer
threads are faster: every parallel region of a forward waits for its slowest thread, and a thread the OS has
parked for another process stalls them all (docs/performance-notes.md). `Engine(cpu_threads=N)` / `--threads N`
sets the count.
"""

from __future__ import annotations

import os

import torch


def available_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_cpu_threads() -> int:
    """One thread per core this process may run on."""
    return max(1, available_cores())


def apply_cpu_threads(requested: int | None) -> int:
    """Set torch's intra-op thread count to `requested` (None: the default above) and return it. The setting is
    the process's: it also applies to torch work outside the engine."""
    threads = default_cpu_threads() if requested is None else requested
    if threads < 1:
        raise ValueError(f"cpu_threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    return threads
