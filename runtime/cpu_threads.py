"""How many threads torch's CPU ops use in a CPU engine.

torch's default is one OpenMP thread per core. The engine's own threads (the loop thread, which runs the forward
as the team's first thread, and the caller's, which tokenizes and compiles grammars) need a core too, and on a
machine with few cores a team as wide as the machine makes every parallel region wait for a thread the OS has
parked (docs/performance-notes.md). So a CPU engine leaves one core free: the cores this process may run on, less
one, and at least one. `Engine(cpu_threads=N)` / `--threads N` sets it explicitly.
"""

from __future__ import annotations

import os

import torch


def available_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_cpu_threads(cores: int | None = None) -> int:
    """The cores (default: this process's) less one for the engine's own threads, at least one."""
    return max(1, (available_cores() if cores is None else cores) - 1)


def apply_cpu_threads(requested: int | None) -> int:
    """Set torch's intra-op thread count to `requested` (None: the default above) and return it. The setting is
    the process's: it also applies to torch work outside the engine."""
    threads = default_cpu_threads() if requested is None else requested
    if threads < 1:
        raise ValueError(f"cpu_threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    return threads
