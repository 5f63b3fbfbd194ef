"""Tool calls, reasoning and structural tags on /v1/chat/completions with the official `openai` client, streamed
and not, on the default model: one server per tool-call format plus one with Qwen3's thinking template, all
over the suite's shared engine."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from lang_engine_cache import shared_engine

from radixgen.grammars.tool_formats import TOOL_FORMATS
from radixgen.server.launch import BackgroundServer
from radixgen.server.state import ServerSettings

openai = pytest.importorskip("openai")
QWEN3_TEMPLATE = Path("/work/shared/vocabs/chat-templates/Qwen-Qwen3-0.6B.jinja")
GREEDY = {"temperature": 0}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "where": {"type": "object", "properties": {"country": {"type": "string", "maxLength": 12},
                                                   "zone": {"enum": ["eu", "us", "asia"]}},
                  "required": ["zone"]}},
        "required": ["city", "unit", "where"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone.",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 16}}, "required": ["tz"]}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what time is it there?"}]


@pytest.fixture(scope="module")
def engine(default_model_path):
    return shared_engine(str(default_model_path))


def _client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module", params=TOOL_FORMATS)
def client(request, engine):
    srv = BackgroundServer(engine, ServerSettings(port=0, owns_engine=False, tool_call_format=request.param)).start()
    yield _client(srv)
    srv.stop()


@pytest.fixture(scope="module")
def hermes(engine):
    srv = BackgroundServer(engine, ServerSettings(port=0, owns_engine=False)).start()
    yield _client(srv)
    srv.stop()


@pytest.fixture(scope="module")
def thinking(engine):
    if not QWEN3_TEMPLATE.exists():
        pytest.skip("the shared Qwen3 chat template is not here")
    settings = ServerSettings(port=0, owns_engine=False, chat_template=QWEN3_TEMPLATE.read_text())
    srv = BackgroundServer(engine, settings).start()
    yield _client(srv)
    srv.stop()


def valid_calls(calls) -> list[tuple[str, dict]]:
    out = []
    for call in calls or []:
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        assert call.id and call.type == "function"
        out.append((call.function.name, args))
    return out


def streamed(client, **kwargs):
    """A streamed chat completion as the client's own helper assembles it, and its raw chunks."""
    with client.chat.completions.stream(model="m", **kwargs) as stream:
        chunks = list(stream)
        final = stream.get_final_completion()
    return final, chunks


NAMED = {"type": "function", "function": {"name": "get_time"}}


def test_every_format_calls_and_streams_the_same(client):
    kwargs = {"messages": ASK, "tools": TOOLS, "tool_choice": NAMED, "parallel_tool_calls": False,
              "max_tokens": 60, **GREEDY}
    whole = client.chat.completions.create(model="m", **kwargs)
    calls = valid_calls(whole.choices[0].message.tool_calls)
    assert [name for name, _ in calls] == ["get_time"] and whole.choices[0].finish_reason == "tool_calls"
    final, chunks = streamed(client, **kwargs)
    assert valid_calls(final.choices[0].message.tool_calls) == calls
    assert final.choices[0].finish_reason == "tool_calls"
    deltas = [c.chunk.choices[0].delta for c in chunks if c.type == "chunk" and c.chunk.choices]
    firsts = [d.tool_calls[0] for d in deltas if d.tool_calls and d.tool_calls[0].id]
    assert [f.function.name for f in firsts] == ["get_time"]  # the name comes first, once


def test_required_parallel_nested_streamed(hermes):
    kwargs = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 240, "temperature": 0.9,
              "seed": 1}
    final, chunks = streamed(hermes, **kwargs)
    calls = valid_calls(final.choices[0].message.tool_calls)
    assert calls and final.choices[0].finish_reason == "tool_calls"
    deltas = [c.chunk.choices[0].delta for c in chunks if c.type == "chunk" and c.chunk.choices]
    indexes = sorted({d.tool_calls[0].index for d in deltas if d.tool_calls})
    assert indexes == list(range(len(calls)))
    one = hermes.chat.completions.create(model="m", **{**kwargs, "parallel_tool_calls": False, "stream": False})
    assert len(valid_calls(one.choices[0].message.tool_calls)) == 1


def test_none_and_auto(hermes):
    chunks = list(hermes.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="none",
                                                 max_tokens=12, stream=True, **GREEDY))
    assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    for seed in range(2):
        r = hermes.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=80, temperature=1.0,
                                           seed=seed)
        message = r.choices[0].message
        valid_calls(message.tool_calls)  # whatever it chose, a call is valid
        assert message.tool_calls or message.content is not None


