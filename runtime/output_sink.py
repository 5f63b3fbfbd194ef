"""Where a request's output chunks go: a thread-safe queue read by a sync caller or an asyncio loop."""

from __future__ import annotations

import asyncio
import contextlib
import queue
from typing import Protocol

from radixgen.runtime.outputs import StreamChunk


class OutputSink(Protocol):
    """What the engine loop needs of a sink: `put` a chunk from the loop thread, never blocking."""

    def put(self, chunk: StreamChunk) -> None: ...


class SyncSink:
    """Chunks delivered to a blocking reader (queue.Queue)."""

    def __init__(self) -> None:
        self.queue: queue.Queue[StreamChunk] = queue.Queue()

    def put(self, chunk: StreamChunk) -> None:
        self.queue.put(chunk)

    def get(self, timeout: float | None = None) -> StreamChunk:
        return self.queue.get(timeout=timeout)


class AsyncSink:
    """Chunks delivered into an asyncio.Queue owned by `loop`, from the engine thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[StreamChunk] = asyncio.Queue()

    def put(self, chunk: StreamChunk) -> None:
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody is listening any more
            self.loop.call_soon_threadsafe(self.queue.put_nowait, chunk)

    async def get(self) -> StreamChunk:
        return await self.queue.get()
