"""Shared fixtures and markers: GPU tests skip without CUDA, slow tests skip unless RADIXGEN_SLOW=1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from model_fixtures import default_model_path  # noqa: F401  (fixture: the cached default model, else skip)

TESTS_DIR = Path(__file__).resolve().parent
FIXTURES = TESTS_DIR / "fixtures"


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch is a hard dependency
        has_cuda = False
    slow_ok = os.environ.get("RADIXGEN_SLOW") == "1"
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs CUDA"))
        if "slow" in item.keywords and not slow_ok:
            item.add_marker(pytest.mark.skip(reason="slow; set RADIXGEN_SLOW=1"))


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES
