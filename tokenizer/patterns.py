"""Named pre-tokenization split patterns (the regexes the vocabularies' merges were learned on).

tiktoken rank files and GGUF files carry no split pattern, so it is chosen by name; tokenizer.json files carry
their own. Patterns are compiled with the `regex` module (possessive classes, \\p{..} properties).
"""

from __future__ import annotations

GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

CL100K = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
LLAMA3 = CL100K

QWEN2 = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

O200K = (
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

TEKKEN = (
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
    r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
    r"""|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Names accepted by `Tokenizer.from_file(..., pattern=NAME)` for tiktoken rank files.
SPLIT_PATTERNS: dict[str, str] = {
    "gpt2": GPT2,
    "r50k_base": GPT2,
    "p50k_base": GPT2,
    "cl100k_base": CL100K,
    "llama3": LLAMA3,
    "qwen": QWEN2,
    "qwen2": QWEN2,
    "o200k_base": O200K,
    "tekken": TEKKEN,
}


def resolve_pattern(name_or_regex: str) -> str:
    """A pattern from its name, or the string itself when it is not a known name."""
    return SPLIT_PATTERNS.get(name_or_regex, name_or_regex)
