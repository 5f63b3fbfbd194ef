"""Compiled grammars kept on disk, so a restarted server or a second process does not compile them again.

One file per grammar, named by the digest of its key: the constraint (`GrammarKey`: kind, source text,
relaxations, narrowings), the vocabulary's digest and the engine's (`engine_digest`: this package's source
code, so any change to how grammars compile leaves old files unreachable). A file is a magic line, a JSON
header (format version, key digest, every array's dtype, shape and offset) and raw arrays: the automaton's
tables and what `MaskCache.precompute` computed (`PrecomputedMasks`). Nothing is unpickled; the arrays are
memory-mapped read-only, so a load costs a header parse and views, however large the tables.

Safe with several processes: a file is written under a temporary name and renamed into place, so a reader
only ever opens whole files; one that is truncated, corrupt, of another format or another key counts as a
miss (and is removed). The folder is kept under `max_bytes` by removing the files used least recently (a hit
touches its file). A folder that cannot be read or written only means compiling again: never an error.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import mmap
import os
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import BinaryIO

import numpy as np

from radixgen.grammars.bytedfa import ByteDFA
from radixgen.grammars.masks import PrecomputedMasks
from radixgen.grammars.pda import PdaTables
from radixgen.grammars.vocabulary import Vocabulary

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1  # the layout of a file (the code that fills it is in `engine_digest`)
MAGIC = b"radixgen-grammar\n"
SUFFIX = ".grammar"
DEFAULT_MAX_BYTES = 1 << 30
ALIGN = 64
STALE_TEMP_S = 3600.0  # a temporary file this old was left by a writer that died


@dataclass(frozen=True)
class GrammarKey:
    """What a compiled grammar is a function of, besides the vocabulary and the engine."""

    kind: str
    source: str
    relaxations: tuple[str, ...] = ()
    narrowings: tuple[str, ...] = ()

    def digest(self, vocab: Vocabulary) -> str:
        text = json.dumps([FORMAT_VERSION, engine_digest(), vocab.digest.hex(), self.kind, self.source,
                           list(self.relaxations), list(self.narrowings)])
        return hashlib.blake2b(text.encode(), digest_size=20).hexdigest()


@functools.cache
def engine_digest() -> str:
    """Digest of the source of every module of this package (read once per process)."""
    h = hashlib.blake2b(digest_size=16)
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@dataclass(frozen=True)
class CompiledParts:
    """A compiled grammar minus its caches filled on use: its tables and its precomputed walks."""

    tables: PdaTables | ByteDFA
    masks: PrecomputedMasks


class GrammarDiskCache:
    """`load` / `store` compiled grammars under `folder`, at most `max_bytes` of files."""

    def __init__(self, folder: Path | str, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.folder = Path(folder)
        self.max_bytes = max_bytes

    def path(self, key: GrammarKey, vocab: Vocabulary) -> Path:
        return self.folder / f"{key.digest(vocab)}{SUFFIX}"

    def load(self, key: GrammarKey, vocab: Vocabulary) -> CompiledParts | None:
        """The stored parts of `key`'s grammar, or None (absent, unreadable or not this key's: removed)."""
        path = self.path(key, vocab)
        try:
            with open(path, "rb") as f:
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # absent, unreadable, or empty (mmap refuses length 0)
            return None
        try:
            parts = _decode(data, path.stem, vocab)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            logger.warning("%s: unreadable grammar cache file, compiling again (%s)", path, exc)
            _remove(path)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # most recently used
        return parts

    def store(self, key: GrammarKey, vocab: Vocabulary, parts: CompiledParts) -> None:
        """Write `parts` for `key` (atomically), then keep the folder under `max_bytes`."""
        path = self.path(key, vocab)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                _encode(parts, path.stem, f)
            os.replace(tmp, path)
        except OSError as exc:
            logger.warning("%s: could not write the grammar cache (%s)", path, exc)
            _remove(tmp)
            return
        self._evict(keep=path)

    def _evict(self, keep: Path) -> None:
        """Remove the least recently used files beyond `max_bytes` (never `keep`, just written) and temporary
        files left by writers that died."""
        entries: list[tuple[float, int, Path]] = []
        now = time.time()
        try:
            for entry in os.scandir(self.folder):
                try:
                    stat = entry.stat()
                except OSError:
                    continue  # removed by another process meanwhile
                if entry.name.endswith(".tmp"):
                    if now - stat.st_mtime > STALE_TEMP_S:
                        _remove(Path(entry.path))
                elif entry.name.endswith(SUFFIX):
                    entries.append((stat.st_mtime, stat.st_size, Path(entry.path)))
        except OSError:
            return
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            if path != keep:
                _remove(path)
                total -= size

    def clear(self) -> None:
        """Remove every stored grammar."""
        for path in self.folder.glob(f"*{SUFFIX}"):
            _remove(path)


def _remove(path: Path) -> None:
    """Unlink `path` if it can be (another process may have removed it, or may not allow it)."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


# ---- the file format ---------------------------------------------------------------------------------------
def _arrays(parts: CompiledParts) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    """The header fields and the arrays that describe `parts`."""
    arrays = {f"masks.{f.name}": getattr(parts.masks, f.name) for f in fields(PrecomputedMasks)}
    tables = parts.tables
    if isinstance(tables, ByteDFA):
        arrays |= {"dfa.trans": tables.trans, "dfa.accepting": tables.accepting}
        return {"tables": "dfa"}, arrays
    calls = [edge for edges in tables.calls for edge in edges]
    arrays |= {
        "pda.trans": tables.trans, "pda.accept": tables.accept, "pda.has_bytes": tables.has_bytes,
        "pda.calls_start": np.cumsum([0] + [len(edges) for edges in tables.calls], dtype=np.int64),
        "pda.calls": np.array(calls, dtype=np.int64).reshape(len(calls), 2),
        "pda.terminal_offsets": np.array([offset for offset, _ in tables.terminals], dtype=np.int64),
        "pda.terminal_digests": np.array([list(dfa.digest) for _, dfa in tables.terminals],
                                         dtype=np.uint8).reshape(len(tables.terminals), 16),
    }
    dfas = [dfa for _, dfa in tables.terminals]
    arrays |= {  # every terminal's own table, one after the other
        "pda.terminal_sizes": np.array([dfa.num_states for dfa in dfas], dtype=np.int64),
        "pda.terminal_trans": np.concatenate([d.trans for d in dfas]) if dfas else np.zeros((0, 256), np.int32),
        "pda.terminal_accepting": np.concatenate([d.accepting for d in dfas]) if dfas else np.zeros(0, bool),
    }
    if tables.terminal_of is not None:
        arrays["pda.terminal_of"] = tables.terminal_of
    if tables.rule_start is not None:
        arrays["pda.rule_start"] = tables.rule_start
    return {"tables": "pda", "start": tables.start, "rule_names": list(tables.rule_names)}, arrays