def test_tool_result_round_trip(hermes):
    first = hermes.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=120, **GREEDY)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"result": "sunny, 21 C"})}]
    second = hermes.chat.completions.create(model="m", messages=history, tools=TOOLS, tool_choice="none",
                                            max_tokens=16, **GREEDY)
    assert second.choices[0].message.content and second.usage.prompt_tokens > first.usage.prompt_tokens
    again = hermes.chat.completions.create(model="m", messages=history, tools=TOOLS, tool_choice="none",
                                           max_tokens=4, **GREEDY)
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # the radix cache kept the conversation


def test_errors_name_the_function_and_pointer(hermes):
    bad = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "(?<=a)b"}}}}}
    with pytest.raises(openai.BadRequestError, match=r"tools\[1\]\.function\.parameters \(f\).*/properties/x"):
        hermes.chat.completions.create(model="m", messages=ASK, tools=[TIME, bad], tool_choice="required")
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        hermes.chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})


def test_models_retrieve_and_logprobs_cover_calls(hermes):
    model = hermes.models.list().data[0].id
    assert hermes.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        hermes.models.retrieve("no-such-model")
    r = hermes.chat.completions.create(model="m", messages=ASK, tools=[TIME], tool_choice="required", logprobs=True,
                                       parallel_tool_calls=False, max_tokens=40, **GREEDY)
    tokens = "".join(t.token for t in r.choices[0].logprobs.content)
    assert "<tool_call>" in tokens and r.usage.completion_tokens == len(r.choices[0].logprobs.content)


def test_structural_tag(hermes):
    fmt = {"type": "structural_tag", "triggers": ["<function="],
           "structures": [{"begin": "<function=get_time>", "schema": SCHEMAS["get_time"], "end": "</function>"}]}
    prompt = [{"role": "user", "content": "Write <function=get_time>{\"tz\": \"UTC\"}</function> twice."}]
    for seed in range(2):
        r = hermes.chat.completions.create(model="m", messages=prompt, response_format=fmt, max_tokens=40,
                                           temperature=1.0, seed=seed)
        text = r.choices[0].message.content
        for piece in text.split("<function=")[1:]:
            if "</function>" in piece:  # a region the model finished (max_tokens may cut the last one)
                body = piece.removeprefix("get_time>").split("</function>")[0]
                jsonschema.validate(json.loads(body), SCHEMAS["get_time"])
    with pytest.raises(openai.BadRequestError, match="begin"):
        hermes.chat.completions.create(model="m", messages=prompt, max_tokens=4, response_format={
            **fmt, "structures": [{"begin": "<tool>", "schema": {}, "end": "</tool>"}]})


def test_reasoning_on_and_off(thinking):
    schema = {"type": "object", "properties": {"answer": {"type": "integer", "maximum": 99}}, "required": ["answer"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    ask = [{"role": "user", "content": "What is 2 + 3? Think first."}]
    kwargs = {"messages": ask, "response_format": fmt, "max_tokens": 60, "temperature": 1.0, "seed": 4}
    r = thinking.chat.completions.create(model="m", **kwargs)
    message = r.choices[0].message
    if r.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(message.content), schema)  # the constraint applies after the thinking
    assert "<think>" not in (message.content or "")
    off = thinking.chat.completions.create(model="m", extra_body={"chat_template_kwargs": {"enable_thinking": False}},
                                           **{**kwargs, "max_tokens": 24})
    jsonschema.validate(json.loads(off.choices[0].message.content), schema)
    assert not (off.choices[0].message.model_extra or {}).get("reasoning_content")
    chunks = [c for c in thinking.chat.completions.create(model="m", stream=True, **kwargs) if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == (message.content or "")
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks)
    assert reasoning == ((message.model_extra or {}).get("reasoning_content") or "")
    joined = thinking.chat.completions.create(model="m", extra_body={"separate_reasoning": False},
                                              **{**kwargs, "max_tokens": 8})
    assert "reasoning_content" not in (joined.choices[0].message.model_extra or {})


def test_reasoning_with_tools(thinking):
    r = thinking.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                         max_tokens=80, temperature=1.0, seed=2, reasoning_effort="low")
    if r.choices[0].finish_reason == "tool_calls":
        assert valid_calls(r.choices[0].message.tool_calls)
    assert "<tool_call>" not in (r.choices[0].message.content or "")


