"""Server-sent events: `data: <json>\\n\\n` per event (orjson), ending with `data: [DONE]`."""

from __future__ import annotations

from aiohttp import web
from radixgen.runtime.server.errors import ApiError, dumps

DONE = b"data: [DONE]\n\n"


async def open_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
    await response.prepare(request)
    return response


async def send(response: web.StreamResponse, event: object) -> None:
    """One event; raises ConnectionResetError when the client has gone (the caller then aborts its work)."""
    await response.write(b"data: " + dumps(event) + b"\n\n")


async def send_error(response: web.StreamResponse, error: ApiError) -> None:
    """An error after the 200 status went out: an `{"error": ...}` event (then the caller sends DONE)."""
    await send(response, error.body())
