"""GGUF string arrays (each item a u64 byte length, then that many UTF-8 bytes) read in one pass.

A vocabulary is tens of thousands of such items, so the only Python code run per string is one step of the loop
that walks the lengths. numpy then drops the length prefixes, leaving one separator byte that no string contains
in front of each string, so the whole array decodes with one `bytes.decode` and one `str.split`. Each string
comes out as `raw.decode("utf-8", errors="replace")` of its own bytes gives it: an ASCII separator cannot
continue a multi-byte sequence, so the decoder treats every string as if it ended the input.

`None` from these functions means "use the per-string reader", which is also what names a malformed array.
"""

from __future__ import annotations

import mmap
import struct
from typing import NamedTuple

import numpy as np

ByteSource = mmap.mmap | bytes  # a memory-mapped file, or its bytes
_U64 = struct.Struct("<Q")
_PREFIX = 8  # bytes of each item's length


class StringArray(NamedTuple):
    strings: list[str]
    end: int  # the offset just past the array's last string


def read_string_array(buf: ByteSource, pos: int, count: int) -> StringArray | None:
    """The `count` strings from byte `pos`; None when the per-string reader has to run (see the module doc)."""
    ends = string_ends(buf, pos, count)
    strings = None if ends is None else decode_strings(buf, pos, ends)
    if ends is None or strings is None:
        return None
    return StringArray(strings, _array_end(pos, ends))


def string_array_end(buf: ByteSource, pos: int, count: int) -> int | None:
    """The offset just past the `count` strings from byte `pos`, without decoding them; None as above."""
    ends = string_ends(buf, pos, count)
    return None if ends is None else _array_end(pos, ends)


def string_ends(buf: ByteSource, pos: int, count: int) -> np.ndarray | None:
    """Offsets (int64) just past each of the `count` strings from byte `pos`; None if one runs past `buf`.

    Walks the lengths' low bytes (vocabulary strings are short), then checks with numpy that every length's
    other bytes are zero; where one is not, walks the full u64 lengths instead.
    """
    ends = _walk(buf, pos, count, low_byte_only=True)
    if ends is not None and _high_bytes_zero(buf, _prefix_starts(pos, ends)):
        return ends
    return _walk(buf, pos, count, low_byte_only=False)


def decode_strings(buf: ByteSource, pos: int, ends: np.ndarray) -> list[str] | None:
    """The strings laid out from byte `pos` up to `ends` (from `string_ends`), decoded with errors="replace".

    None when every ASCII byte occurs in the strings, so that no separator is free.
    """
    count = len(ends)
    if count == 0:
        return []
    region = np.frombuffer(buf, dtype=np.uint8, count=int(ends[-1]) - pos, offset=pos)
    prefixes = _prefix_starts(pos, ends) - pos
    keep = np.ones(region.size, dtype=bool)
    keep[(prefixes[:, None] + np.arange(_PREFIX - 1)).ravel()] = False  # each prefix keeps its last byte
    joined = region[keep]
    slots = prefixes - (_PREFIX - 1) * np.arange(count)  # where those kept bytes landed in `joined`
    joined[slots] = 0
    raw = joined.tobytes()
    separator = next((c for c in range(128) if raw.count(c) == (count if c == 0 else 0)), None)
    if separator is None:
        return None
    if separator:
        joined[slots] = separator
        raw = joined.tobytes()
    return raw.decode("utf-8", errors="replace").split(chr(separator))[1:]


def _array_end(pos: int, ends: np.ndarray) -> int:
    return int(ends[-1]) if len(ends) else pos


def _prefix_starts(pos: int, ends: np.ndarray) -> np.ndarray:
    """Where each item's length prefix starts: at `pos`, then where the previous string ends."""
    starts = np.empty(len(ends), dtype=np.int64)
    if len(ends):
        starts[0] = pos
        starts[1:] = ends[:-1]
    return starts


def _walk(buf: ByteSource, pos: int, count: int, low_byte_only: bool) -> np.ndarray | None:
    ends: list[int] = []
    append = ends.append
    with memoryview(buf) as view:
        try:
            if low_byte_only:
                for _ in range(count):
                    pos += _PREFIX + view[pos]
                    append(pos)
            else:
                unpack = _U64.unpack_from
                for _ in range(count):
                    pos += _PREFIX + unpack(view, pos)[0]
                    append(pos)
        except (IndexError, struct.error, OverflowError):  # a length points past the end of `buf`
            return None
    if ends and ends[-1] > len(buf):
        return None
    return np.array(ends, dtype=np.int64)


def _high_bytes_zero(buf: ByteSource, prefixes: np.ndarray) -> bool:
    """Whether bytes 1-7 of every length prefix (each inside `buf`) are zero, so the low byte is the length."""
    data = np.frombuffer(buf, dtype=np.uint8)
    high = data[prefixes + 1]
    for k in range(2, _PREFIX):
        high |= data[prefixes + k]
    return not high.any()
