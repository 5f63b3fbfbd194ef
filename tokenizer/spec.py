"""The one description every loader produces (tokenizer.json, GGUF metadata, tiktoken ranks).

Pipeline stages keep tokenizer.json's schema (`normalizer`, `pre_tokenizer`, `decoder` dicts), which is
already the de-facto interchange format; the GGUF and tiktoken loaders write the equivalent dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .added_tokens import AddedToken
from .bpe import BPEModel


@dataclass
class TokenizerSpec:
    model: BPEModel
    added_tokens: list[AddedToken]
    normalizer: dict | None = None
    pre_tokenizer: dict | None = None
    decoder: dict | None = None
    # ids the post-processor puts around one sequence when add_special_tokens=True
    prefix_ids: list[int] = field(default_factory=list)
    suffix_ids: list[int] = field(default_factory=list)
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    unk_token: str | None = None
    # ids that also end generation (e.g. <|im_end|> and <|endoftext|> for ChatML models)
    extra_eos_ids: list[int] = field(default_factory=list)
    chat_template: str | None = None
    # how to rebuild this tokenizer in a worker process: (path, from_file keyword arguments)
    source: tuple[str, dict] | None = None
