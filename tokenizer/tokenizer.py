"""`Tokenizer`: encode, decode, token bytes and chat templates over one `TokenizerSpec`.

Encoding path (hot loop in `_encode_text`): added tokens are cut out of the raw text first; each remaining
segment is normalized, pre-tokenized by regex into pieces, and every piece is looked up in a cache from piece
text to ids. Most pieces repeat (words, spaces, punctuation), so BPE runs only on a cache miss and the loop is
a regex scan plus C-level dict lookups: `chain.from_iterable(map(cache.__getitem__, pieces))`.

Decoding concatenates a precomputed byte string per id and decodes UTF-8 once (see `decoding.py`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .added_tokens import AddedToken, AddedTokenMatcher
from .bpe import BPEModel
from .byte_level import BYTE_TO_CHAR, bytes_to_alphabet
from .chat_template import render_chat_template
from .decoding import byte_fallback_value, decode_byte_runs, rules_from_decoder, token_bytes_table
from .detokenizer import IncrementalDetokenizer
from .normalizers import Normalizer, build_normalizer
from .pretokenizers import build_pretokenizer
from .spec import TokenizerSpec

if TYPE_CHECKING:
    from .pool import EncodePool

# Pieces longer than this are not cached (long whitespace or digit runs, whole SentencePiece segments).
MAX_CACHED_PIECE = 128
# The cache is dropped when it grows past this many pieces (bounded memory in a long-running server).
MAX_CACHE_ENTRIES = 1 << 20


class _PieceCache(dict[str, list[int]]):
    """piece text -> token ids; a miss runs BPE once (`__missing__` keeps the lookup loop in C)."""

    def __init__(self, encode_piece: Callable[[str], list[int]]):
        super().__init__()
        self.encode_piece = encode_piece

    def __missing__(self, piece: str) -> list[int]:
        ids = self.encode_piece(piece)
        if len(piece) <= MAX_CACHED_PIECE:
            self[piece] = ids
        return ids


def _normalized_contents(tokens: list[AddedToken], normalize: Normalizer | None) -> list[AddedToken]:
    """The `normalized` added tokens, each spelled as the normalizer writes it: they are looked for in normalized
    text, so Hugging Face normalizes their content too (under Llama 2's Prepend("▁") normalizer "<s>" is found
    only as "▁<s>", which then decodes with its space)."""
    if normalize is None:
        return []
    out = [replace(t, content=normalize(t.content)) for t in tokens if t.normalized]
    return [t for t in out if t.content]


class Tokenizer:
    """A BPE tokenizer (byte-level or SentencePiece-style) that gives the same ids as Hugging Face's."""

    def __init__(self, spec: TokenizerSpec):
        self.spec = spec
        self.model: BPEModel = spec.model
        self._normalize = build_normalizer(spec.normalizer)
        self._normalize_continued = build_normalizer(spec.normalizer, prepend=False)
        self._pretokenize = build_pretokenizer(spec.pre_tokenizer)
        self.byte_level = self._pretokenize.byte_level

        raw = [t for t in spec.added_tokens if not t.normalized or self._normalize is None]
        normalized = _normalized_contents(spec.added_tokens, self._normalize)
        self._raw_matcher = AddedTokenMatcher(raw) if raw else None
        self._normalized_matcher = AddedTokenMatcher(normalized) if normalized else None

        size = max([*self.model.vocab.values(), *(t.id for t in spec.added_tokens)], default=-1) + 1
        tokens = [""] * size
        for text, tid in self.model.vocab.items():
            tokens[tid] = text
        as_written = {t.id: t.content for t in spec.added_tokens}
        # spelled and decoded as Hugging Face does: a normalized token as the normalizer wrote it
        added = as_written | {t.id: t.content for t in normalized}
        for tid, content in added.items():
            tokens[tid] = content
        self._tokens = tokens
        self._token_to_id = {text: tid for tid, text in enumerate(tokens) if text} | {
            c: i for i, c in as_written.items()
        }
        self.special_token_ids: frozenset[int] = frozenset(t.id for t in spec.added_tokens if t.special)

        self._token_bytes = token_bytes_table(tokens, self.byte_level, added)
        self._skip_table = [
            b"" if i in self.special_token_ids else b for i, b in enumerate(self._token_bytes)
        ]
        self.decode_rules = rules_from_decoder(spec.decoder)
        self._is_byte_token = bytearray(size)
        if self.decode_rules.byte_runs_strict:
            for tid, text in enumerate(tokens):
                if tid not in added and byte_fallback_value(text) is not None:
                    self._is_byte_token[tid] = 1

        # byte value -> id of its byte-level token (a vocabulary may lack some bytes)
        byte_ids = [self.model.vocab.get(ch) for ch in BYTE_TO_CHAR] if self.byte_level else []
        self._byte_id: dict[int, int] = {b: tid for b, tid in enumerate(byte_ids) if tid is not None}
        self._every_byte_id = list(self._byte_id.values()) if len(self._byte_id) == 256 else None
        self._cache = _PieceCache(self._encode_piece_bytelevel if self.byte_level else self.model.encode_word)
        self._pool: EncodePool | None = None
        # SentencePiece-style words can be whole sentences; cut them where no merge can cross (see BPEModel)
        self._word_split = None if self.byte_level else self.model.boundary_split("▁")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_file(cls, path: str | os.PathLike, pattern: str | None = None, **options: Any) -> Tokenizer:
        """Load a tokenizer.json (or a folder with one), a .gguf file, or a tiktoken rank file.

        `pattern` (tiktoken files only) names the split regex ("gpt2"/"r50k_base", "cl100k_base", "qwen", ...)
        or gives it literally; `options` go to the tiktoken loader (e.g. `special_tokens={...}`).
        """
        from .loaders import load_any

        spec = load_any(Path(path), pattern=pattern, **options)
        spec.source = (str(path), {"pattern": pattern, **options})
        return cls(spec)

    # ------------------------------------------------------------------ vocabulary
    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included. A model's embedding may have more rows (padding): ids at or
        past this size stand for no text (`decode`, `token_bytes` and the detokenizer give nothing for them)."""
        return len(self._tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._token_to_id.get(token)

    def id_to_token(self, token_id: int) -> str:
        """The token as the vocabulary spells it (byte-level alphabet / '▁' form); "" for an id it lacks."""
        return self._tokens[token_id] if 0 <= token_id < len(self._tokens) else ""

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes this id contributes to decoded text (what grammar masks are built from); b"" for an
        id past the vocabulary."""
        return self._token_bytes[token_id] if 0 <= token_id < len(self._token_bytes) else b""

    def all_token_bytes(self) -> list[bytes]:
        """`token_bytes(i)` for every id, in id order."""
        return list(self._token_bytes)

    def _special_id(self, token: str | None) -> int | None:
        return None if token is None else self._token_to_id.get(token)

    @property
    def bos_token(self) -> str | None:
        return self.spec.bos_token

    @property
    def eos_token(self) -> str | None:
        return self.spec.eos_token

    @property
    def pad_token(self) -> str | None:
        return self.spec.pad_token

    @property
    def bos_token_id(self) -> int | None:
        return self._special_id(self.spec.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self._special_id(self.spec.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._special_id(self.spec.pad_token)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every id that ends generation: the EOS token plus the extra ones the model's config names."""
        ids = set(self.spec.extra_eos_ids)
        if self.eos_token_id is not None:
            ids.add(self.eos_token_id)
        return frozenset(ids)

    @property
    def add_bos_token(self) -> bool:
        """Whether `encode(..., add_special_tokens=True)` starts with BOS."""
        return self.bos_token_id is not None and self.spec.prefix_ids[:1] == [self.bos_token_id]

    # ------------------------------------------------------------------ encoding
    def _encode_piece_bytelevel(self, piece: str) -> list[int]:
        data = piece.encode("utf-8")
        if self.model.ignore_merges:
            whole = self.model.vocab.get(bytes_to_alphabet(data))
            if whole is not None:
                return [whole]
        if self._every_byte_id is not None:
            symbols = list(map(self._every_byte_id.__getitem__, data))
        else:  # bytes the vocabulary lacks are dropped, as in HF
            symbols = [self._byte_id[b] for b in data if b in self._byte_id]
        return self.model.merge(symbols)

    def _encode_text(self, text: str, at_start: bool, continued: bool = False) -> list[int]:
        """Ids of a stretch of text that holds no raw added token (`continued`: it continues a sequence, so no
        prefix space is prepended to it)."""
        normalize = self._normalize_continued if continued else self._normalize
        if self._normalize is not None:
            text = normalize(text) if normalize is not None else text
            if self._normalized_matcher is not None:
                out: list[int] = []
                for segment in self._normalized_matcher.split(text):
                    if isinstance(segment, int):
                        out.append(segment)
                    else:
                        out += self._encode_pieces(segment, at_start)
                    at_start = False
                return out
        return self._encode_pieces(text, at_start)

    def _encode_pieces(self, text: str, at_start: bool) -> list[int]:
        pieces = self._pretokenize(text, at_start)
        if self._word_split is not None:
            split = self._word_split.split
            pieces = [q for p in pieces for q in split(p)]
        return list(chain.from_iterable(map(self._cache.__getitem__, pieces)))

    def encode(self, text: str, add_special_tokens: bool = True, continued: bool = False) -> list[int]:
        """Token ids of `text`; with `add_special_tokens` the post-processor's BOS/EOS are added. `continued`:
        the text continues a sequence (e.g. forced text appended after generated tokens), so it is encoded as
        it would be there, without the prefix space SentencePiece-style tokenizers give a text's start."""
        if self._raw_matcher is None:
            ids = self._encode_text(text, not continued, continued) if text else []
        else:
            ids = []
            first = True  # the text's start: only there does `continued` apply (after an added token, as usual)
            for segment in self._raw_matcher.split(text):
                if isinstance(segment, int):
                    ids.append(segment)
                elif segment:
                    ids += self._encode_text(segment, first and not continued, first and continued)
                first = False
        if len(self._cache) > MAX_CACHE_ENTRIES:
            self._cache.clear()
        if add_special_tokens and (self.spec.prefix_ids or self.spec.suffix_ids):
            return [*self.spec.prefix_ids, *ids, *self.spec.suffix_ids]
        return ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """`encode` of each text, spread over every core (worker processes) when the batch is large enough."""
        from .pool import EncodePool, worth_parallel

        if not worth_parallel(texts) or self.spec.source is None:
            return [self.encode(t, add_special_tokens) for t in texts]
        if self._pool is None:
            self._pool = EncodePool(self.spec.source)
        return self._pool.encode_batch(texts, add_special_tokens)

    def close(self) -> None:
        """Stop the worker processes of `encode_batch`, if any were started."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # ------------------------------------------------------------------ decoding
    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids`; ids past the vocabulary are left out (as Hugging Face does)."""
        if isinstance(ids, list):
            id_list: list[int] = ids
        else:
            tolist = getattr(ids, "tolist", None)  # numpy arrays and torch tensors
            id_list = tolist() if tolist is not None else list(ids)
        table = self._skip_table if skip_special_tokens else self._token_bytes
        try:  # itemgetter gathers every id's bytes in one C loop (faster than map over __getitem__)
            data = b"".join(itemgetter(*id_list)(table)) if len(id_list) > 1 else b"".join([table[i] for i in id_list])
        except IndexError:
            id_list = [i for i in id_list if 0 <= i < len(table)]
            data = b"".join([table[i] for i in id_list])
        if self.decode_rules.byte_runs_strict:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                kept = [i for i in id_list if i not in self.special_token_ids] if skip_special_tokens else id_list
                text = decode_byte_runs(kept, self._token_bytes, self._is_byte_token)
        else:
            text = data.decode("utf-8", "replace")
        if self.decode_rules.strip_leading_space and text.startswith(" "):
            text = text[1:]
        return text

    def incremental_detokenizer(self, skip_special_tokens: bool = False) -> IncrementalDetokenizer:
        """A streaming decoder: feed ids one at a time, get back only final, complete text."""
        return IncrementalDetokenizer(
            self._token_bytes,
            self._is_byte_token if self.decode_rules.byte_runs_strict else None,
            self.decode_rules.strip_leading_space,
            self.special_token_ids if skip_special_tokens else frozenset(),
        )

    # ------------------------------------------------------------------ chat
    @property
    def chat_template(self) -> str | None:
        return self.spec.chat_template

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> str:
        """Render the model's Jinja chat template the way transformers does (sandboxed jinja2)."""
        template = chat_template or self.spec.chat_template
        if template is None:
            raise ValueError("this tokenizer has no chat template; pass chat_template=")
        special = {
            "bos_token": self.spec.bos_token,
            "eos_token": self.spec.eos_token,
            "pad_token": self.spec.pad_token,
            "unk_token": self.spec.unk_token,
        }
        special = {k: v for k, v in special.items() if v is not None}
        return render_chat_template(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            **{**special, **kwargs},
        )

    def __repr__(self) -> str:
        kind = "byte-level" if self.byte_level else "sentencepiece-style"
        return f"Tokenizer({kind} BPE, vocab_size={self.vocab_size})"
