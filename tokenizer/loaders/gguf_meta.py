"""A GGUF file's tokenizer metadata (llama.cpp's `tokenizer.ggml.*` keys) -> TokenizerSpec.

`tokenizer.ggml.model` says which family: "gpt2" is byte-level BPE (tokens, merges, a pre-tokenizer named by
`tokenizer.ggml.pre`), "llama" is SentencePiece-style BPE with byte fallback (merges given, or recovered from
the token scores). `token_type` marks control tokens (3, special) and user-defined ones (4, added, not special).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from radixgen.tokenizer.loaders.gguf_reader import read_gguf

from ..added_tokens import AddedToken
from ..bpe import BPEModel, merge_pair
from ..byte_level import BYTE_TO_CHAR, bytes_to_alphabet
from ..patterns import CL100K, O200K, QWEN2, TEKKEN
from ..spec import TokenizerSpec

UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4

_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}
_GPT2_REGEX = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}


def _split_then_bytes(pattern: str) -> dict:
    split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated"}
    return {"type": "Sequence", "pretokenizers": [split, _BYTE_LEVEL]}


# llama.cpp pre-tokenizer names -> the pre-tokenizer of the model's own tokenizer.json
GGUF_PRE_TOKENIZERS: dict[str, dict] = {
    **dict.fromkeys(
        ["llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe", "pixtral"],
        _split_then_bytes(CL100K),
    ),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "megrez"], _split_then_bytes(QWEN2)),
    **dict.fromkeys(["gpt-4o", "llama4", "minimax-m2"], _split_then_bytes(O200K)),
    "tekken": _split_then_bytes(TEKKEN),
    # SmolLM's tokenizer.json: every digit on its own, then GPT-2's split
    "smollm": {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, _GPT2_REGEX],
    },
}


def read_gguf_metadata(path: Path) -> dict[str, Any]:
    """The `tokenizer.*` and `general.architecture` keys as Python values."""
    wanted = lambda key: key.startswith("tokenizer.") or key == "general.architecture"
    meta = read_gguf(path, decode_arrays=wanted).metadata
    return {k: v for k, v in meta.items() if wanted(k)}


def _scored_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Merges a SentencePiece vocabulary implies, in the order transformers' converter writes them.

    Every split of a token into two tokens is a merge; merges sort by the merged token's score, then by the
    lengths of the left and right parts (all descending), ties kept in id order (token, then left, right).
    """
    vocab = {t: i for i, t in enumerate(tokens)}
    merges: list[tuple[float, int, int, int, int, int, str, str]] = []
    for merged_id, (token, score) in enumerate(zip(tokens, scores)):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                merges.append(
                    (-score, -len(left), -len(right), merged_id, vocab[left], vocab[right], left, right)
                )
    merges.sort()
    return [(m[6], m[7]) for m in merges]


def load_gguf(path: Path) -> TokenizerSpec:
    meta = read_gguf_metadata(path)
    kind = meta.get("tokenizer.ggml.model")
    normalizer: dict | None = None
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges_raw = meta.get("tokenizer.ggml.merges")

    def token_at(key: str) -> str | None:
        tid = meta.get(f"tokenizer.ggml.{key}")
        return tokens[tid] if tid is not None and 0 <= tid < len(tokens) else None

    if kind == "gpt2":
        alphabet = set(BYTE_TO_CHAR)
        if alphabet.issuperset("".join(tokens)):  # the rule: every token is spelled in the byte alphabet already
            spelled = tokens
        else:
            spelled = [t if alphabet.issuperset(t) else bytes_to_alphabet(t.encode("utf-8")) for t in tokens]
        vocab = {t: i for i, t in enumerate(spelled)}
        merges = [merge_pair(m) for m in merges_raw or []]
        model = BPEModel.from_merges(vocab, merges)
        pre: dict | None = GGUF_PRE_TOKENIZERS.get(meta.get("tokenizer.ggml.pre", "default"), _GPT2_REGEX)
        decoder: dict = {"type": "ByteLevel"}
        add_bos_default = False
    elif kind == "llama":
        vocab = {t: i for i, t in enumerate(tokens)}
        if merges_raw:
            merges = [merge_pair(m) for m in merges_raw]
        else:
            merges = _scored_merges(tokens, list(meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)))
        unk = meta.get("tokenizer.ggml.unknown_token_id")
        model = BPEModel.from_merges(vocab, merges, byte_fallback=True, unk_id=unk, fuse_unk=True)
        pre = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
        if meta.get("general.architecture") == "phi3":
            # Phi-3's tokenizer.json prepends '▁' with a normalizer (to every stretch between added tokens)
            # rather than with Metaspace; a GGUF does not say which, transformers picks it by architecture too.
            normalizer = {
                "type": "Sequence",
                "normalizers": [
                    {"type": "Prepend", "prepend": "▁"},
                    {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
                ],
            }
            pre = None
        decoder = {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        }
        add_bos_default = True
    else:
        raise ValueError(f"unsupported GGUF tokenizer model {kind!r} (supported: 'gpt2', 'llama')")

    added = [
        AddedToken(id=i, content=tokens[i], special=t != USER_DEFINED)
        for i, t in enumerate(types)
        if t in (UNKNOWN, CONTROL, USER_DEFINED)
    ]
    bos, eos = token_at("bos_token_id"), token_at("eos_token_id")
    prefix = (
        [meta["tokenizer.ggml.bos_token_id"]]
        if meta.get("tokenizer.ggml.add_bos_token", add_bos_default) and bos
        else []
    )
    suffix = (
        [meta["tokenizer.ggml.eos_token_id"]]
        if meta.get("tokenizer.ggml.add_eos_token", False) and eos
        else []
    )
    extra_eos = [meta[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id") if k in meta]
    return TokenizerSpec(
        model=model,
        added_tokens=added,
        normalizer=normalizer,
        pre_tokenizer=pre,
        decoder=decoder,
        prefix_ids=prefix,
        suffix_ids=suffix,
        bos_token=bos,
        eos_token=eos,
        pad_token=token_at("padding_token_id"),
        unk_token=token_at("unknown_token_id"),
        extra_eos_ids=extra_eos,
        chat_template=meta.get("tokenizer.chat_template"),
    )
