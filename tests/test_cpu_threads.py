"""The CPU engine's torch thread count: one per core the process may use, or what `cpu_threads` says."""

from __future__ import annotations

import os

import pytest
import torch

from radixgen import cli
from radixgen.runtime.cpu_threads import apply_cpu_threads, available_cores, default_cpu_threads
from radixgen.runtime.engine_config import EngineConfig


def test_the_default_follows_the_affinity_mask():
    if hasattr(os, "sched_getaffinity"):
        assert available_cores() == len(os.sched_getaffinity(0))
    assert default_cpu_threads() == available_cores() >= 1


def test_apply_sets_torch_and_restores():
    before = torch.get_num_threads()
    try:
        assert apply_cpu_threads(1) == 1 and torch.get_num_threads() == 1
        assert apply_cpu_threads(None) == default_cpu_threads() == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="cpu_threads must be >= 1"):
        apply_cpu_threads(0)


def test_the_option_and_the_flag_are_checked_before_loading(capsys):
    with pytest.raises(ValueError, match="cpu_threads must be >= 1"):
        EngineConfig.from_options(None, cpu_threads=0)
    assert cli.main(["generate", "hi", "--threads", "0", "--model", "/no/such/model.gguf"]) == 1
    assert "--threads" in capsys.readouterr().err
