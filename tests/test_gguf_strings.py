"""GGUF string arrays: the one-pass reader gives what a plain per-string reader gives, on small hand-written
files (empty, non-ASCII, invalid UTF-8, long and NUL-holding strings), and malformed arrays still raise
GGUFFormatError, whether the array is decoded or skipped."""

from __future__ import annotations

import random
import struct

import pytest

from radixgen.tokenizer.loaders.gguf_reader import GGUFFormatError, read_gguf
from radixgen.tokenizer.loaders.gguf_strings import read_string_array, string_array_end

_STRING, _ARRAY, _U32 = 8, 9, 4
_HEADER = 4 + 4 + 8 + 8  # magic, version, tensor count, metadata count


def _gguf_string(raw: bytes) -> bytes:
    return struct.pack("<Q", len(raw)) + raw


def _gguf_with_strings(items: list[bytes]) -> bytes:
    """A GGUF v3 file, no tensors: the key "strings" holding `items`, then the u32 key "after" = 7."""
    return b"".join(
        [b"GGUF", struct.pack("<IQQ", 3, 0, 2)]
        + [_gguf_string(b"strings"), struct.pack("<IIQ", _ARRAY, _STRING, len(items))]
        + [_gguf_string(s) for s in items]
        + [_gguf_string(b"after"), struct.pack("<II", _U32, 7)]
    )


def _array_start() -> int:
    return _HEADER + len(_gguf_string(b"strings")) + 4 + 4 + 8


def _per_string(items: list[bytes]) -> list[str]:
    return [s.decode("utf-8", errors="replace") for s in items]


def _fuzz(seed: int, n: int) -> list[bytes]:
    rng = random.Random(seed)
    pool = b"abc \x00\x7f" + bytes(range(0x80, 0x100, 7))  # ASCII, NUL, continuation and lead bytes, 0xff
    return [bytes(rng.choice(pool) for _ in range(rng.choice([0, 1, 2, 3, 5, 9, 300]))) for _ in range(n)]


# (name, items, whether the one-pass decoder takes them itself rather than handing over to the per-string reader)
CASES = [
    ("empty array", [], True),
    ("ascii and empty", [b"", b"a", b"", b"", b"hello world", b""], True),
    ("non-ascii", ["é".encode(), "日本語".encode(), "🙂".encode(), "Ġthe".encode(), b"", "▁x".encode()], True),
    ("invalid utf-8", [b"\xff", b"\xe2\x82", b"\xed\xa0\x80", b"a\xc3", b"\xa9b", b"\xf0\x9f\x98", b"\x80"], True),
    ("long strings", [b"x" * 300, b"", "é".encode() * 200, b"y" * 256, b"z"], True),
    ("NUL inside", [b"\x00", b"a\x00b", b"", b"\x00\x00"], True),
    ("every ASCII byte", [bytes([c]) for c in range(128)] + ["ü".encode()], False),
    ("fuzz", _fuzz(0, 400), True),
    ("fuzz short", [s[:3] for s in _fuzz(1, 400)], True),
]


@pytest.mark.parametrize("name,items,one_pass", CASES, ids=[c[0] for c in CASES])
def test_one_pass_equals_per_string_reader(tmp_path, name, items, one_pass):
    data = _gguf_with_strings(items)
    fast = read_string_array(data, _array_start(), len(items))
    assert (fast is not None) == one_pass
    if fast is not None:
        assert fast.strings == _per_string(items)
        assert fast.end == len(data) - len(_gguf_string(b"after")) - 8
    path = tmp_path / "s.gguf"
    path.write_bytes(data)
    decoded = read_gguf(path, decode_arrays=lambda key: True)
    assert decoded.metadata["strings"] == _per_string(items)
    assert decoded.metadata["after"] == 7
    skipped = read_gguf(path)
    assert skipped.array_lengths["strings"] == len(items) and skipped.metadata["after"] == 7
    assert ("strings" in skipped.metadata) == (len(items) <= 64)


def test_malformed_arrays_are_refused_decoded_or_skipped(tmp_path):
    items = [b"abc", "é".encode(), b""] * 30
    data = _gguf_with_strings(items)
    start = _array_start()
    huge = data[:start] + struct.pack("<Q", 2**64 - 1) + data[start + 8 :]  # a first length past any offset
    for name, blob in [("cut_in_string.gguf", data[: start + 40]), ("cut_in_length.gguf", data[: start + 3]),
                       ("huge_length.gguf", huge)]:
        assert read_string_array(blob, start, len(items)) is None
        assert string_array_end(blob, start, len(items)) is None
        path = tmp_path / name
        path.write_bytes(blob)
        for decode in (None, lambda key: True):
            with pytest.raises(GGUFFormatError, match="truncated"):
                read_gguf(path, decode_arrays=decode)
