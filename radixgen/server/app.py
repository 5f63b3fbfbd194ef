"""`create_app(engine, settings, programs)`: the aiohttp application with every route, middleware and hook.

Startup runs one generate step in the background; `/health` answers 503 until it has, then 200, so "ready"
means the model is loaded and a forward pass works. Cleanup shuts the engine down when the app owns it.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from radixgen.server import native, openai_api, programs_api
from radixgen.server.metrics import CONTENT_TYPE
from radixgen.server.middleware import auth, errors_and_counts
from radixgen.server.state import STATE, ServerSettings, ServerState

log = logging.getLogger("radixgen.server")
_WARMUP: web.AppKey[asyncio.Task] = web.AppKey("radixgen_warmup", asyncio.Task)


def create_app(engine, settings: ServerSettings | None = None, programs=None) -> web.Application:
    """The server's application over a loaded `radixgen.Engine` (and optionally a `ProgramRegistry`)."""
    settings = settings or ServerSettings()
    middlewares = [errors_and_counts] + ([auth(settings.api_key)] if settings.api_key else [])
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=middlewares)
    app[STATE] = ServerState(engine, settings, programs=programs)
    native.add_routes(app)
    openai_api.add_routes(app)
    programs_api.add_routes(app)
    app.router.add_get("/metrics", metrics)
    app.on_startup.append(_start_warmup)
    app.on_cleanup.append(_cleanup)
    return app


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state.metrics.update_engine(await state.run_blocking(state.engine.get_stats))
    body = state.metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def _warmup(state: ServerState) -> None:
    try:
        ids = state.engine.tokenizer.encode("Hello", add_special_tokens=False) or [0]
        await state.engine.async_generate(input_ids=ids, sampling_params={"max_new_tokens": 2, "temperature": 0})
    except Exception:
        log.exception("warm-up generate failed; /health stays 503")
        return
    state.ready = True
    log.info("server ready (model %s, context %d)", state.model_name, state.context_length)


async def _start_warmup(app: web.Application) -> None:
    state = app[STATE]
    if state.settings.warmup:
        app[_WARMUP] = asyncio.create_task(_warmup(state))
    else:
        state.ready = True


async def _cleanup(app: web.Application) -> None:
    state = app[STATE]
    task = app.get(_WARMUP)
    if task is not None and not task.done():
        task.cancel()
    if state.programs is not None:
        state.programs.close()
    if state.settings.owns_engine:
        await asyncio.get_running_loop().run_in_executor(None, state.engine.shutdown)
    state.pool.shutdown(wait=False)
