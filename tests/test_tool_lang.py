"""`gen(..., tools=[...])` in programs on the default model: the parsed calls in `s.get_meta_info(name)`, every
tool choice, `select` between answering and calling composed with it, and examples/tool_agent.py's two-tool
loop."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import jsonschema
import pytest
from lang_engine_cache import shared_engine

import radixgen as sgl
from radixgen.grammars.tool_formats import TOOL_FORMATS, FunctionSpec
from radixgen.lang.engine_backend import EngineBackend

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tool_agent.py"
TIME = FunctionSpec("get_time", {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 12}},
                                 "required": ["tz"]}, "The time in a time zone.")
ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                     "b": {"type": "integer", "minimum": -99, "maximum": 99}}, "required": ["a", "b"]}}}
SCHEMAS = {"get_time": TIME.parameters, "add": ADD["function"]["parameters"]}


@pytest.fixture(scope="module")
def backend(default_model_path):
    return EngineBackend(shared_engine(str(default_model_path)))


def _valid(calls: list[dict]) -> list[tuple[str, dict]]:
    out = []
    for call in calls:
        args = json.loads(call["arguments"])
        jsonschema.validate(args, SCHEMAS[call["name"]])
        out.append((call["name"], args))
    return out


@sgl.function
def ask_tools(s, question, tool_choice, tool_format, parallel):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("call", tools=[TIME, ADD], tool_choice=tool_choice, tool_format=tool_format,
                               parallel_tool_calls=parallel, max_tokens=60, temperature=0.8))


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_gen_with_tools_returns_the_parsed_calls(backend, fmt):
    states = ask_tools.run_batch(
        [{"question": "What is 2 + 3, and the time in Tokyo?", "tool_choice": choice, "tool_format": fmt,
          "parallel": parallel} for choice, parallel in (("required", True), ("add", True), ("get_time", False))],
        backend=backend)
    required, named_add, named_time = (s.get_meta_info("call") for s in states)
    assert _valid(required["tool_calls"]) and required["content"] == ""
    assert [name for name, _ in _valid(named_add["tool_calls"])] == ["add"]  # a named choice: one call of it
    assert [name for name, _ in _valid(named_time["tool_calls"])] == ["get_time"]


@sgl.function
def answer_or_call(s, question):
    s += sgl.user(question)
    s += sgl.assistant_begin()
    s += sgl.select("next", ["I will call a tool.", "I can answer now."]) + "\n"
    if s["next"] == "I will call a tool.":
        s += sgl.gen("call", tools=[ADD], tool_choice="required", parallel_tool_calls=False, max_tokens=40,
                     temperature=0)
    else:
        s += sgl.gen("answer", max_tokens=8, temperature=0)
    s += sgl.assistant_end()


def test_select_between_answering_and_calling_composes_with_tools(backend):
    s = answer_or_call.run(question="Use the add tool: what is 2 + 3?", backend=backend)
    assert s.error() is None and s["next"] in ("I will call a tool.", "I can answer now.")
    if s["next"] == "I will call a tool.":
        assert [name for name, _ in _valid(s.get_meta_info("call")["tool_calls"])] == ["add"]
        assert s.text().endswith(s["call"] + "<|im_end|>\n")  # the call's text stays in the conversation
    else:
        assert "tool_calls" not in s.get_meta_info("answer")


def test_tool_choice_none_leaves_the_text_free(backend):
    @sgl.function
    def free(s):
        s += sgl.user("Say hello.")
        s += sgl.assistant(sgl.gen("out", tools=[TIME], tool_choice="none", max_tokens=6, temperature=0))

    s = free.run(backend=backend)
    meta = s.get_meta_info("out")
    assert meta["tool_calls"] == [] and meta["content"] == s["out"]


def test_the_tool_agent_example_runs_a_two_tool_loop(backend):
    spec = importlib.util.spec_from_file_location("radixgen_example_tool_agent_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    out = module.run(backend, max_tokens=48)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in module.TOOLS}
    names = [call["name"] for call in out["calls"]]
    assert names[0] == "get_weather" and set(names) == set(schemas)  # both tools, the weather first
    for call in out["calls"]:
        jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])
    assert out["answer"].strip()
