"""tiktoken rank files ("<base64 token> <rank>" per line) -> TokenizerSpec.

The file holds no split pattern and no special tokens, so both come from the caller (by name or literally);
well-known names bring their special tokens along.
"""

from __future__ import annotations

import base64
from pathlib import Path

from ..added_tokens import AddedToken
from ..bpe import BPEModel
from ..byte_level import bytes_to_alphabet
from ..patterns import resolve_pattern
from ..spec import TokenizerSpec

_QWEN_SPECIAL = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
DEFAULT_SPECIAL_TOKENS: dict[str, dict[str, int]] = {
    "gpt2": {"<|endoftext|>": 50256},
    "r50k_base": {"<|endoftext|>": 50256},
    "p50k_base": {"<|endoftext|>": 50256},
    "cl100k_base": {
        "<|endoftext|>": 100257,
        "<|fim_prefix|>": 100258,
        "<|fim_middle|>": 100259,
        "<|fim_suffix|>": 100260,
        "<|endofprompt|>": 100276,
    },
    "o200k_base": {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    "qwen": _QWEN_SPECIAL,
    "qwen2": _QWEN_SPECIAL,
}


def read_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def looks_like_tiktoken(path: Path) -> bool:
    with path.open("rb") as f:
        first = f.readline().split()
    if len(first) != 2 or not first[1].isdigit():
        return False
    try:
        base64.b64decode(first[0], validate=True)
    except ValueError:
        return False
    return True


def load_tiktoken(
    path: Path,
    pattern: str | None = None,
    special_tokens: dict[str, int] | None = None,
    eos_token: str | None = None,
) -> TokenizerSpec:
    """`pattern`: a split-pattern name ("gpt2", "r50k_base", "cl100k_base", "qwen", ...) or a regex."""
    if pattern is None:
        raise ValueError("a tiktoken rank file needs pattern= (a name such as 'cl100k_base', or a regex)")
    if special_tokens is None:
        special_tokens = DEFAULT_SPECIAL_TOKENS.get(pattern, {})
    model = BPEModel.from_ranks(read_ranks(path), bytes_to_alphabet)
    added = [AddedToken(id=tid, content=text, special=True) for text, tid in special_tokens.items()]
    if eos_token is None and "<|endoftext|>" in special_tokens:
        eos_token = "<|endoftext|>"
    return TokenizerSpec(
        model=model,
        added_tokens=added,
        pre_tokenizer={
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": resolve_pattern(pattern)}, "behavior": "Isolated"},
                {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
            ],
        },
        decoder={"type": "ByteLevel"},
        eos_token=eos_token,
    )
