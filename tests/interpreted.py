"""Run a kernel-cases script under the Triton interpreter in a child process and read its JSON result.

TRITON_INTERPRET must be set before Triton is imported, hence the child. Where CUDA is available the caller's
test is skipped instead: the GPU runs the same cases compiled (and the GPU image's Triton interpreter cannot
run some of them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest


def run_interpreted(args: list[str], skip_reason: str, timeout: int = 600, check_rc: bool = True) -> Any:
    """The last stdout line of `python args...` under TRITON_INTERPRET=1 (no GPU visible), parsed as JSON; the
    test fails with the child's stderr if it prints nothing, or exits non-zero where `check_rc` (a script whose
    exit status reports failing cases leaves them to the caller's per-case asserts)."""
    pytest.importorskip("triton")
    import torch

    if torch.cuda.is_available():
        pytest.skip(skip_reason)
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)
    if (check_rc and proc.returncode != 0) or not proc.stdout.strip():
        pytest.fail(f"interpreter run failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
