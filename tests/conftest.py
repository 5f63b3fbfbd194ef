"""Shared fixtures and markers: GPU tests skip without CUDA, slow tests skip unless RADIXGEN_SLOW=1.

`default_model_path` is the default model, fetched on first use by the code behind `radixgen download` (its
progress lines reach the terminal), so a fresh checkout runs every model test without a setup step.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests compile grammars into temp engines: keep them out of the user's disk cache (the cache's own tests pass
# theirs explicitly).
os.environ.setdefault("RADIXGEN_GRAMMAR_CACHE", "0")

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
            # First of the item's skip conditions, so that an unselected slow test says so rather than naming
            # another condition of its own (a data file it would read).
            item.add_marker(pytest.mark.skipif(True, reason="slow; set RADIXGEN_SLOW=1"), append=False)


@pytest.fixture(scope="session")
def default_model_path(pytestconfig: pytest.Config) -> Path:
    """The default model (SmolLM2-135M-Instruct GGUF) from the cache, downloaded and verified when missing."""
    from radixgen.runtime.download import cached_model_path, download_model

    path = cached_model_path()
    if path is not None:
        return path
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    if capture is None:
        return download_model()
    with capture.global_and_fixture_disabled():  # the download's progress lines go to the terminal
        return download_model()


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES
