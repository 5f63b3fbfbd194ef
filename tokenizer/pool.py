"""`encode_batch` across cores: worker processes that each load the tokenizer once from its file.

The hot loop holds the GIL, so threads would not help. Workers are spawned (not forked: the engine runs
threads and CUDA) and rebuild the tokenizer from its source path; texts go out in about equal-sized chunks
and ids come back as one int32 buffer plus lengths per chunk, which pickles far faster than lists of ints.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

# Below this many characters a batch is encoded in-process: shipping it costs more than it saves.
MIN_PARALLEL_CHARS = 1 << 18

_worker_tokenizer: Tokenizer | None = None  # this worker process's tokenizer, set by `_init_worker`


def worth_parallel(texts: Sequence[str]) -> bool:
    return (os.cpu_count() or 1) > 1 and len(texts) > 1 and sum(map(len, texts)) >= MIN_PARALLEL_CHARS


def _init_worker(source: tuple[str, dict]) -> None:
    global _worker_tokenizer
    from .tokenizer import Tokenizer

    path, options = source
    _worker_tokenizer = Tokenizer.from_file(path, **options)


def _encode_chunk(texts: list[str], add_special_tokens: bool) -> tuple[bytes, bytes]:
    assert _worker_tokenizer is not None, "every worker runs _init_worker first"
    encode = _worker_tokenizer.encode
    lists = [encode(t, add_special_tokens) for t in texts]
    lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    flat = np.fromiter((i for ids in lists for i in ids), dtype=np.int32, count=int(lengths.sum()))
    return flat.tobytes(), lengths.tobytes()


class EncodePool:
    def __init__(self, source: tuple[str, dict], workers: int | None = None):
        self.workers = workers or os.cpu_count() or 1
        self._executor = ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(source,),
        )

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool) -> list[list[int]]:
        chunks = _balanced_chunks(texts, 4 * self.workers)
        futures = [self._executor.submit(_encode_chunk, chunk, add_special_tokens) for chunk in chunks]
        out: list[list[int]] = []
        for future in futures:
            flat_bytes, length_bytes = future.result()
            flat = np.frombuffer(flat_bytes, dtype=np.int32).tolist()
            pos = 0
            for n in np.frombuffer(length_bytes, dtype=np.int64).tolist():
                out.append(flat[pos : pos + n])
                pos += n
        return out

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _balanced_chunks(texts: Sequence[str], count: int) -> list[list[str]]:
    """Consecutive runs of texts with about equal total length (order is kept)."""
    total = sum(map(len, texts))
    target = max(1, total // count)
    chunks: list[list[str]] = [[]]
    size = 0
    for t in texts:
        if size >= target and chunks[-1]:
            chunks.append([])
            size = 0
        chunks[-1].append(t)
        size += len(t)
    return chunks
