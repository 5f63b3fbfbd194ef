"""The native API (SGLang's request shapes): /generate, tokenize/detokenize, cache, abort, info and health.

`POST /generate` takes `text` or `input_ids` (one prompt or a list), `sampling_params` (one dict or one per
prompt; the engine's names, constraints included), `return_logprob`, `top_logprobs_num`,
`logprob_start_len`, `return_text_in_logprobs`, `stream`, `stream_delta` and `rid` (native_protocol.py lists
them, and the SGLang fields that are not supported). Without `stream` it answers the engine's result (a list
for a list of prompts, `n > 1`, or a beam search returning several beams: a beam prompt is one engine request
whose beams are its outputs, best first); with it, server-sent events in SGLang's form (`text` and `output_ids` so
far, `finished`, `meta_info` on every event), or with `stream_delta` the engine's delta chunks (`meta_info`
on the last only); each tagged with `index` when there are several sub-requests, then `data: [DONE]`.
The other routes are SGLang's: tokenize/detokenize, flush_cache, abort_request, model and server info, health.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from aiohttp import web

import radixgen
from radixgen.runtime.best_of import sample_groups
from radixgen.runtime.sampling_params import SamplingParams, SamplingParamsError
from radixgen.server import sse
from radixgen.server.best_of import returned_outputs
from radixgen.server.errors import ApiError, bad_request, from_engine_error, json_response
from radixgen.server.fields import Fields, is_int, parse_json_object, token_id_list
from radixgen.server.generation import (
    Generation,
    LogprobOptions,
    SubRequest,
    check_fanout,
    failure_message,
    sample_requests,
)
from radixgen.server.native_protocol import (
    GENERATE_FIELDS,
    NOT_SUPPORTED,
    NOT_SUPPORTED_SAMPLING,
    StreamSoFar,
    drop_not_supported,
    token_ids_in,
    token_texts,
    with_token_text,
)
from radixgen.server.state import STATE, ServerState

MAX_TOP_LOGPROBS = 64


async def read_body(request: web.Request) -> dict:
    return parse_json_object(await request.read())


def check_sampling_params(raw: Any, path: str) -> SamplingParams:
    """One sampling_params dict parsed into the SamplingParams the engine is handed (the request's one parse);
    a 400 naming `path.field` when it is invalid."""
    if raw is not None and not isinstance(raw, dict):
        raise bad_request(path, f"must be an object, got {type(raw).__name__}")
    if raw is not None:
        raw = drop_not_supported(raw, NOT_SUPPORTED_SAMPLING, path)
    try:
        return SamplingParams.from_dict(raw)
    except SamplingParamsError as exc:
        raise from_engine_error(exc, path) from None
    except TypeError as exc:
        raise bad_request(path, str(exc)) from None


async def parse_prompts(state: ServerState, f: Fields) -> tuple[list[list[int]], bool, str]:
    """Prompt token ids, whether the request was a batch, and the field they came from."""
    has_text, has_ids = f.has("text"), f.has("input_ids")
    if has_text == has_ids:
        raise bad_request("text", "give exactly one of `text` or `input_ids`")
    if has_text:
        text = f.raw("text")
        batched = isinstance(text, list)
        texts = text if batched else [text]
        if batched and not texts:
            raise bad_request("text", "must not be an empty array")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise bad_request(f"text[{i}]" if batched else "text", "must be a string")
        return await state.encode(texts), batched, "text"
    ids = f.raw("input_ids")
    batched = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
    if batched:
        return [token_id_list(x, f"input_ids[{i}]", state.vocab_size) for i, x in enumerate(ids)], True, "input_ids"
    return [token_id_list(ids, "input_ids", state.vocab_size)], False, "input_ids"


async def generate(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    f = Fields(drop_not_supported(await read_body(request), NOT_SUPPORTED))
    f.reject_unknown(GENERATE_FIELDS)
    prompts, batched, prompt_field = await parse_prompts(state, f)
    raw_params = f.raw("sampling_params")
    if isinstance(raw_params, list):
        if len(raw_params) != len(prompts):
            raise bad_request("sampling_params", f"got {len(raw_params)} for {len(prompts)} prompts")
        params_list = raw_params
    else:
        params_list = [raw_params] * len(prompts)
    subs: list[SubRequest] = []
    parsed: list[SamplingParams] = []
    for i, (ids, raw) in enumerate(zip(prompts, params_list)):
        path = f"sampling_params[{i}]" if isinstance(raw_params, list) else "sampling_params"
        params = check_sampling_params(raw, path)
        parsed.append(params)
        check_fanout(len(prompts), params.num_samples, f"{path}.{'n' if params.best_of is None else 'best_of'}")
        explicit_max = raw.get("max_new_tokens") if isinstance(raw, dict) else None
        state.check_fits(ids, explicit_max, f"{prompt_field}[{i}]" if batched else prompt_field,
                         f"{path}.max_new_tokens")
        subs.extend(sample_requests(ids, params, i))
    start = f.integer("logprob_start_len", None, low=-1)
    asked_logprob = f.boolean("return_logprob")
    picks_best = any(p.picks_best for p in parsed)  # best_of ranks samples by their logprobs
    logprobs = LogprobOptions(
        return_logprob=asked_logprob or picks_best,
        top_logprobs_num=f.integer("top_logprobs_num", 0, low=0, high=MAX_TOP_LOGPROBS),
        logprob_start_len=None if start in (None, -1) else start,
    )
    keep_logprobs = asked_logprob or logprobs.logprob_start_len is not None
    rid = f.string("rid", nonempty=True)
    stream = f.boolean("stream")
    if stream and picks_best:
        raise bad_request("sampling_params.best_of", "must equal n with stream: true (the best samples are known "
                                                     "only once all have finished)")
    if any(p.is_beam_search for p in parsed):
        _check_beam_request(stream, asked_logprob, logprobs.logprob_start_len)
    delta = f.boolean("stream_delta")
    with_text = f.boolean("return_text_in_logprobs")
    gen = Generation(state.engine, state.metrics, subs, logprobs, rid=rid,
                     param_prefix="sampling_params")
    with state.generations.track(gen):
        async with gen:
            if stream:
                return await _stream(request, state, gen, tag_index=len(subs) > 1, delta=delta, with_text=with_text)
            outputs = [out for _, out in returned_outputs(await gen.collect(), sample_groups(parsed), keep_logprobs)]
    metas = [o.meta_info for o in outputs]
    if with_text:
        metas = [await _with_token_text(state, m) for m in metas]
    results = [{"text": o.text, "output_ids": o.output_ids, "meta_info": m} for o, m in zip(outputs, metas)]
    return json_response(results if batched or len(results) > 1 else results[0])


def _check_beam_request(stream: bool, return_logprob: bool, logprob_start_len: int | None) -> None:
    """What a request with a beam search (num_beams > 1) cannot ask for: a stream (the best beams are known
    only at the end) or token logprobs (a beam reports its cumulative_logprob and beam_score instead)."""
    if stream:
        raise bad_request("sampling_params.num_beams", "must be 1 with stream: true (a beam search knows its best "
                                                       "beams only at the end)")
    if return_logprob or logprob_start_len is not None:
        field = "return_logprob" if return_logprob else "logprob_start_len"
        raise bad_request(field, "is not supported with beam search (num_beams > 1): each beam's meta_info reports "
                                 "its cumulative_logprob and beam_score instead of token logprobs")


async def _with_token_text(state: ServerState, meta: dict[str, Any]) -> dict[str, Any]:
    """`meta` with `[logprob, id, text]` logprob entries (`return_text_in_logprobs`)."""
    ids = token_ids_in(meta)
    if not ids:
        return meta
    tok = state.engine.tokenizer
    texts = await state.run_blocking(token_texts, tok.decode, ids)
    return with_token_text(meta, texts.__getitem__)


async def _stream(request: web.Request, state: ServerState, gen: Generation, tag_index: bool, delta: bool,
                  with_text: bool) -> web.StreamResponse:
    """SGLang's events (text so far, meta_info on each) or, with `delta`, the engine's delta chunks."""
    so_far = [StreamSoFar() for _ in gen.subs]

    async def produce(response: web.StreamResponse) -> None:
        async for index, chunk in gen.events():
            finished = chunk["finished"]
            meta = chunk["meta_info"]
            if finished and with_text:
                meta = await _with_token_text(state, meta)
            if delta:
                event = {**chunk, "meta_info": meta}
            else:
                so_far[index].add(chunk)
                progress = meta if finished else gen.progress_meta(index, len(so_far[index].output_ids))
                event = so_far[index].event(finished, progress)
            await sse.send(response, {"index": index, **event} if tag_index else event)
            failure = failure_message(meta) if finished else None
            if failure:
                raise ApiError(500, f"generation failed: {failure}", type="internal_error")

    return await sse.stream(request, produce)


# ------------------------------------------------------------------------------------------ small routes
async def tokenize(request: web.Request) -> web.Response:
    state = request.app[STATE]
    f = Fields(await read_body(request))
    f.reject_unknown(frozenset({"text", "add_special_tokens"}))
    text = f.raw("text")
    add_special = f.boolean("add_special_tokens", True)
    batched = isinstance(text, list)
    texts = text if batched else [text]
    if text is None or not all(isinstance(t, str) for t in texts):
        raise bad_request("text", "must be a string or an array of strings")
    ids = await state.encode(texts, add_special)
    if batched:
        return json_response({"tokens": ids, "count": [len(x) for x in ids], "max_model_len": state.context_length})
    return json_response({"tokens": ids[0], "count": len(ids[0]), "max_model_len": state.context_length})


async def detokenize(request: web.Request) -> web.Response:
    state = request.app[STATE]
    f = Fields(await read_body(request))
    f.reject_unknown(frozenset({"tokens", "skip_special_tokens"}))
    tokens = f.raw("tokens")
    skip = f.boolean("skip_special_tokens")
    batched = isinstance(tokens, list) and bool(tokens) and isinstance(tokens[0], list)
    lists = tokens if batched else [tokens]
    for i, ids in enumerate(lists):
        path = f"tokens[{i}]" if batched else "tokens"
        if not isinstance(ids, list) or not all(is_int(t) and 0 <= t < state.vocab_size for t in ids):
            raise bad_request(path, f"must be an array of token ids in [0, {state.vocab_size})")
    tok = state.engine.tokenizer
    texts = await state.run_blocking(lambda: [tok.decode(ids, skip_special_tokens=skip) for ids in lists])
    return json_response({"text": texts if batched else texts[0]})


async def abort_request(request: web.Request) -> web.Response:
    state = request.app[STATE]
    f = Fields(await read_body(request))
    f.reject_unknown(frozenset({"rid", "abort_all"}))
    abort_all = f.boolean("abort_all")
    rid = f.string("rid", nonempty=True)
    if rid is None and not abort_all:
        raise bad_request("rid", "give the request id to abort (or abort_all: true)")
    return json_response({"aborted": state.generations.abort(None if abort_all else rid)})


async def flush_cache(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if not await state.run_blocking(state.engine.flush_cache):
        raise ApiError(409, "flush_cache: requests are running or waiting; the cache is flushed only when idle",
                       type="conflict")
    return json_response({"flushed": True})


async def concate_and_append_request(request: web.Request) -> web.Response:
    """SGLang's `join(mode="concate_and_append")`: the client has already appended the forks' texts to the
    destination state, and its next /generate sends that whole text, which the radix cache prefills from the
    longest cached prefix. radixgen does not splice KV computed at other positions (that would give the joined
    text different attention than a plain prefill), so this only checks the request and answers success."""
    f = Fields(await read_body(request))
    f.reject_unknown(frozenset({"src_rids", "dst_rid"}))
    src = f.raw("src_rids")
    if not isinstance(src, list) or not all(isinstance(r, str) for r in src):
        raise bad_request("src_rids", "must be an array of request ids")
    f.string("dst_rid")
    return json_response({"success": True, "kv_concatenated": False})


async def not_supported(request: web.Request) -> web.Response:
    """SGLang routes radixgen has no counterpart for (profiling)."""
    raise ApiError(400, f"{request.path}: not supported by radixgen", type="invalid_request_error")


def _model_path(state: ServerState) -> str:
    engine = state.engine
    return str(getattr(engine.runner, "model_path", None) or engine.config.model_path)


async def get_model_info(request: web.Request) -> web.Response:
    state = request.app[STATE]
    tok = state.engine.tokenizer
    path = _model_path(state)
    return json_response({
        "model_path": path,
        "tokenizer_path": path,
        "served_model_name": state.model_name,
        "context_length": state.context_length,
        "vocab_size": state.vocab_size,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "chat_template": tok.chat_template,
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "add_bos_token": tok.add_bos_token,
        "eos_token_ids": sorted(tok.eos_token_ids),
    })


async def get_server_info(request: web.Request) -> web.Response:
    """Ours (`engine_config`, `server`, `stats`, ...) and SGLang's flat server-args keys (model_path, host,
    port, context_length, ..., `internal_states`, `version`)."""
    state = request.app[STATE]
    stats = await state.run_blocking(state.engine.get_stats)
    settings = {k: v for k, v in dataclasses.asdict(state.settings).items() if k != "api_key"}
    config = dataclasses.asdict(state.engine.config)
    path = _model_path(state)
    return json_response({
        "model_path": path,
        "tokenizer_path": path,
        "served_model_name": state.model_name,
        "host": state.settings.host,
        "port": state.settings.port,
        "context_length": state.context_length,
        "internal_states": [stats],
        "version": radixgen.__version__,
        "engine_config": config,
        "server": {**settings, "auth": state.settings.api_key is not None},
        "stats": stats,
        "ready": state.ready,
        "uptime_s": time.time() - state.started_at,
        "programs": state.programs.names() if state.programs is not None else [],
    })


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if not state.ready:
        return json_response({"status": "starting"}, status=503)
    return json_response({"status": "ok"})


async def health_generate(request: web.Request) -> web.Response:
    """SGLang's deep health check: 200 once a one-token generation has run, 503 otherwise."""
    state = request.app[STATE]
    if not state.ready:
        return json_response({"status": "starting"}, status=503)
    try:
        await state.engine.async_generate(input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0})
    except Exception as exc:  # the engine cannot generate: unhealthy, not a server bug
        return json_response({"status": "unhealthy", "message": f"{type(exc).__name__}: {exc}"}, status=503)
    return json_response({"status": "ok"})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/generate", generate)
    app.router.add_put("/generate", generate)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_post("/abort_request", abort_request)
    app.router.add_post("/flush_cache", flush_cache)
    app.router.add_get("/flush_cache", flush_cache)
    app.router.add_post("/concate_and_append_request", concate_and_append_request)
    app.router.add_get("/get_model_info", get_model_info)
    app.router.add_get("/get_server_info", get_server_info)
    app.router.add_get("/server_info", get_server_info)
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health_generate)
    for route in ("/start_profile", "/stop_profile"):
        app.router.add_get(route, not_supported)
        app.router.add_post(route, not_supported)
