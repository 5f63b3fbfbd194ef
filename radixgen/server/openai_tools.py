"""The chat request's agent fields: `tools`, `tool_choice`, `parallel_tool_calls`, the reasoning options, and the
one grammar they and a response_format make together.

A tool choice other than `none` constrains the output to the tool-call grammar of grammars/tool_formats.py in
the server's format (`--tool-call-format`, else read from the chat template). On a reasoning template (one
with a `</think>` section) any constraint applies after the thinking section only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from radixgen.grammars.ebnf_embed import EmbeddedRules, constraint_rules
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.reasoning import THINK_CLOSE, THINK_OPEN, thinking_ebnf
from radixgen.grammars.tool_formats import (
    FunctionSpec,
    ToolChoice,
    ToolFormat,
    check_format,
    tool_call_rules,
)
from radixgen.server.errors import ApiError, bad_request
from radixgen.server.fields import Fields

REASONING_EFFORTS = ("minimal", "low", "medium", "high")


@dataclass(frozen=True)
class ToolRequest:
    """The request's declared functions (as the template gets them and as specs), choice and parallelism."""

    tools: list[dict[str, Any]]
    functions: list[FunctionSpec]
    choice: ToolChoice
    parallel: bool


@dataclass(frozen=True)
class ChatShape:
    """How a chat output is read back: tool calls in `tool_format` (None: not parsed), and whether reasoning
    is split off (`reasoning`), with the prompt having opened the thinking section already (`thinking_opened`);
    `markers_kept`: the text was decoded with its special tokens, so a call opens only at the format's marker."""

    tool_format: ToolFormat | None = None
    reasoning: bool = False
    thinking_opened: bool = False
    markers_kept: bool = False


def template_tool_format(template: str | None) -> ToolFormat:
    """The tool-call format a chat template writes calls in (hermes when it says nothing)."""
    text = template or ""
    if "[TOOL_CALLS]" in text:
        return "mistral"
    if "<|python_tag|>" in text or ('"parameters"' in text and "<|eot_id|>" in text):
        return "llama3"
    return "hermes"


def template_knows_tools(template: str | None) -> bool:
    """Whether the template renders `tools` and tool turns itself (else the server writes them in)."""
    return bool(template) and re.search(r"\btools\b", template or "") is not None


def is_reasoning_template(template: str | None) -> bool:
    return THINK_CLOSE in (template or "")


def server_tool_format(configured: str | None, template: str | None) -> ToolFormat:
    return check_format(configured) if configured else template_tool_format(template)


# ------------------------------------------------------------------------------------------------ reading
def read_tools(f: Fields) -> ToolRequest | None:
    """`tools`, `tool_choice`, `parallel_tool_calls` (None without tools; tool_choice alone must be none/auto)."""
    raw = f.raw("tools")
    choice_raw = f.raw("tool_choice")
    parallel = f.boolean("parallel_tool_calls", True)
    if raw is None or raw == []:
        if choice_raw not in (None, "none", "auto"):
            raise bad_request("tool_choice", "needs `tools`")
        return None
    if not isinstance(raw, list):
        raise bad_request("tools", "must be an array of {type: function, function: {name, description, parameters}}")
    tools, functions = [], []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise ApiError(400, f"{where}: must be {{type: 'function', function: {{name, description, parameters}}}}",
                           param="tools")
        fn = tool["function"]
        name, description = fn.get("name"), fn.get("description", "")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(description, str):
            raise bad_request(f"{where}.function.description", "must be a string")
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise bad_request(f"{where}.function.parameters", "must be a JSON Schema of type object")
        try:
            functions.append(FunctionSpec(name if isinstance(name, str) else repr(name), params, description))
        except GrammarError as exc:
            raise bad_request(f"{where}.function.name", str(exc)) from None
        tools.append({"type": "function", "function": {"name": name, "description": description,
                                                         "parameters": params}})
    return ToolRequest(tools, functions, _choice(choice_raw, [fn.name for fn in functions]), parallel)


def _choice(raw: Any, names: list[str]) -> ToolChoice:
    if raw is None or raw == "auto":
        return ToolChoice("auto")
    if raw in ("none", "required"):
        return ToolChoice(raw)
    if isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("function"), dict):
        name = raw["function"].get("name")
        if name not in names:
            raise bad_request("tool_choice.function.name", f"must name a declared function ({names}), got {name!r}")
        return ToolChoice("named", name)
    raise bad_request("tool_choice", "must be 'none', 'auto', 'required' or {type: 'function', function: {name}}")


@dataclass(frozen=True)
class ReasoningOptions:
    template_kwargs: dict[str, Any]  # chat_template_kwargs, plus reasoning_effort when given
    separate: bool


def read_reasoning(f: Fields) -> ReasoningOptions:
    kwargs = dict(f.obj("chat_template_kwargs") or {})
    effort = f.string("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise bad_request("reasoning_effort", f"must be one of {list(REASONING_EFFORTS)}, got {effort!r}")
        kwargs.setdefault("reasoning_effort", effort)
    return ReasoningOptions(kwargs, f.boolean("separate_reasoning", True))


def thinking_opened(prompt: str) -> bool:
    """The rendered prompt ends inside an open thinking section (DeepSeek-R1 style)."""
    return prompt.rstrip().endswith(THINK_OPEN)


def thinking_closed(prompt: str) -> bool:
    """The rendered prompt closed an empty thinking section itself (Qwen3 with enable_thinking=False)."""
    return prompt.rstrip().endswith(THINK_CLOSE)


# ------------------------------------------------------------------------------------------------ grammar
def answer_rules(tools: ToolRequest | None, fmt: ToolFormat, constraint: tuple[str, str] | None,
                 ) -> EmbeddedRules | None:
    """The answer's grammar: the tool-call grammar (tool_choice other than none), else the request's own
    constraint (kind, source), else None."""
    if tools is not None and tools.choice.mode != "none":
        if constraint is not None:
            raise bad_request("tools", "a response_format or grammar constraint cannot be combined with tool calls "
                                       "unless tool_choice is 'none'")
        try:
            rules = tool_call_rules(tools.functions, fmt, tools.choice, tools.parallel)
        except GrammarError as exc:
            raise bad_request("tools", str(exc)) from None
        assert rules is not None
        return EmbeddedRules(*rules)
    if constraint is None:
        return None
    try:
        return constraint_rules(constraint[0], constraint[1], "ans-")
    except GrammarError as exc:
        raise bad_request(constraint[0], str(exc)) from None


def request_grammar(answer: EmbeddedRules, reasoning: bool, opened: bool) -> str:
    """The GBNF the request runs: the answer alone, or thinking text first on a reasoning template."""
    if reasoning:
        return thinking_ebnf(answer, opened)
    return f"root ::= {answer.start}\n{answer.text}"


