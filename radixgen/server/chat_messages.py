"""OpenAI chat messages -> the turns a chat template reads, tool turns included.

A template that renders tools itself (Qwen 2.5/3, Llama 3.1, Mistral) gets them as transformers passes them:
`tools=[...]`, assistant turns with `tool_calls` whose arguments are objects, `tool` turns with their
`tool_call_id`. A template that does not (a plain ChatML one) gets the tools described in the system turn, past
calls written into the assistant's text in the server's tool-call format, and tool results as user turns in
`<tool_response>` tags, so the model sees what it is asked to write.
"""

from __future__ import annotations

import json
from typing import Any

from radixgen.grammars.tool_formats import ToolFormat, format_calls, tools_prompt
from radixgen.server.errors import bad_request

CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def _text(content: Any, where: str) -> str:
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"{where}.content[{j}]", "only text parts ({type: text, text}) are supported")
            parts.append(part["text"])
        return "".join(parts)
    if not isinstance(content, str):
        raise bad_request(f"{where}.content", "must be a string or an array of text parts")
    return content


def _tool_calls(raw: Any, where: str) -> list[dict[str, Any]]:
    """An assistant turn's tool_calls, with arguments decoded to objects (what templates expect)."""
    if not isinstance(raw, list):
        raise bad_request(f"{where}.tool_calls", "must be an array")
    calls = []
    for k, call in enumerate(raw):
        at = f"{where}.tool_calls[{k}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(at, "must be {id, type: 'function', function: {name, arguments}}")
        args = fn.get("arguments", "{}")
        try:
            decoded = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            raise bad_request(f"{at}.function.arguments", "must be a JSON object (as text)") from None
        if not isinstance(decoded, dict):
            raise bad_request(f"{at}.function.arguments", "must be a JSON object")
        calls.append({"id": call.get("id"), "type": "function",
                      "function": {"name": fn["name"], "arguments": decoded}})
    return calls


def chat_messages(raw: Any) -> list[dict[str, Any]]:
    """OpenAI messages as template turns: {role, content} plus `tool_calls` (assistant) and `tool_call_id`,
    `name` (tool)."""
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages", "must be a non-empty array of messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(where, "must be an object with `role` and `content`")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise bad_request(f"{where}.role", f"must be one of {sorted(CHAT_ROLES)}, got {role!r}")
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""
        turn: dict[str, Any] = {"role": CHAT_ROLES[role], "content": _text(content, where)}
        if role == "assistant" and m.get("tool_calls"):
            turn["tool_calls"] = _tool_calls(m["tool_calls"], where)
        if role == "tool":
            for key in ("tool_call_id", "name"):
                if m.get(key) is not None:
                    if not isinstance(m[key], str):
                        raise bad_request(f"{where}.{key}", "must be a string")
                    turn[key] = m[key]
        out.append(turn)
    return out


def written_in(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, fmt: ToolFormat,
               ) -> list[dict[str, Any]]:
    """The turns for a template that knows no tools: tools in the system turn, calls and results as text."""
    out: list[dict[str, Any]] = []
    for turn in messages:
        if turn.get("tool_calls"):
            calls = format_calls(fmt, [(c["function"]["name"], c["function"]["arguments"]) for c in turn["tool_calls"]])
            text = f"{turn['content']}\n{calls}" if turn["content"] else calls
            out.append({"role": "assistant", "content": text})
        elif turn["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{turn['content']}\n</tool_response>"})
        else:
            out.append({"role": turn["role"], "content": turn["content"]})
    if tools:
        system = tools_prompt(tools, fmt)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{system}"}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out
