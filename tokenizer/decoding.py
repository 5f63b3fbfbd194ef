"""From ids back to text: the exact bytes of every token, and Hugging Face's decoder rules over them.

Every supported decoder reduces to "concatenate each token's bytes, then decode UTF-8", plus two details:
  * SentencePiece byte fallback (`ByteFallback` decoder): a run of `<0xNN>` tokens is decoded on its own and,
    if it is not valid UTF-8, becomes one U+FFFD per byte (byte-level vocabularies instead replace each
    maximal invalid subsequence once, like Python's "replace" handler);
  * the leading space SentencePiece adds is removed once at the start (`Strip` / `Metaspace` decoders).
"""

from __future__ import annotations

from dataclasses import dataclass

from .byte_level import alphabet_to_bytes

SPACE_MARK = "▁"


def byte_fallback_value(token: str) -> int | None:
    """The byte a '<0xNN>' token stands for, else None."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


@dataclass(frozen=True)
class DecodeRules:
    byte_runs_strict: bool  # SentencePiece ByteFallback semantics, see the module docstring
    strip_leading_space: bool  # drop one ' ' at the very start of the decoded text


def rules_from_decoder(spec: dict | None) -> DecodeRules:
    kinds: list[dict] = []

    def walk(node: dict | None) -> None:
        if node is None:
            return
        if node["type"] == "Sequence":
            for sub in node["decoders"]:
                walk(sub)
        else:
            kinds.append(node)

    walk(spec)
    types = {k["type"] for k in kinds}
    unsupported = types - {"ByteLevel", "ByteFallback", "Fuse", "Strip", "Replace", "Metaspace"}
    if unsupported:
        raise ValueError(f"unsupported decoder types {sorted(unsupported)}")
    strip = any(
        k["type"] == "Strip" and k.get("start", 0) >= 1 and k.get("content") == " " for k in kinds
    ) or any(
        k["type"] == "Metaspace"
        and k.get("prepend_scheme", "always") != "never"
        and k.get("add_prefix_space", True)
        for k in kinds
    )
    return DecodeRules(byte_runs_strict="ByteFallback" in types, strip_leading_space=strip)


def token_bytes_table(tokens: list[str], byte_level: bool, added: dict[int, str]) -> list[bytes]:
    """The byte string each id stands for.

    Byte-level tokens are mapped back through GPT-2's alphabet (a token with any other character is taken
    as its UTF-8, as Hugging Face's ByteLevel decoder does); SentencePiece tokens turn '▁' into a space and
    '<0xNN>' into that byte; added tokens are their content in UTF-8.
    """
    table: list[bytes] = []
    for token in tokens:
        if byte_level:
            raw = alphabet_to_bytes(token)
            table.append(raw if raw is not None else token.encode("utf-8"))
        else:
            value = byte_fallback_value(token)
            table.append(
                bytes([value]) if value is not None else token.replace(SPACE_MARK, " ").encode("utf-8")
            )
    for tid, content in added.items():
        if byte_level:
            raw = alphabet_to_bytes(content)
            table[tid] = raw if raw is not None else content.encode("utf-8")
        else:
            table[tid] = content.replace(SPACE_MARK, " ").encode("utf-8")
    return table


def decode_byte_runs(ids: list[int], table: list[bytes], is_byte_token: bytearray) -> str:
    """Exact SentencePiece ByteFallback decoding: invalid runs of byte tokens give one U+FFFD per byte."""
    parts: list[str] = []
    run = bytearray()
    run_len = 0
    for tid in ids:
        if is_byte_token[tid]:
            run += table[tid]
            run_len += 1
            continue
        if run_len:
            parts.append(_decode_run(bytes(run), run_len))
            run.clear()
            run_len = 0
        parts.append(table[tid].decode("utf-8", "replace"))
    if run_len:
        parts.append(_decode_run(bytes(run), run_len))
    return "".join(parts)


def _decode_run(run: bytes, count: int) -> str:
    try:
        return run.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * count
