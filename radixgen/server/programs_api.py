"""Program routes: `GET /v1/programs`, `POST /v1/programs/{name}` (one run, a batch, or a stream of events).

Body: `{"args": {...}}` for one run, or `{"batch": [{...}, ...]}` for many; `options` holds run-level
sampling defaults (`temperature`, `max_new_tokens`, ...); `stream: true` (one run) sends `{"text": delta}`
events, then the result with `"finished": true`, then `data: [DONE]`. A program that fails is a 500 (one run)
or an `error` in its item (batch).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web

from radixgen.runtime.sampling_params import FIELD_NAMES
from radixgen.server import sse
from radixgen.server.errors import ApiError, bad_request, json_response
from radixgen.server.fields import Fields, parse_json_object
from radixgen.server.native import check_sampling_params
from radixgen.server.programs import Program, ProgramRegistry, run_options, state_result
from radixgen.server.state import STATE

log = logging.getLogger("radixgen.server")

MAX_BATCH = 256


def _registry(request: web.Request) -> ProgramRegistry:
    registry = request.app[STATE].programs
    if registry is None:
        raise ApiError(404, "no programs are registered (start the server with --programs FILE.py)",
                       type="not_found_error")
    return registry


async def list_programs(request: web.Request) -> web.Response:
    registry = request.app[STATE].programs
    programs = [] if registry is None else [registry.get(n).describe() for n in registry.names()]
    return json_response({"object": "list", "data": programs})


def check_args(program: Program, args: Any, path: str) -> dict:
    """Argument values for `program`: a JSON object naming only its parameters, every required one given."""
    if not isinstance(args, dict):
        raise bad_request(path, "must be an object of argument values")
    known = {p.name for p in program.params}
    for key in args:
        if key not in known:
            raise bad_request(f"{path}.{key}", f"{program.name} has no such parameter; parameters: {sorted(known)}")
    for p in program.params:
        if p.required and p.name not in args:
            raise bad_request(f"{path}.{p.name}", "is required")
    return args


def check_options(program: Program, options: dict | None) -> dict:
    if not options:
        return {}
    allowed = set(run_options())
    params = {p.name for p in program.params}
    for key in options:
        if key not in allowed:
            raise bad_request(f"options.{key}", f"unknown run option; known: {sorted(allowed)}")
        if key in params:
            raise bad_request(f"options.{key}", f"{program.name} has a parameter of that name; pass it in args")
    check_sampling_params({k: v for k, v in options.items() if k in FIELD_NAMES}, "options")
    f = Fields(options, "options")
    f.boolean("return_logprob")
    f.integer("top_logprobs_num", None, low=0, high=64)
    return options


async def run_program(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    registry = _registry(request)
    name = request.match_info["name"]
    program = registry.get(name)
    if program is None:
        raise bad_request("name", f"unknown program {name!r}; registered: {registry.names()}")
    f = Fields(parse_json_object(await request.read()))
    f.reject_unknown(frozenset({"args", "batch", "options", "stream"}))
    options = check_options(program, f.obj("options"))
    stream = f.boolean("stream")
    backend = registry.backend(state.engine)
    loop = asyncio.get_running_loop()
    fn = program.function
    if f.has("batch"):
        if f.has("args") or stream:
            raise bad_request("batch", "give either `args` (one run, may stream) or `batch` (many runs)")
        batch = f.raw("batch")
        if not isinstance(batch, list) or not batch or len(batch) > MAX_BATCH:
            raise bad_request("batch", f"must be an array of 1-{MAX_BATCH} argument objects")
        kwargs = [check_args(program, a, f"batch[{i}]") for i, a in enumerate(batch)]

        def run_batch() -> list[dict]:
            states = fn.run_batch(kwargs, backend=backend, **options)
            return [state_result(name, s) for s in states]

        t0 = time.perf_counter()
        results = await loop.run_in_executor(registry.pool, run_batch)
        log.info("program %s: batch of %d, %d failed, latency=%.3fs", name, len(results),
                 sum(r["error"] is not None for r in results), time.perf_counter() - t0)
        return json_response({"name": name, "results": results})
    args = check_args(program, f.raw("args", {}), "args")
    if stream:
        return await _stream(request, registry, program, args, options, backend)

    def run_one() -> dict:
        return state_result(name, fn.run(backend=backend, **args, **options))

    t0 = time.perf_counter()
    result = await loop.run_in_executor(registry.pool, run_one)
    log.info("program %s: variables=%s error=%s latency=%.3fs", name, sorted(result["variables"]),
             result["error"], time.perf_counter() - t0)
    if result["error"] is not None:
        raise ApiError(500, f"program {name} failed: {result['error']}", type="program_error")
    return json_response(result)


async def _stream(request: web.Request, registry: ProgramRegistry, program: Program, args: dict, options: dict,
                  backend) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    run = await loop.run_in_executor(
        registry.pool, lambda: program.function.run(backend=backend, stream=True, **args, **options))

    async def produce(response: web.StreamResponse) -> None:
        # A client that leaves stops the stream; the program runs to its end on its thread, output dropped.
        async for delta in run.text_async_iter():
            await sse.send(response, {"text": delta})
        result = await loop.run_in_executor(registry.pool, state_result, program.name, run)
        await sse.send(response, {"finished": True, **result})

    return await sse.stream(request, produce)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/programs", list_programs)
    app.router.add_post("/v1/programs/{name}", run_program)
