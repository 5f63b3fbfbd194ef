"""A fast GGUF reader: metadata into Python values, tensors as memory-mapped byte views.

The `gguf` package's reader builds numpy views for every field part, which takes ~12 s on a 49k-token
vocabulary (two string arrays of ~100k entries); this parses the same header in well under a second by reading
string arrays with `struct` from one bytes object. Tensor data stay in a read-only `np.memmap`; each tensor is a
uint8 view shaped `[*reversed(dims[1:]), row_bytes]`, which is what `gguf.quants.dequantize` takes.

Format (little-endian): magic "GGUF", version u32 (2 or 3), tensor count u64, metadata count u64; metadata
entries (key string, value type u32, value); tensor infos (name, n_dims u32, dims u64 x n, type u32, offset
u64); then tensor data at the next multiple of `general.alignment` (default 32), offsets relative to it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The file is not a (complete) GGUF file."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # dims as stored (ne0 first: the innermost, contiguous dimension)
    tensor_type: int  # a gguf.GGMLQuantizationType value
    data: np.ndarray  # uint8 view [*reversed(shape[1:]), row_bytes]

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1


class _Cursor:
    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise GGUFFormatError("header ends early (truncated file?)")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        if self.pos + n > len(self.buf):
            raise GGUFFormatError("string runs past the end of the header (truncated file?)")
        s = self.buf[self.pos : self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.unpack("<I"), self.unpack("<Q")
            if etype in _NUMPY:
                dt = np.dtype(_NUMPY[etype])
                end = self.pos + count * dt.itemsize
                if end > len(self.buf):
                    raise GGUFFormatError("array runs past the end of the header (truncated file?)")
                arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos)
                self.pos = end
                return arr.tolist()
            if etype == _STRING:
                return [self.string() for _ in range(count)]
            return [self.value(etype) for _ in range(count)]
        raise GGUFFormatError(f"unknown metadata value type {vtype}")


def _header_bytes(path: Path, size: int) -> bytes:
    """Read enough of the file to hold the header (grows until parsing succeeds)."""
    with open(path, "rb") as f:
        return f.read(size)


class GGUFFile:
    """Parsed header of one GGUF file: `metadata` (key -> value) and `tensors` (in file order)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        file_size = self.path.stat().st_size
        want = min(file_size, 8 << 20)
        while True:
            buf = _header_bytes(self.path, want)
            try:
                self._parse(buf, file_size)
                return
            except GGUFFormatError:
                if want >= file_size:
                    raise
                want = min(file_size, want * 4)

    def _parse(self, buf: bytes, file_size: int) -> None:
        cur = _Cursor(buf)
        if len(buf) < 4 or buf[:4] != b"GGUF":
            raise GGUFFormatError(f"{self.path}: not a GGUF file (bad magic {buf[:4]!r})")
        cur.pos = 4
        self.version = cur.unpack("<I")
        if self.version not in (2, 3):
            raise GGUFFormatError(f"{self.path}: unsupported GGUF version {self.version}")
        n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            meta[key] = cur.value(cur.unpack("<I"))
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.unpack("<I")
            dims = tuple(cur.unpack("<Q") for _ in range(n_dims))
            infos.append((name, dims, cur.unpack("<I"), cur.unpack("<Q")))
        align = int(meta.get("general.alignment", 32))
        data_start = (cur.pos + align - 1) // align * align
        self.metadata = meta
        self.tensors = self._map_tensors(infos, data_start, file_size)

    def _map_tensors(self, infos: list, data_start: int, file_size: int) -> list[GGUFTensor]:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        tensors = []
        for name, dims, ttype, offset in infos:
            try:
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
            except (ValueError, KeyError):
                raise GGUFFormatError(f"{self.path}: tensor {name} has unknown type {ttype}") from None
            ne0 = dims[0] if dims else 1
            if ne0 % block:
                raise GGUFFormatError(f"{self.path}: tensor {name}: row of {ne0} is not a multiple of {block}")
            row_bytes = ne0 // block * type_size
            rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
            start = data_start + offset
            end = start + rows * row_bytes
            if end > file_size:
                raise GGUFFormatError(f"{self.path}: tensor {name} ends at byte {end} but the file has "
                                      f"{file_size} (truncated file)")
            data = mm[start:end].reshape(*reversed(dims[1:]), row_bytes)
            tensors.append(GGUFTensor(name, tuple(int(d) for d in dims), int(ttype), data))
        return tensors
