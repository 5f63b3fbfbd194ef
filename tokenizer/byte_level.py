"""GPT-2's reversible byte <-> printable-character alphabet used by byte-level BPE vocabularies.

Byte-level vocabularies spell every token as one character per byte: printable Latin-1 bytes stand for
themselves and the other 68 bytes are shifted to U+0100 and up (so a space is written 'Ġ', a newline 'Ċ').
"""

from __future__ import annotations


def _byte_to_char_table() -> list[str]:
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = [""] * 256
    shifted = 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


BYTE_TO_CHAR: list[str] = _byte_to_char_table()
CHAR_TO_BYTE: dict[str, int] = {ch: byte for byte, ch in enumerate(BYTE_TO_CHAR)}
# str.translate table: byte value (as a Latin-1 code point) -> its alphabet character.
_LATIN1_TO_ALPHABET = {byte: ch for byte, ch in enumerate(BYTE_TO_CHAR)}


def bytes_to_alphabet(data: bytes) -> str:
    """Spell raw bytes in the byte-level alphabet ('hi there' -> 'hiĠthere')."""
    return data.decode("latin-1").translate(_LATIN1_TO_ALPHABET)


def alphabet_to_bytes(token: str) -> bytes | None:
    """Raw bytes of a token spelled in the byte-level alphabet, or None if it uses other characters."""
    try:
        return bytes([CHAR_TO_BYTE[ch] for ch in token])
    except KeyError:
        return None
