"""The OpenAI-compatible routes: /v1/models (and /v1/models/{id}), /v1/completions, /v1/chat/completions (whole
or streamed; a chat choice's text is read back as reasoning, content and tool calls by chat_output.py).

Choice i of prompt p is sub-request p * n + i (with best_of > n: the i-th best of prompt p's best_of samples; with
a beam search, prompt p's one sub-request, its i-th best beam).
Logprobs are taken from the engine's meta_info, which arrives with a sub-request's last chunk, so a stream
carries each choice's logprobs on its final chunk.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from aiohttp import web

from radixgen.server import sse
from radixgen.server.best_of import returned_outputs
from radixgen.server.chat_output import ChoiceStream, assistant_message, finish_with_calls
from radixgen.server.errors import ApiError, json_response
from radixgen.server.fields import parse_json_object
from radixgen.server.generation import Generation, Output, failure_message
from radixgen.server.openai_protocol import OpenAIRequest, parse_chat, parse_completion
from radixgen.server.state import STATE, ServerState

FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}


# ------------------------------------------------------------------------------------------------ shaping
def finish_reason(meta: dict) -> str | None:
    reason = (meta or {}).get("finish_reason")
    return FINISH_REASONS.get(reason.get("type")) if reason else None


def matched_stop(meta: dict) -> Any:
    return ((meta or {}).get("finish_reason") or {}).get("matched")


def usage(req: OpenAIRequest, metas: list[dict]) -> dict:
    """Prompt tokens count once per prompt (not per sample); cached tokens are the best any sample got."""
    cached = [0] * len(req.prompts)
    for sub, meta in zip(req.subs, metas):
        cached[sub.prompt_index] = max(cached[sub.prompt_index], (meta or {}).get("cached_tokens", 0))
    prompt = sum(len(p) for p in req.prompts)
    completion = sum((m or {}).get("completion_tokens", 0) for m in metas)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(cached)}}


def _token_text(tok, token_id: int) -> str:
    return tok.token_bytes(token_id).decode("utf-8", "replace")


def chat_logprobs(tok, meta: dict, top_n: int) -> dict:
    """`{"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}` from the engine's output logprobs."""
    tops = meta.get("output_top_logprobs") or []
    content = []
    for k, (lp, tid) in enumerate(meta.get("output_token_logprobs") or []):
        alts = tops[k] if k < len(tops) and tops[k] else []
        content.append({
            "token": _token_text(tok, tid), "logprob": lp, "bytes": list(tok.token_bytes(tid)),
            "top_logprobs": [{"token": _token_text(tok, t), "logprob": v, "bytes": list(tok.token_bytes(t))}
                             for v, t in alts[:top_n]],
        })
    return {"content": content}


def completion_logprobs(tok, meta: dict, top_n: int, echo: bool, offset0: int = 0) -> dict:
    """The legacy completions shape: tokens, token_logprobs, top_logprobs (dicts), text_offset."""
    pairs = list(meta.get("output_token_logprobs") or [])
    tops = list(meta.get("output_top_logprobs") or [])
    if echo:
        pairs = list(meta.get("input_token_logprobs") or []) + pairs
        tops = list(meta.get("input_top_logprobs") or [None] * len(meta.get("input_token_logprobs") or [])) + tops
    tokens, offsets, pos = [], [], offset0
    for _lp, tid in pairs:
        text = _token_text(tok, tid)
        tokens.append(text)
        offsets.append(pos)
        pos += len(text)
    top_dicts = None
    if top_n:
        top_dicts = [None if not alts else {_token_text(tok, t): v for v, t in alts[:top_n]}
                     for alts in (tops + [None] * (len(pairs) - len(tops)))]
    return {"tokens": tokens, "token_logprobs": [lp for lp, _t in pairs], "top_logprobs": top_dicts,
            "text_offset": offsets}


def _completion_choice(state: ServerState, req: OpenAIRequest, index: int, out: Output) -> dict:
    prefix = req.prompt_texts[req.subs[index].prompt_index] if req.echo else ""
    logprobs = None
    if req.want_logprobs:
        logprobs = completion_logprobs(state.engine.tokenizer, out.meta_info, req.top_logprobs, req.echo)
    return {"index": index, "text": prefix + out.text, "logprobs": logprobs,
            "finish_reason": finish_reason(out.meta_info), "matched_stop": matched_stop(out.meta_info)}


def _chat_choice(state: ServerState, req: OpenAIRequest, index: int, out: Output) -> dict:
    logprobs = chat_logprobs(state.engine.tokenizer, out.meta_info, req.top_logprobs) if req.want_logprobs else None
    message = assistant_message(out.text, req.shape)
    return {"index": index, "message": message, "logprobs": logprobs,
            "finish_reason": finish_with_calls(finish_reason(out.meta_info), "tool_calls" in message),
            "matched_stop": matched_stop(out.meta_info)}