def test_thinking_budget_closes_the_section_and_the_answer_follows(thinking, hermes):
    schema = {"type": "object", "properties": {"answer": {"type": "integer", "maximum": 99}}, "required": ["answer"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    ask = [{"role": "user", "content": "What is 2 + 3? Think first."}]
    for seed in (4, 5):
        r = thinking.chat.completions.create(model="m", messages=ask, response_format=fmt, max_tokens=60,
                                             temperature=1.0, seed=seed, extra_body={"thinking_budget": 10})
        message = r.choices[0].message
        assert r.choices[0].finish_reason == "stop"  # the budget left the answer room to finish
        jsonschema.validate(json.loads(message.content), schema)
    with pytest.raises(openai.BadRequestError, match="thinking_budget"):
        hermes.chat.completions.create(model="m", messages=ask, max_tokens=4, extra_body={"thinking_budget": 10})


def test_the_client_librarys_pydantic_tools_parse_end_to_end(hermes):
    """The openai library's own typed tools (`pydantic_function_tool`, strict schemas) through `parse` and the
    stream helper: the arguments come back as the pydantic model."""
    from typing import Literal

    from pydantic import BaseModel

    class GetWeather(BaseModel):
        city: str
        unit: Literal["celsius", "fahrenheit"]

    tool = openai.pydantic_function_tool(GetWeather)
    ask = [{"role": "user", "content": "What's the weather in Paris, in celsius?"}]
    parse = getattr(hermes.chat.completions, "parse", None) or hermes.beta.chat.completions.parse
    r = parse(model="m", messages=ask, tools=[tool], tool_choice="required", max_tokens=80, **GREEDY)
    parsed = r.choices[0].message.tool_calls[0].function.parsed_arguments
    assert isinstance(parsed, GetWeather)
    final, _ = streamed(hermes, messages=ask, tools=[tool], tool_choice="required", max_tokens=80, **GREEDY)
    assert final.choices[0].message.tool_calls[0].function.parsed_arguments == parsed


def test_instructor_tools_mode_end_to_end(hermes):
    """`instructor` (a test-only dependency) in its TOOLS mode: it declares the response model as one function
    and names it in `tool_choice`; whole and as partial objects streamed, the model comes back validated."""
    instructor = pytest.importorskip("instructor")
    from typing import Literal

    from pydantic import BaseModel, Field

    class Weather(BaseModel):
        """The weather of a city."""

        city: str = Field(max_length=24)
        unit: Literal["celsius", "fahrenheit"]

    client = instructor.from_openai(hermes, mode=instructor.Mode.TOOLS)
    ask = [{"role": "user", "content": "What's the weather in Paris, in celsius?"}]
    for seed in range(2):
        weather, completion = client.chat.completions.create_with_completion(
            model="m", response_model=Weather, messages=ask, max_retries=0, max_tokens=80, temperature=1.0,
            seed=seed)
        assert isinstance(weather, Weather) and completion.choices[0].finish_reason == "tool_calls"
        assert len(completion.choices[0].message.tool_calls) == 1  # a named choice makes one call
    partials = list(client.chat.completions.create_partial(model="m", response_model=Weather, messages=ask,
                                                           max_retries=0, max_tokens=80, temperature=0))
    assert len(partials) > 1 and Weather.model_validate(partials[-1].model_dump()) == partials[-1]


@pytest.mark.parametrize("choice", ["required", "none"])
def test_required_always_calls_and_none_never_does(client, choice):
    for seed in range(3):
        r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=choice,
                                           parallel_tool_calls=False, max_tokens=90 if choice == "required" else 24,
                                           temperature=1.0, seed=seed)
        message = r.choices[0].message
        if choice == "required":
            assert r.choices[0].finish_reason == "tool_calls" and len(valid_calls(message.tool_calls)) == 1
        else:
            assert not message.tool_calls and r.choices[0].finish_reason != "tool_calls"


def test_formats_are_read_from_the_chat_templates():
    from radixgen.server.openai_tools import is_reasoning_template, template_knows_tools, template_tool_format

    folder = QWEN3_TEMPLATE.parent
    if not folder.exists():
        pytest.skip("the shared chat templates are not here")
    expected = {"Qwen-Qwen2.5-7B-Instruct": ("hermes", True, False), "Qwen-Qwen3-0.6B": ("hermes", True, True),
                "meta-llama-Llama-3.1-8B-Instruct": ("llama3", True, False),
                "mistralai-Mistral-Nemo-Instruct-2407": ("mistral", True, False),
                "google-gemma-2-2b-it": ("hermes", False, False)}
    for name, want in expected.items():
        text = (folder / f"{name}.jinja").read_text()
        assert (template_tool_format(text), template_knows_tools(text), is_reasoning_template(text)) == want, name


def test_a_template_that_knows_tools_renders_the_tool_turns(engine):
    """Qwen3's template gets the tools and the tool turns as transformers passes them and writes its own
    `<tool_call>` and `<tool_response>` blocks."""
    from radixgen.server.chat_messages import chat_messages

    if not QWEN3_TEMPLATE.exists():
        pytest.skip("the shared Qwen3 chat template is not here")
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "CET"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"time": "12:00"}'}]
    text = engine.tokenizer.apply_chat_template(chat_messages(history), add_generation_prompt=True, tools=[TIME],
                                                chat_template=QWEN3_TEMPLATE.read_text())
    assert '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>' in text
    assert '<tool_response>\n{"time": "12:00"}\n</tool_response>' in text and '"name": "get_time"' in text


