"""What `--model` names, as a local path: a file or folder, or a Hugging Face hub id found in the local HF cache.

Hub ids (`ORG/NAME`) are looked up in the cache only, never downloaded: `$HF_HUB_CACHE`, else `$HF_HOME/hub`,
else `~/.cache/huggingface/hub`, in its layout `models--ORG--NAME/snapshots/<revision>/` (the revision that
`refs/main` names when present, else the newest snapshot). A path that exists always wins over a hub id.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from radixgen.runtime.errors import ModelNotFoundError

# ORG/NAME as the hub spells repository ids: one slash, no leading dot or dash, no path tricks.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def hub_cache_dir() -> Path:
    """The local Hugging Face hub cache, as huggingface_hub resolves it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def is_hub_id(text: str) -> bool:
    return _HUB_ID.fullmatch(text) is not None and ".." not in text


def hub_snapshot(repo_id: str, cache: Path | None = None) -> Path | None:
    """The cached snapshot folder of `repo_id`, or None when the cache does not hold it."""
    repo = (cache or hub_cache_dir()) / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        named = snapshots / ref.read_text(encoding="utf-8").strip()
        if named.is_dir():
            return named
    found = sorted((p for p in snapshots.glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime) \
        if snapshots.is_dir() else []
    return found[-1] if found else None


def local_model_path(model: str, cache: Path | None = None) -> Path:
    """The local file or folder `model` names (a path, or a hub id in the cache); raises ModelNotFoundError."""
    path = Path(model).expanduser()
    if path.exists():
        return path
    if is_hub_id(model):
        snapshot = hub_snapshot(model, cache)
        if snapshot is not None:
            return snapshot
        raise ModelNotFoundError(
            f"{model} is not a local path and not in the Hugging Face cache ({cache or hub_cache_dir()}): hub ids "
            f"are looked up in the local cache only; fetch it first (e.g. `huggingface-cli download {model}`) or "
            f"pass the path of a model folder or .gguf file")
    raise ModelNotFoundError(f"model path {path} does not exist")


def check_tokenizer_source(model: Path, tokenizer_path: str | None) -> None:
    """Refuse, before any weight loads, a model folder that has no tokenizer of its own when none is given."""
    if tokenizer_path is not None:
        if not Path(tokenizer_path).expanduser().exists():
            raise ModelNotFoundError(f"tokenizer path {tokenizer_path} does not exist")
        return
    if model.is_dir() and not (model / "tokenizer.json").is_file() and not any(model.glob("*.gguf")):
        raise ModelNotFoundError(
            f"{model} has no tokenizer.json; pass one with --tokenizer-path (tokenizer_path= in Python): a "
            f"tokenizer.json, a folder holding one, or a .gguf file")
