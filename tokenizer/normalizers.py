"""Normalizers from tokenizer.json (`"normalizer": {...}`), compiled to one `str -> str` function.

Supported: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace (string or regex), Strip, Sequence. Hugging Face
applies the normalizer to every stretch of text between added tokens, which is where the caller applies it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from functools import partial

import regex

Normalizer = Callable[[str], str]


def _lowercase(text: str) -> str:
    """Per-character lowercase, as Hugging Face does (Python's `lower` turns a final 'Σ' into 'ς')."""
    if "Σ" in text:
        return "".join([ch.lower() for ch in text])
    return text.lower()


def _prepend(prefix: str, text: str) -> str:
    return prefix + text if text else text


def _strip(left: bool, right: bool, text: str) -> str:
    if left and right:
        return text.strip()
    return text.lstrip() if left else text.rstrip() if right else text


def pattern_of(spec: dict) -> regex.Pattern:
    """The `{"String": s}` or `{"Regex": r}` pattern object tokenizer.json uses, compiled."""
    if "String" in spec:
        return regex.compile(regex.escape(spec["String"]))
    return regex.compile(spec["Regex"])


def _replace(pattern: regex.Pattern, content: str, text: str) -> str:
    return pattern.sub(lambda _m: content, text)


def _compose(steps: list[Normalizer], text: str) -> str:
    for step in steps:
        text = step(text)
    return text


def build_normalizer(spec: dict | None, prepend: bool = True) -> Normalizer | None:
    """Compile a normalizer spec; None when it does nothing. `prepend=False` leaves out `Prepend` steps (the
    normalizer of text that continues a sequence: SentencePiece's prefix space belongs to its start only)."""
    if spec is None:
        return None
    kind = spec["type"]
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return partial(unicodedata.normalize, kind)
    if kind == "Lowercase":
        return _lowercase
    if kind == "Prepend":
        return partial(_prepend, spec["prepend"]) if prepend else None
    if kind == "Replace":
        if "String" in spec["pattern"]:
            old, new = spec["pattern"]["String"], spec["content"]
            return lambda text: text.replace(old, new)
        return partial(_replace, pattern_of(spec["pattern"]), spec["content"])
    if kind == "Strip":
        return partial(_strip, spec.get("strip_left", True), spec.get("strip_right", True))
    if kind == "Sequence":
        steps = [s for s in (build_normalizer(n, prepend) for n in spec["normalizers"]) if s is not None]
        if not steps:
            return None
        return steps[0] if len(steps) == 1 else partial(_compose, steps)
    raise ValueError(f"unsupported normalizer type {kind!r}")