# ------------------------------------------------------------------------------------------------ routes
def _model_card(state: ServerState) -> dict:
    return {"id": state.model_name, "object": "model", "created": int(state.started_at), "owned_by": "radixgen",
            "max_model_len": state.context_length}


async def list_models(request: web.Request) -> web.Response:
    return json_response({"object": "list", "data": [_model_card(request.app[STATE])]})


async def retrieve_model(request: web.Request) -> web.Response:
    state = request.app[STATE]
    model_id = request.match_info["model_id"]
    if model_id != state.model_name:
        raise ApiError(404, f"model {model_id!r} not found; this server serves {state.model_name!r}", param="model",
                       code="model_not_found")
    return json_response(_model_card(state))


async def completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    req = await parse_completion(parse_json_object(await request.read()), state)
    return await _run(request, state, req, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    req = await parse_chat(parse_json_object(await request.read()), state)
    return await _run(request, state, req, chat=True)


async def _run(request: web.Request, state: ServerState, req: OpenAIRequest, chat: bool) -> web.StreamResponse:
    gen = Generation(state.engine, state.metrics, req.subs, req.logprobs, rid=req.rid)
    created = int(time.time())
    with state.generations.track(gen):
        async with gen:
            if req.stream:
                return await _stream(request, state, req, gen, chat, created)
            outputs = await gen.collect()
    if req.picks is not None:  # the choices are the n best of each prompt's samples, or its beams
        returned = returned_outputs(outputs, req.picks, keep_logprobs=req.want_logprobs)
        req = dataclasses.replace(req, subs=[req.subs[i] for i, _ in returned])
        outputs = [out for _, out in returned]
    shape = _chat_choice if chat else _completion_choice
    return json_response({
        "id": req.rid, "object": "chat.completion" if chat else "text_completion", "created": created,
        "model": state.model_name, "choices": [shape(state, req, i, o) for i, o in enumerate(outputs)],
        "usage": usage(req, [o.meta_info for o in outputs]),
    })


async def _stream(request: web.Request, state: ServerState, req: OpenAIRequest, gen: Generation, chat: bool,
                  created: int) -> web.StreamResponse:
    base: dict[str, Any] = {"id": req.rid, "object": "chat.completion.chunk" if chat else "text_completion",
                            "created": created, "model": state.model_name}
    if req.include_usage:
        base["usage"] = None
    tok = state.engine.tokenizer
    metas: list[dict] = [{} for _ in req.subs]
    choices = [ChoiceStream(req.shape) for _ in req.subs]

    def chunk(index: int, text: str | None, meta: dict | None, first: bool = False,
              delta: dict[str, Any] | None = None) -> dict:
        """One choice's event; `meta` (the sub-request's meta_info) only on its last."""
        logprobs = None
        if meta is not None and req.want_logprobs:
            logprobs = (chat_logprobs(tok, meta, req.top_logprobs) if chat
                        else completion_logprobs(tok, meta, req.top_logprobs, req.echo))
        choice: dict[str, Any]
        if chat:
            choice = {"index": index, "delta": {"role": "assistant", "content": ""} if first else (delta or {}),
                      "logprobs": logprobs}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs}
        choice["finish_reason"] = None
        if meta is not None:
            choice["finish_reason"] = finish_with_calls(finish_reason(meta), chat and choices[index].made_calls)
            choice["matched_stop"] = matched_stop(meta)
        return {**base, "choices": [choice]}

    async def send_chat(response: web.StreamResponse, index: int, text: str, meta: dict | None) -> None:
        """The deltas a chat choice's new text makes (reasoning, content, tool calls), the last with `meta`."""
        deltas = choices[index].feed(text, final=meta is not None)
        for k, delta in enumerate(deltas):
            last = meta is not None and k == len(deltas) - 1
            await sse.send(response, chunk(index, None, meta if last else None, delta=delta))
        if meta is not None and not deltas:
            await sse.send(response, chunk(index, None, meta))

    async def produce(response: web.StreamResponse) -> None:
        for i, sub in enumerate(req.subs):  # role first (chat), echoed prompt first (completions)
            if chat:
                await sse.send(response, chunk(i, None, None, first=True))
            elif req.echo:
                await sse.send(response, chunk(i, req.prompt_texts[sub.prompt_index], None))
        async for index, piece in gen.events():
            if piece["finished"]:
                metas[index] = piece["meta_info"]
                failure = failure_message(piece["meta_info"])
                if failure:
                    raise ApiError(500, f"generation failed: {failure}", type="internal_error")
                if chat:
                    await send_chat(response, index, piece["text"], piece["meta_info"])
                else:
                    await sse.send(response, chunk(index, piece["text"], piece["meta_info"]))
            elif piece["text"]:
                if chat:
                    await send_chat(response, index, piece["text"], None)
                else:
                    await sse.send(response, chunk(index, piece["text"], None))
        if req.include_usage:
            await sse.send(response, {**base, "choices": [], "usage": usage(req, metas)})

    return await sse.stream(request, produce)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model_id:.+}", retrieve_model)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
