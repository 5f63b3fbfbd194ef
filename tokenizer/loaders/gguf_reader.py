"""The one GGUF parser: metadata, tensor descriptions, and zero-copy views of the tensor bytes (memory-mapped).

The `gguf` package's GGUFReader builds a numpy view for every element of every metadata array, which for a
49k-token vocabulary and its merges costs seconds. This parser walks the header with struct over an mmap: long
arrays are skipped by length unless the caller asks for them by key (the tokenizer asks for `tokenizer.*`);
numeric arrays decode with one np.frombuffer, string arrays in one pass (gguf_strings.py), falling back to one
read per item to name what is malformed. The `gguf` package still does the dequantization (gguf.quants); tests
check this parser against GGUFReader.

Layout (little-endian, versions 2 and 3): magic "GGUF", u32 version, u64 tensor count, u64 metadata count,
metadata (string key, u32 type, value), tensor infos (string name, u32 n_dims, u64 dims (innermost first),
u32 ggml type, u64 offset), padding to `general.alignment` (32), then the tensor data.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from radixgen.tokenizer.loaders.gguf_strings import read_string_array, string_array_end


class GGUFFormatError(ValueError):
    """The file is not a well-formed GGUF: empty, bad magic, truncated, or of an unknown layout."""


class GGUFTypeError(GGUFFormatError):
    """A tensor uses a ggml type id this reader does not know."""


# GGUF value type id -> struct format of a scalar (8 = string, 9 = array are handled apart).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
MAX_ARRAY_ITEMS = 64  # longer metadata arrays (vocabulary, merges, scores) are skipped, not decoded


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # logical numpy shape, outermost first: (rows, cols) for a matrix
    data: np.ndarray  # uint8 [..., bytes per row], a view of the memory map (what gguf.quants.dequantize takes)


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, Any]  # scalars, strings and arrays of at most MAX_ARRAY_ITEMS items
    array_lengths: dict[str, int]  # every array field's length, including the skipped ones
    tensors: list[GGUFTensor]


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.pos = buf, path, 0

    def unpack(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        except (struct.error, OverflowError):  # past the end (a corrupt length can point past any offset)
            raise GGUFFormatError(f"{self.path}: truncated GGUF header (at byte {self.pos})") from None
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        if self.pos + n > len(self.buf):
            raise GGUFFormatError(f"{self.path}: truncated GGUF header (string at byte {self.pos})")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        fmt = _SCALARS.get(vtype)
        if fmt is None:
            raise GGUFFormatError(f"{self.path}: unknown GGUF value type {vtype} at byte {self.pos}")
        return self.unpack(fmt)

    def array(self, item_type: int, count: int) -> list:
        if item_type == _STRING:
            fast = read_string_array(self.buf, self.pos, count)
            if fast is None:  # malformed (the per-string reader says how) or unusual: one string at a time
                return [self.string() for _ in range(count)]
            self.pos = fast.end
            return fast.strings
        fmt = _SCALARS.get(item_type)
        if fmt is None:
            raise GGUFFormatError(f"{self.path}: GGUF array of unsupported item type {item_type}")
        dt = np.dtype(fmt)
        if self.pos + count * dt.itemsize > len(self.buf):
            raise GGUFFormatError(f"{self.path}: truncated GGUF header (array at byte {self.pos})")
        arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos)
        self.pos += count * dt.itemsize
        return arr.tolist()

    def skip_array(self, item_type: int, count: int) -> None:
        if item_type == _STRING:
            end = string_array_end(self.buf, self.pos, count)
            if end is not None:
                self.pos = end
                return
            for _ in range(count):
                self.pos += 8 + self.unpack("<Q")
        elif item_type in _SCALARS:
            self.pos += count * struct.calcsize(_SCALARS[item_type])
        else:
            raise GGUFFormatError(f"{self.path}: GGUF array of unsupported item type {item_type}")


def read_gguf(path: Path, decode_arrays: Callable[[str], bool] | None = None) -> GGUFFile:
    """Parse `path`; raise GGUFFormatError (naming the file and the problem) on anything malformed.

    Arrays longer than MAX_ARRAY_ITEMS are decoded only for keys where `decode_arrays(key)` is true.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError:  # an empty file cannot be mapped
        raise GGUFFormatError(f"{path}: empty file, not a GGUF model") from None
    cur = _Cursor(buf, path)
    if buf[:4] != b"GGUF":
        raise GGUFFormatError(f"{path}: not a GGUF file (bad magic {bytes(buf[:4])!r})")
    cur.pos = 4
    version = cur.unpack("<I")
    if version not in (2, 3):
        raise GGUFFormatError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")

    metadata: dict[str, Any] = {}
    array_lengths: dict[str, int] = {}
    for _ in range(n_kv):
        key, vtype = cur.string(), cur.unpack("<I")
        if vtype != _ARRAY:
            metadata[key] = cur.value(vtype)
            continue
        item_type, count = cur.unpack("<I"), cur.unpack("<Q")
        array_lengths[key] = count
        if count <= MAX_ARRAY_ITEMS or (decode_arrays is not None and decode_arrays(key)):
            metadata[key] = cur.array(item_type, count)
        else:
            cur.skip_array(item_type, count)

    infos = []
    for _ in range(n_tensors):
        name, n_dims = cur.string(), cur.unpack("<I")
        dims = [cur.unpack("<Q") for _ in range(n_dims)]
        infos.append((name, dims, cur.unpack("<I"), cur.unpack("<Q")))
    alignment = int(metadata.get("general.alignment", 32))
    data_start = -(-cur.pos // alignment) * alignment

    tensors = []
    for name, dims, type_id, offset in infos:
        try:
            qtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise GGUFTypeError(f"{path}: tensor {name} uses unknown ggml type {type_id}") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        shape = tuple(reversed(dims)) or (1,)
        if shape[-1] % block:
            raise GGUFFormatError(f"{path}: tensor {name} row length {shape[-1]} is not a multiple of the "
                                        f"{qtype.name} block size {block}")
        row_bytes = shape[-1] // block * type_size
        n_bytes = int(np.prod(shape[:-1], dtype=np.int64)) * row_bytes
        start = data_start + offset
        if start + n_bytes > len(buf):
            raise GGUFFormatError(
                f"{path}: truncated: tensor {name} ends at byte {start + n_bytes}, the file has {len(buf)} bytes"
            )
        data = np.frombuffer(buf, dtype=np.uint8, count=n_bytes, offset=start).reshape(*shape[:-1], row_bytes)
        tensors.append(GGUFTensor(name, qtype, shape, data))
    return GGUFFile(path, version, metadata, array_lengths, tensors)
