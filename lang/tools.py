"""`gen(..., tools=[...])`: the declared functions of a gen, the grammar that makes its output valid calls, and
the calls read back out of its text into the gen's meta info (`s.get_meta_info(name)["tool_calls"]`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixgen.grammars.constraint import Constraint
from radixgen.grammars.tool_formats import FunctionSpec, ToolChoice, ToolFormat, check_format, tool_call_ebnf
from radixgen.grammars.tool_parsers import parse_tool_output

ToolLike = FunctionSpec | Mapping[str, Any]


@dataclass(frozen=True)
class GenTools:
    """What a gen with tools reads back: the format its calls are written in."""

    format: ToolFormat


def function_spec(tool: ToolLike) -> FunctionSpec:
    """A FunctionSpec from itself, an OpenAI tool (`{"type": "function", "function": {...}}`) or its function."""
    if isinstance(tool, FunctionSpec):
        return tool
    fn = tool.get("function", tool) if tool.get("type") == "function" else tool
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ValueError(f"a tool must be a FunctionSpec or {{name, description, parameters}}, got {tool!r}")
    return FunctionSpec(fn["name"], fn.get("parameters") or {"type": "object", "properties": {}},
                        fn.get("description", ""))


def choice_of(tool_choice: str | Mapping[str, Any]) -> ToolChoice:
    """"auto" / "none" / "required" / a function's name / OpenAI's `{"type": "function", "function": {name}}`."""
    if isinstance(tool_choice, Mapping):
        return ToolChoice("named", tool_choice["function"]["name"])
    if tool_choice in ("auto", "none", "required"):
        return ToolChoice(tool_choice)  # type: ignore[arg-type]  # narrowed by the membership test
    return ToolChoice("named", tool_choice)


def tools_constraint(tools: Sequence[ToolLike], tool_choice: str | Mapping[str, Any], tool_format: str,
                     parallel: bool) -> tuple[Constraint | None, GenTools]:
    """The gen's constraint (None for tool_choice "none") and what its text is read back with."""
    fmt = check_format(tool_format)
    grammar = tool_call_ebnf([function_spec(t) for t in tools], fmt, choice_of(tool_choice), parallel)
    return (None if grammar is None else Constraint("ebnf", grammar)), GenTools(fmt)


def tool_meta(text: str, tools: GenTools) -> dict[str, Any]:
    """The meta info a gen with tools adds: `tool_calls` ([{name, arguments}], arguments as JSON text) and
    `content` (the text before the calls)."""
    parsed = parse_tool_output(text, tools.format)
    return {"tool_calls": [c.to_dict() for c in parsed.complete_calls], "content": parsed.content}