def test_reasoning_effort_reaches_the_template(engine):
    template = ("{% if reasoning_effort is defined %}Reasoning: {{ reasoning_effort }}\n{% endif %}"
                "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:")
    srv = BackgroundServer(engine, ServerSettings(port=0, owns_engine=False, chat_template=template)).start()
    try:
        c = _client(srv)
        plain = c.chat.completions.create(model="m", messages=ASK, max_tokens=1, **GREEDY)
        high = c.chat.completions.create(model="m", messages=ASK, max_tokens=1, reasoning_effort="high", **GREEDY)
        assert high.usage.prompt_tokens > plain.usage.prompt_tokens
        with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
            c.chat.completions.create(model="m", messages=ASK, max_tokens=1, extra_body={"reasoning_effort": "max"})
    finally:
        srv.stop()


# DeepSeek-R1's way: the generation prompt opens the thinking section, so the output starts inside it.
OPENED_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                   "<|im_start|>assistant\n<think>\n{# the answer follows </think> #}")


def test_reasoning_tokens_have_logprobs_and_a_joined_stream_keeps_the_section(engine):
    srv = BackgroundServer(engine, ServerSettings(port=0, owns_engine=False, chat_template=OPENED_TEMPLATE)).start()
    try:
        c = _client(srv)
        kwargs = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 16, "temperature": 1.0,
                  "seed": 4}
        r = c.chat.completions.create(model="m", logprobs=True, top_logprobs=2, **kwargs)
        reasoning = (r.choices[0].message.model_extra or {}).get("reasoning_content")
        content = r.choices[0].logprobs.content
        assert len(content) == r.usage.completion_tokens
        spelled = "".join(t.token for t in content)
        assert reasoning and spelled.strip().startswith(reasoning.strip())
        assert all(t.logprob is not None and len(t.top_logprobs) == 2 for t in content)  # free text: all sampled
        chunks = [x for x in c.chat.completions.create(model="m", stream=True, logprobs=True, **kwargs) if x.choices]
        streamed = "".join((x.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for x in chunks)
        assert streamed == reasoning and [t.token for x in chunks if x.choices[0].logprobs
                                          for t in x.choices[0].logprobs.content] == [t.token for t in content]
        joined = [x for x in c.chat.completions.create(model="m", stream=True,
                                                       extra_body={"separate_reasoning": False}, **kwargs)
                  if x.choices]
        assert not any((x.choices[0].delta.model_extra or {}).get("reasoning_content") for x in joined)
        whole = c.chat.completions.create(model="m", extra_body={"separate_reasoning": False}, **kwargs)
        text = "".join(x.choices[0].delta.content or "" for x in joined)
        assert text == whole.choices[0].message.content and text.strip().startswith(reasoning.strip())
    finally:
        srv.stop()


BAD_TOOL_REQUESTS = [  # (extra fields, the param the 400 names)
    ({"tool_choice": "required"}, "tool_choice"),  # no tools to choose from
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [TIME, TIME], "tool_choice": "required"}, "tools"),  # names must be unique
    ({"tools": [TIME], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [TIME], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tools"),
    ({"tools": [TIME], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
]


@pytest.mark.parametrize("extra, param", BAD_TOOL_REQUESTS)
def test_bad_tool_requests_are_400s_naming_the_field(hermes, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        hermes.chat.completions.create(model="m", messages=ASK, max_tokens=4, extra_body=extra)
    assert info.value.param == param, info.value.message
