"""Where a request's output chunks go: a thread-safe queue read by a sync caller or an asyncio loop."""

from __future__ import annotations

import asyncio
import queue
from typing import Any


class SyncSink:
    """Chunks delivered to a blocking reader (queue.Queue)."""

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()

    def put(self, chunk: dict[str, Any]) -> None:
        self.queue.put(chunk)

    def get(self, timeout: float | None = None) -> dict[str, Any]:
        return self.queue.get(timeout=timeout)


class AsyncSink:
    """Chunks delivered into an asyncio.Queue owned by `loop`, from the engine thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, chunk: dict[str, Any]) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, chunk)
        except RuntimeError:
            pass  # the caller's loop is closed: nobody is listening any more

    async def get(self) -> dict[str, Any]:
        return await self.queue.get()
