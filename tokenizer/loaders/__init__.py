"""Readers that turn a tokenizer file into a `TokenizerSpec`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..spec import TokenizerSpec


def load_any(path: Path, pattern: str | None = None, **options: Any) -> TokenizerSpec:
    """Pick the reader by what `path` is: a folder or .json, a .gguf file, or a tiktoken rank file.

    Readers are imported only when used, so reading a tokenizer.json never needs the GGUF stack.
    """
    if path.is_dir() or path.suffix == ".json":
        from .hf_json import load_tokenizer_json

        return load_tokenizer_json(path)
    if path.suffix == ".gguf" or _starts_with(path, b"GGUF"):
        from .gguf_meta import load_gguf

        return load_gguf(path)
    from .tiktoken_ranks import load_tiktoken, looks_like_tiktoken

    if looks_like_tiktoken(path):
        return load_tiktoken(path, pattern=pattern, **options)
    raise ValueError(f"{path}: not a tokenizer.json, GGUF or tiktoken rank file")


def _starts_with(path: Path, magic: bytes) -> bool:
    with path.open("rb") as f:
        return f.read(len(magic)) == magic
