"""Middlewares: errors in one JSON shape with per-route status counts (outermost), then Bearer auth.

A client that leaves before its answer is counted with status 499 (nginx's "client closed request"), whether
the handler was cancelled, a write failed, or a stream stopped early.
"""

from __future__ import annotations

import asyncio
import hmac
import logging

from aiohttp import web

from radixgen.server.errors import ApiError, internal_error
from radixgen.server.sse import CLIENT_GONE
from radixgen.server.state import STATE

log = logging.getLogger("radixgen.server")

OPEN_ROUTES = frozenset({"/health", "/health_generate"})
CLIENT_CLOSED = 499  # answered without a key: load balancers probe it


def _route(request: web.Request) -> str:
    """The route's template (`/v1/programs/{name}`), so metrics labels stay few; unmatched paths share one."""
    info = request.match_info
    resource = info.route.resource if info is not None and info.route is not None else None
    return resource.canonical if resource is not None else "unmatched"


def _http_error(exc: web.HTTPException, request: web.Request) -> ApiError:
    if exc.status == 404:
        return ApiError(404, f"no route {request.method} {request.path}", type="not_found_error")
    if exc.status == 405:
        return ApiError(405, f"method {request.method} is not allowed on {request.path}", type="invalid_request_error")
    if exc.status == 413:
        limit = request.app[STATE].settings.max_body_bytes
        return ApiError(413, f"body: larger than the limit of {limit} bytes", param="body",
                        type="invalid_request_error")
    return ApiError(exc.status, f"{exc.reason}: {exc.text or ''}".strip(": "), type="invalid_request_error")


@web.middleware
async def errors_and_counts(request: web.Request, handler) -> web.StreamResponse:
    status = 500
    try:
        response = await handler(request)
        status = CLIENT_CLOSED if response.get(CLIENT_GONE) else response.status
        return response
    except ApiError as exc:
        status = exc.status
        return exc.response()
    except web.HTTPException as exc:
        error = _http_error(exc, request)
        status = error.status
        return error.response()
    except (ConnectionResetError, asyncio.CancelledError):
        status = CLIENT_CLOSED  # the client closed the connection
        raise
    except Exception as exc:  # one request's bug is a 500 for that request only
        log.exception("internal error on %s %s", request.method, request.path)
        return internal_error(f"internal error: {type(exc).__name__}: {exc}").response()
    finally:
        request.app[STATE].metrics.requests.labels(_route(request), str(status)).inc()


def auth(api_key: str):
    """Require `Authorization: Bearer <api_key>` (constant-time compare) on every route but the OPEN_ROUTES."""
    expected = api_key.encode()

    @web.middleware
    async def check(request: web.Request, handler) -> web.StreamResponse:
        if request.path not in OPEN_ROUTES:
            header = request.headers.get("Authorization", "")
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
                raise ApiError(401, "a valid `Authorization: Bearer <api key>` header is required",
                               type="authentication_error", code="invalid_api_key")
        return await handler(request)

    return check
