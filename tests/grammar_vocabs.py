"""Real vocabularies and reference tokenizers for the grammar tests, loaded once per process (lru_cache).

Vocabularies come from our own tokenizer (runtime.constraints.build_vocabulary, as in the engine); GPT-2 ranks
are tokenized with tiktoken, Qwen3 with HF `tokenizers` (the references), SmolLM2 with our tokenizer.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np

from radixgen.grammars import Vocabulary
from radixgen.runtime.constraints import build_vocabulary
from radixgen.tokenizer import Tokenizer as OurTokenizer

TOKENIZERS = Path(__file__).resolve().parent / "fixtures" / "tokenizers"
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

Encode = Callable[[str], list[int]]


@cache
def gpt2(path: Path = TOKENIZERS / "r50k_base.tiktoken") -> tuple[Vocabulary, Encode]:
    import tiktoken

    vocab = build_vocabulary(OurTokenizer.from_file(path, pattern="gpt2"))
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    enc = tiktoken.Encoding("gpt2-test", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256})
    return vocab, enc.encode_ordinary


@cache
def qwen3() -> tuple[Vocabulary, Encode]:
    from tokenizers import Tokenizer

    path = TOKENIZERS / "qwen3" / "tokenizer.json"
    ours = OurTokenizer.from_file(path.parent)
    vocab = build_vocabulary(ours, [ours.token_to_id("<|im_end|>"), ours.token_to_id("<|endoftext|>")])
    tok = Tokenizer.from_file(str(path))
    return vocab, lambda text: tok.encode(text, add_special_tokens=False).ids


@cache
def smollm2() -> tuple[Vocabulary, Encode]:
    tok = OurTokenizer.from_file(TOKENIZERS / "smollm2-135m-instruct.tokenizer.gguf")
    return build_vocabulary(tok), lambda text: tok.encode(text, add_special_tokens=False)


VOCABS = {"gpt2": gpt2, "qwen3": qwen3, "smollm2": smollm2}


def allowed_ids(row: np.ndarray, vocab_size: int) -> np.ndarray:
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits)


def is_allowed(row: np.ndarray, token_id: int) -> bool:
    return bool((int(row[token_id // 32]) >> (token_id % 32)) & 1)