def _encode(parts: CompiledParts, key: str, out: BinaryIO) -> None:
    header, arrays = _arrays(parts)
    layout: dict[str, tuple[str, list[int], int]] = {}
    offset = 0
    for name, array in arrays.items():
        layout[name] = (array.dtype.str, list(array.shape), offset)
        offset += -(-array.nbytes // ALIGN) * ALIGN
    text = json.dumps(header | {"format": FORMAT_VERSION, "key": key, "arrays": layout, "data": offset}).encode()
    start = -(-(len(MAGIC) + 8 + len(text)) // ALIGN) * ALIGN
    chunks = [MAGIC, len(text).to_bytes(8, "little"), text, bytes(start - len(MAGIC) - 8 - len(text))]
    for array in arrays.values():
        data = np.ascontiguousarray(array).tobytes()
        chunks += [data, bytes(-len(data) % ALIGN)]
    out.write(b"".join(chunks))


def _decode(data: mmap.mmap, key: str, vocab: Vocabulary) -> CompiledParts:
    """Parts from a mapped file; ValueError (or KeyError, TypeError, IndexError) where it does not hold a
    whole, consistent entry for `key`."""
    if data[:len(MAGIC)] != MAGIC:
        raise ValueError("not a grammar cache file")
    size = int.from_bytes(data[len(MAGIC):len(MAGIC) + 8], "little")
    header = json.loads(data[len(MAGIC) + 8:len(MAGIC) + 8 + size])
    if header["format"] != FORMAT_VERSION or header["key"] != key:
        raise ValueError("another format or key")
    start = -(-(len(MAGIC) + 8 + size) // ALIGN) * ALIGN
    if len(data) != start + header["data"]:
        raise ValueError(f"{len(data)} bytes, the header describes {start + header['data']}")
    arrays: dict[str, np.ndarray] = {}
    for name, (dtype, shape, offset) in header["arrays"].items():
        count = math.prod(shape)
        arrays[name] = np.frombuffer(data, dtype=np.dtype(dtype), count=count, offset=start + offset).reshape(shape)
    masks = PrecomputedMasks(**{f.name: arrays[f"masks.{f.name}"] for f in fields(PrecomputedMasks)})
    if header["tables"] == "dfa":
        dfa = ByteDFA(arrays["dfa.trans"], arrays["dfa.accepting"])
        _check_masks(masks, dfa.num_states, vocab)
        return CompiledParts(dfa, masks)
    return CompiledParts(_pda_tables(header, arrays, masks, vocab), masks)


def _pda_tables(header: dict[str, object], arrays: dict[str, np.ndarray], masks: PrecomputedMasks,
                vocab: Vocabulary) -> PdaTables:
    trans, accept, has_bytes = arrays["pda.trans"], arrays["pda.accept"], arrays["pda.has_bytes"]
    num = trans.shape[0]
    starts, flat = arrays["pda.calls_start"], arrays["pda.calls"]
    start = header["start"]
    if not (trans.shape == (num, 256) and accept.shape == has_bytes.shape == (num,) and starts.shape == (num + 1,)
            and isinstance(start, int) and 0 <= start < num and starts[0] == 0 and starts[-1] == flat.shape[0]
            and (np.diff(starts) >= 0).all() and _within(flat, 0, num)):
        raise ValueError("inconsistent automaton tables")
    offsets = arrays["pda.terminal_offsets"].tolist()
    rules = min(offsets, default=num)  # rule states come first; a terminal's states call nothing
    if starts[rules] != starts[-1]:
        raise ValueError("calls from a terminal's states")
    bounds = starts.tolist()
    edges = [(c, r) for c, r in flat.tolist()]
    calls: list[tuple[tuple[int, int], ...]] = [()] * num
    for g in np.flatnonzero(np.diff(starts[:rules + 1])).tolist():
        calls[g] = tuple(edges[bounds[g]:bounds[g + 1]])
    terminals = []
    sizes = arrays["pda.terminal_sizes"].tolist()
    ends = np.cumsum(sizes).tolist()
    own_trans, own_accepting = arrays["pda.terminal_trans"], arrays["pda.terminal_accepting"]
    if own_trans.shape != (sum(sizes), 256) or own_accepting.shape != (sum(sizes),):
        raise ValueError("inconsistent terminal tables")
    for offset, digest, size, end in zip(offsets, arrays["pda.terminal_digests"], sizes, ends):
        dfa = ByteDFA(own_trans[end - size:end], own_accepting[end - size:end])
        if not 0 <= offset <= num - size:
            raise ValueError("a terminal outside the tables")
        dfa.__dict__["digest"] = digest.tobytes()  # the cached property, known already
        terminals.append((offset, dfa))
    _check_masks(masks, num, vocab)
    names = header["rule_names"]
    if not isinstance(names, list):
        raise TypeError("rule names")
    return PdaTables(trans=trans, accept=accept, calls=tuple(calls), has_bytes=has_bytes, start=start,
                     rule_names=tuple(str(n) for n in names), terminals=tuple(terminals),
                     terminal_of=arrays.get("pda.terminal_of"), rule_start=arrays.get("pda.rule_start"))


def _within(values: np.ndarray, lo: int, hi: int) -> bool:
    """Every value is in [lo, hi) (true for none)."""
    return values.size == 0 or (int(values.min()) >= lo and int(values.max()) < hi)


def _check_masks(masks: PrecomputedMasks, num_states: int, vocab: Vocabulary) -> None:
    tops, words = masks.top_states.shape[0], vocab.mask_words
    pops = masks.pop_start.shape[0] - 1
    if not (masks.top_packed.shape == (tops, words) and masks.top_pops.shape == (tops,)
            and masks.mask_packed.shape == (masks.mask_states.shape[0], words) and pops >= 0
            and masks.pop_start[0] == 0 and masks.pop_start[-1] == masks.pop_nodes.shape[0]
            and (np.diff(masks.pop_start) >= 0).all()
            and all(_within(a, 0, num_states) for a in (masks.top_states, masks.mask_states, masks.representatives))
            and masks.representatives.shape[0] in (0, num_states) and _within(masks.top_pops, -1, pops)
            and _within(masks.pop_nodes, 0, vocab.trie.num_nodes)):
        raise ValueError("inconsistent precomputed masks")
