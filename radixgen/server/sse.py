"""Server-sent events: `data: <json>\\n\\n` per event (orjson), ending with `data: [DONE]`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from radixgen.server.errors import ApiError, dumps

DONE = b"data: [DONE]\n\n"
CLIENT_GONE = "radixgen_client_gone"  # set on a stream response whose client left before the end


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


async def stream(request: web.Request, produce: Callable[[web.StreamResponse], Awaitable[None]]) -> web.StreamResponse:
    """The life of one event stream: open it, let `produce` send its events, report an ApiError it raises as an
    error event, stop quietly when the client has gone (the producer's cleanup aborts its work), end with DONE."""
    response = await open_stream(request)
    try:
        await produce(response)
    except ApiError as exc:
        await send_error(response, exc)
    except ConnectionResetError:
        response[CLIENT_GONE] = True
        return response
    await response.write(DONE)
    return response
