"""OpenAI request bodies -> engine sub-requests: field checks, sampling options, chat rendering.

Names follow OpenAI's API; radixgen/SGLang extras (`regex`, `ebnf`, `grammar`, `json_schema`, `top_k`,
`min_p`, `min_tokens`, `repetition_penalty`, `penalty_alpha`, `ignore_eos`, `stop_token_ids`, `skip_special_tokens`,
`no_stop_trim`, `json_schema_infer_types`, `rid`) are accepted as extra body fields, and so is beam search (vLLM's
`use_beam_search`, with `length_penalty`, `early_stopping`, and radixgen's `num_beams`, `no_repeat_ngram_size`;
`_beam_search` says how they combine). An unknown field is a 400, never silently dropped.
`response_format` maps to a constraint: `json_object` -> the JSON Schema `{"type": "object"}` (a JSON
object, as OpenAI's JSON mode promises), `json_schema` -> its `schema` (always enforced, `strict` or not),
`structural_tag` -> its grammar (grammars/structural_tag.py). Chat requests may declare `tools` (the tool-call
grammar of openai_tools.py) and reasoning options (`chat_template_kwargs`, `reasoning_effort`,
`separate_reasoning`). A request that may call tools is decoded with its special tokens whatever
`skip_special_tokens` says (unless `no_stop_trim`, which would show the stop token too): a marker such as
Mistral's `[TOOL_CALLS]` is a special token, and the parser must see it; the grammar admits no other.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixgen.grammars.constraint import CONSTRAINT_KINDS
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.structural_tag import structural_tag_ebnf, structural_tag_from_dict
from radixgen.runtime.best_of import SampleGroup, sample_groups
from radixgen.runtime.sampling_params import GREEDY_TEMPERATURE, OPENAI_NAMES, SamplingParams, SamplingParamsError
from radixgen.server.chat_messages import chat_messages, written_in
from radixgen.server.errors import ApiError, bad_request, from_engine_error
from radixgen.server.fields import Fields, is_int, is_number, token_id_list
from radixgen.server.generation import LogprobOptions, SubRequest, check_fanout, sample_requests
from radixgen.server.openai_tools import (
    ChatShape,
    ToolRequest,
    answer_rules,
    is_reasoning_template,
    read_reasoning,
    read_tools,
    request_grammar,
    server_tool_format,
    template_knows_tools,
    thinking_closed,
    thinking_opened,
)
from radixgen.server.state import ServerState

MAX_N = 64
MAX_STOP = 16
MAX_TOP_LOGPROBS = 20
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the context


@dataclass
class OpenAIRequest:
    """One parsed OpenAI request: what to run, and how to shape the answer."""

    rid: str
    prompts: list[list[int]]  # token ids per prompt
    prompt_texts: list[str]  # for echo
    subs: list[SubRequest]  # num_samples per prompt, in order: choice index = position (of those returned)
    logprobs: LogprobOptions
    want_logprobs: bool
    top_logprobs: int
    stream: bool
    include_usage: bool
    echo: bool = False
    shape: ChatShape = dataclasses.field(default_factory=ChatShape)  # how a chat choice's text is read back
    # Each prompt's sub-requests, of which the choices are picked: with best_of > n the n best, with a beam search
    # its beams (None: every sub-request is a choice).
    picks: list[SampleGroup] | None = None


# Reads one OpenAI body field as the value of its SamplingParams field: (fields, body name, the engine's default,
# vocab size) -> value, or None to leave the field at its default. OpenAI's ranges are narrower than the engine's.
Reader = Callable[[Fields, str, Any, int], Any]


def _number(low: float, high: float, low_open: bool = False) -> Reader:
    return lambda f, name, default, _vocab: f.number(name, default, low=low, high=high, low_open=low_open)


def _integer(low: int | None = None, high: int | None = None) -> Reader:
    return lambda f, name, default, _vocab: f.integer(name, default, low=low, high=high)


def _finite(f: Fields, name: str, default: float, _vocab: int) -> float:
    return f.number(name, default)


def _boolean(f: Fields, name: str, default: bool, _vocab: int) -> bool:
    return f.boolean(name, default)


def _stop(f: Fields, name: str, _default: Any, _vocab: int) -> list[str] | None:
    stop = f.raw(name)
    if stop is None:
        return None
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise bad_request(name, "must be a non-empty string or an array of non-empty strings")
    if len(items) > MAX_STOP:
        raise bad_request(name, f"at most {MAX_STOP} stop strings, got {len(items)}")
    return items


def _logit_bias(f: Fields, name: str, _default: Any, vocab_size: int) -> dict[int, float] | None:
    bias = f.obj(name)
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < vocab_size):
            raise bad_request(name, f"keys must be token ids in [0, {vocab_size}), got {key!r}")
        if not is_number(value) or not -100 <= value <= 100:
            raise bad_request(name, f"values must be numbers in [-100, 100], got {value!r} for {key}")
        out[int(key)] = float(value)
    return out


def _token_ids(f: Fields, name: str, _default: Any, vocab_size: int) -> list[int] | None:
    return token_id_list(f.raw(name), name, vocab_size) if f.has(name) else None


def _early_stopping(f: Fields, name: str, default: bool | str, _vocab: int) -> bool | str:
    value = f.raw(name, default)
    if value not in (True, False, "never"):
        raise bad_request(name, f"must be true, false or \"never\", got {value!r}")
    return value


# SamplingParams field -> how its OpenAI body field (OPENAI_NAMES, else the same name) is read, in reading order:
# the first bad field is the one a 400 names. `max_tokens` is read by each route (its default differs).
SAMPLING_READERS: dict[str, Reader] = {
    "temperature": _number(0.0, 2.0),
    "top_p": _number(0.0, 1.0, low_open=True),
    "presence_penalty": _number(-2.0, 2.0),
    "frequency_penalty": _number(-2.0, 2.0),
    "n": _integer(low=1, high=MAX_N),
    "best_of": _integer(low=1, high=MAX_N),
    "thinking_budget": _integer(low=0),
    "seed": _integer(),
    "stop": _stop,
    "logit_bias": _logit_bias,
    "top_k": _integer(low=-1),
    "min_p": _number(0.0, 1.0),
    "min_new_tokens": _integer(low=0),
    "repetition_penalty": _number(0.0, 10.0, low_open=True),
    "ignore_eos": _boolean,
    "skip_special_tokens": _boolean,
    "no_stop_trim": _boolean,
    "stop_token_ids": _token_ids,
    "num_beams": _integer(low=1, high=MAX_N),
    "length_penalty": _finite,
    "early_stopping": _early_stopping,
    "no_repeat_ngram_size": _integer(low=0),
    "penalty_alpha": _number(0.0, 1.0),
    "json_schema_infer_types": _boolean,
}
# Constraint fields in the order they are checked and named when several are given (JSON Schema last).
_CONSTRAINT_ORDER = tuple(sorted(CONSTRAINT_KINDS, key=lambda kind: kind == "json_schema"))
_DEFAULTS = SamplingParams()

_COMMON = {"model", "max_tokens", "stream", "stream_options", "response_format", "logprobs", "user", "metadata",
           "store", "service_tier", "rid", "use_beam_search", *CONSTRAINT_KINDS,
           *(OPENAI_NAMES.get(k, k) for k in SAMPLING_READERS)}
COMPLETION_FIELDS = frozenset(_COMMON | {"prompt", "echo", "suffix"})
CHAT_FIELDS = frozenset(_COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                                   "parallel_tool_calls", "chat_template_kwargs", "reasoning_effort",
                                   "separate_reasoning"})


def _response_format(f: Fields) -> tuple[str, Any] | None:
    """The constraint a response_format asks for, as (engine field, value), or None."""
    fmt = f.obj("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_schema", {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise bad_request("response_format.json_schema", "must be an object with `name` and `schema`")
        name = spec.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise bad_request("response_format.json_schema.name", "must be a string of 1-64 characters")
        if spec.get("strict") is not None and not isinstance(spec.get("strict"), bool):
            raise bad_request("response_format.json_schema.strict", "must be a boolean")
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema", "must be a JSON Schema object")
        return "json_schema", schema
    if kind == "structural_tag":
        try:
            return "ebnf", structural_tag_ebnf(structural_tag_from_dict(fmt))
        except GrammarError as exc:
            message = str(exc)
            param = message.split(":", 1)[0] if message.startswith("response_format") else "response_format"
            raise ApiError(400, message, param=param.split(" ", 1)[0]) from None
    raise bad_request("response_format.type", f"must be 'text', 'json_object', 'json_schema' or 'structural_tag', "
                                              f"got {kind!r}")


def sampling_params(f: Fields, state: ServerState, max_tokens: int | None) -> SamplingParams:
    """The SamplingParams the engine runs for the OpenAI fields and extras of one request."""
    sp: dict[str, Any] = {"max_new_tokens": max_tokens}
    for field, read in SAMPLING_READERS.items():
        sp[field] = read(f, OPENAI_NAMES.get(field, field), getattr(_DEFAULTS, field), state.vocab_size)
    if max_tokens is not None and sp["min_new_tokens"] > max_tokens:
        raise bad_request("min_tokens", f"must not exceed max_tokens ({max_tokens})")
    _beam_search(f, sp)
    _contrastive_search(f, sp)
    constraints: list[tuple[str, Any]] = [(k, f.raw(k)) for k in _CONSTRAINT_ORDER if f.has(k)]
    for name, value in constraints:
        if name == "json_schema" and not isinstance(value, (dict, str)):
            raise bad_request(name, "must be a JSON Schema object or its JSON text")
        if name != "json_schema" and not isinstance(value, str):
            raise bad_request(name, "must be a string")
    fmt = _response_format(f)
    if fmt is not None:
        constraints.append(fmt)
    if len(constraints) > 1:
        names = ["response_format" if c is fmt else c[0] for c in constraints]
        raise bad_request(names[1], f"at most one constraint per request, got {names}")
    if constraints:
        sp[constraints[0][0]] = constraints[0][1]
    try:
        return SamplingParams.from_dict(sp)
    except SamplingParamsError as exc:
        raise from_engine_error(exc) from None


def _beam_search(f: Fields, sp: dict[str, Any]) -> None:
    """Beam search's fields into `sp`: vLLM's `use_beam_search` is a search of width `best_of`, else `n`, whose
    `n` best beams are the choices (`num_beams`, if given too, must be that width); `num_beams` alone is the
    width, with `n` choices. With either, temperature defaults to 0 (OpenAI's default of 1 would be refused) and
    an explicit one above 0 is a 400."""
    use = f.boolean("use_beam_search")
    if use:
        width = sp["n"] if sp["best_of"] is None else sp["best_of"]
        if f.has("num_beams") and sp["num_beams"] != width:
            raise bad_request("num_beams", f"must equal use_beam_search's beam width (best_of, else n) when both are "
                                           f"given: got num_beams={sp['num_beams']}, width {width}")
        sp["num_beams"], sp["best_of"] = width, None
    if not (use or sp["num_beams"] > 1):
        return
    if sp["n"] > sp["num_beams"]:
        raise bad_request("n", f"must be <= the beam width ({sp['num_beams']}): a beam search returns at most its "
                               f"beams, got {sp['n']}")
    if not f.has("temperature"):
        sp["temperature"] = 0.0
    elif sp["temperature"] >= GREEDY_TEMPERATURE:
        raise bad_request("temperature", f"must be 0 with beam search (use_beam_search, num_beams > 1): it is "
                                         f"deterministic, got {sp['temperature']}")


def _contrastive_search(f: Fields, sp: dict[str, Any]) -> None:
    """With `penalty_alpha` > 0 (contrastive search among `top_k` candidates), temperature defaults to 0, as for
    beam search (it is deterministic); an explicit one above 0 is a 400."""
    if sp["penalty_alpha"] <= 0.0:
        return
    if not f.has("temperature"):
        sp["temperature"] = 0.0
    elif sp["temperature"] >= GREEDY_TEMPERATURE:
        raise bad_request("temperature", f"must be 0 with contrastive search (penalty_alpha > 0): it is "
                                         f"deterministic, got {sp['temperature']}")


def _check_beam_request(sp: SamplingParams, stream: bool, logprobs_field: str | None) -> None:
    """What a beam search cannot be asked for: a stream (the best beams are known only at the end), logprobs
    (`logprobs_field`: the field that asked; a beam has a cumulative logprob and a score, not token logprobs)."""
    if not sp.is_beam_search:
        return
    if stream:
        raise bad_request("stream", "is not supported with beam search (use_beam_search, num_beams > 1): the best "
                                    "beams are known only at the end")
    if logprobs_field is not None:
        raise bad_request(logprobs_field, "is not supported with beam search (use_beam_search, num_beams > 1)")


def _stream_flags(f: Fields) -> tuple[bool, bool]:
    stream = f.boolean("stream")
    options = f.obj("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise bad_request("stream_options", "is only allowed with stream: true")
        include_usage = Fields(options, "stream_options").boolean("include_usage")
    return stream, include_usage


def _common_checks(f: Fields) -> None:
    f.string("model")
    f.string("user")


def _subs(prompts: list[list[int]], sp: SamplingParams) -> list[SubRequest]:
    check_fanout(len(prompts), sp.num_samples, "n" if sp.best_of is None else "best_of")
    return [sub for i, ids in enumerate(prompts) for sub in sample_requests(ids, sp, i)]


def _picks(prompts: list[list[int]], sp: SamplingParams, stream: bool) -> list[SampleGroup] | None:
    """The sample groups to pick the choices from when best_of > n or for a beam search's beams (None: every
    sample is a choice); best_of > n is refused with stream."""
    if sp.picks_best and stream:
        raise bad_request("best_of", "must equal n with stream: true (the best samples are known only once all "
                                     "have finished)")
    if not (sp.picks_best or sp.is_beam_search):
        return None
    return sample_groups([sp] * len(prompts))


# ------------------------------------------------------------------------------------------------ completions
async def parse_completion(body: dict, state: ServerState) -> OpenAIRequest:
    f = Fields(body)
    f.reject_unknown(COMPLETION_FIELDS)
    _common_checks(f)
    if f.has("suffix"):
        raise bad_request("suffix", "is not supported")
    prompt = f.raw("prompt")
    if isinstance(prompt, str):
        texts = [prompt]
        prompts = await state.encode(texts)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        texts = prompt
        prompts = await state.encode(texts)
    elif isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
        prompts = [token_id_list(prompt, "prompt", state.vocab_size)]
        texts = None
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts = [token_id_list(p, f"prompt[{i}]", state.vocab_size) for i, p in enumerate(prompt)]
        texts = None
    else:
        raise bad_request("prompt", "must be a string, an array of strings, an array of token ids, or an array of "
                                    "arrays of token ids (non-empty)")
    if not prompts or not all(prompts):
        raise bad_request("prompt", "must not be empty")
    max_tokens = f.integer("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS, low=0)
    echo = f.boolean("echo")
    logprobs_n = f.integer("logprobs", None, low=0, high=MAX_TOP_LOGPROBS)
    sp = sampling_params(f, state, max_tokens)
    for ids in prompts:
        state.check_fits(ids, max_tokens, "prompt", "max_tokens")
    stream, include_usage = _stream_flags(f)
    _check_beam_request(sp, stream, "logprobs" if logprobs_n is not None else None)
    if texts is None and echo:
        tok = state.engine.tokenizer
        texts = [tok.decode(ids) for ids in prompts]
    want = logprobs_n is not None
    return OpenAIRequest(
        rid=f.string("rid", nonempty=True) or f"cmpl-{uuid.uuid4().hex}", prompts=prompts, prompt_texts=texts or [],
        subs=_subs(prompts, sp),
        logprobs=LogprobOptions(want or sp.picks_best, logprobs_n or 0, 0 if (want and echo) else None),
        want_logprobs=want, top_logprobs=logprobs_n or 0, stream=stream, include_usage=include_usage, echo=echo,
        picks=_picks(prompts, sp, stream))


# ------------------------------------------------------------------------------------------------ chat
@dataclass(frozen=True)
class RenderedChat:
    text: str
    ids: list[int]


def render_chat(state: ServerState, messages: list[dict[str, Any]], tools: ToolRequest | None = None,
                template_kwargs: dict[str, Any] | None = None) -> RenderedChat:
    """The prompt of a conversation through the chat template (`--chat-template`'s or the model's), tools and
    tool turns written in by the server when the template knows none."""
    tok = state.engine.tokenizer
    template = state.chat_template
    declared = tools.tools if tools is not None else None
    turns, template_tools = messages, declared
    has_tool_turns = any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    if (declared or has_tool_turns) and not template_knows_tools(template):
        turns = written_in(messages, declared, server_tool_format(state.settings.tool_call_format, template))
        template_tools = None
    try:
        text = tok.apply_chat_template(turns, add_generation_prompt=True, tools=template_tools,
                                       chat_template=template, **(template_kwargs or {}))
    except Exception as exc:
        raise bad_request("messages", f"the chat template refused them: {exc}") from None
    return RenderedChat(text, tok.encode(text, add_special_tokens=False))


def _chat_constraint(sp: SamplingParams, tools: ToolRequest | None, state: ServerState, prompt: str,
                     ) -> tuple[SamplingParams, bool, bool]:
    """The sampling params with the request's one grammar (tool calls, or the constraint after a thinking
    section), whether the template reasons, and whether the prompt opened the thinking section."""
    template = state.chat_template
    reasoning = is_reasoning_template(template)
    opened = reasoning and thinking_opened(prompt)
    thinks = reasoning and not thinking_closed(prompt)
    if sp.thinking_budget is not None and not reasoning:
        raise bad_request("thinking_budget", "needs a reasoning chat template (one with a </think> section)")
    if not thinks:
        sp = dataclasses.replace(sp, thinking_budget=None)  # the prompt closed the section: nothing to cap
    calling = tools is not None and tools.choice.mode != "none"
    given = sp.constraint
    if not calling and not (thinks and given is not None):
        return sp, reasoning, opened
    fmt = server_tool_format(state.settings.tool_call_format, template)
    answer = answer_rules(tools if calling else None, fmt, None if given is None else (given.kind, given.source))
    assert answer is not None
    cleared: dict[str, Any] = {kind: None for kind in CONSTRAINT_KINDS}
    return (dataclasses.replace(sp, **{**cleared, "ebnf": request_grammar(answer, thinks, opened)}), reasoning,
            opened)


async def parse_chat(body: dict, state: ServerState) -> OpenAIRequest:
    f = Fields(body)
    f.reject_unknown(CHAT_FIELDS)
    _common_checks(f)
    tools = read_tools(f)
    reasoning_options = read_reasoning(f)
    messages = chat_messages(f.raw("messages"))
    rendered = await state.run_blocking(render_chat, state, messages, tools, reasoning_options.template_kwargs)
    ids = rendered.ids
    max_field = "max_completion_tokens" if f.has("max_completion_tokens") else "max_tokens"
    max_tokens = f.integer(max_field, None, low=1)
    f.raw("max_tokens")
    state.check_fits(ids, max_tokens, "messages", max_field)
    want = f.boolean("logprobs")
    top = f.integer("top_logprobs", 0, low=0, high=MAX_TOP_LOGPROBS)
    if top and not want:
        raise bad_request("top_logprobs", "needs logprobs: true")
    sp, reasoning, opened = _chat_constraint(sampling_params(f, state, max_tokens), tools, state, rendered.text)
    calling = tools is not None and tools.choice.mode != "none"
    markers_kept = calling and not sp.no_stop_trim
    if markers_kept:  # the tool-call markers reach the parser (the grammar lets no other special token through)
        sp = dataclasses.replace(sp, skip_special_tokens=False)
    shape = ChatShape(server_tool_format(state.settings.tool_call_format, state.chat_template) if calling else None,
                      reasoning and reasoning_options.separate, opened, markers_kept)
    stream, include_usage = _stream_flags(f)
    _check_beam_request(sp, stream, "logprobs" if want else None)
    return OpenAIRequest(
        rid=f.string("rid", nonempty=True) or f"chatcmpl-{uuid.uuid4().hex}", prompts=[ids], prompt_texts=[],
        subs=_subs([ids], sp), logprobs=LogprobOptions(want or sp.picks_best, top, None), want_logprobs=want,
        top_logprobs=top, stream=stream, include_usage=include_usage, shape=shape, picks=_picks([ids], sp, stream))
