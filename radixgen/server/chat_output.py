"""A chat choice's output text read back as OpenAI's assistant message: reasoning, content and tool calls, whole
(`assistant_message`) or as stream deltas that only ever append (`ChoiceStream`).

Both read the text through the same split (grammars/reasoning.py, grammars/tool_parsers.py), so a streamed
choice assembles to exactly the message the whole response carries: tool calls announce their id and name
first, then their arguments in fragments, each call under its own index.
"""

from __future__ import annotations

import secrets
import string
import uuid
from dataclasses import dataclass
from typing import Any

from radixgen.grammars.reasoning import split_reasoning
from radixgen.grammars.tool_parsers import CallProgress, parse_tool_output
from radixgen.server.openai_tools import ChatShape

_ID_CHARS = string.ascii_letters + string.digits


def tool_call_id(shape: ChatShape) -> str:
    """A fresh call id; Mistral's templates insist on nine letters and digits."""
    if shape.tool_format == "mistral":
        return "".join(secrets.choice(_ID_CHARS) for _ in range(9))
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class OutputParts:
    reasoning: str | None
    content: str
    calls: tuple[CallProgress, ...]


def read_output(text: str, shape: ChatShape, final: bool) -> OutputParts:
    reasoning, answer = None, text
    if shape.reasoning:
        split = split_reasoning(text, shape.thinking_opened, final)
        reasoning, answer = split.reasoning, split.content
    if shape.tool_format is None:
        return OutputParts(reasoning, answer, ())
    parsed = parse_tool_output(answer, shape.tool_format, final, shape.markers_kept)
    return OutputParts(reasoning, parsed.content, parsed.calls)


def finish_with_calls(reason: str | None, made_calls: bool) -> str | None:
    return "tool_calls" if made_calls and reason == "stop" else reason


def assistant_message(text: str, shape: ChatShape) -> dict[str, Any]:
    """The whole `message` of a finished choice."""
    parts = read_output(text, shape, final=True)
    calls = [c for c in parts.calls if c.complete and c.name is not None]
    message: dict[str, Any] = {"role": "assistant", "content": parts.content}
    if shape.reasoning:
        message["reasoning_content"] = parts.reasoning
    if calls:
        message["content"] = parts.content.strip() or None
        message["tool_calls"] = [{"id": tool_call_id(shape), "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
    return message


class ChoiceStream:
    """One streamed choice: `feed(piece)` returns the deltas the new text adds, `feed("", final=True)` the rest."""

    def __init__(self, shape: ChatShape) -> None:
        self.shape = shape
        self.text = ""
        self.sent_reasoning = 0
        self.sent_content = 0
        self.call_ids: list[str] = []  # one per announced call
        self.sent_arguments: list[int] = []

    @property
    def made_calls(self) -> bool:
        return bool(self.call_ids)

    def feed(self, piece: str, final: bool = False) -> list[dict[str, Any]]:
        self.text += piece
        parts = read_output(self.text, self.shape, final)
        deltas: list[dict[str, Any]] = []
        if parts.reasoning is not None and len(parts.reasoning) > self.sent_reasoning:
            deltas.append({"reasoning_content": parts.reasoning[self.sent_reasoning:]})
            self.sent_reasoning = len(parts.reasoning)
        if len(parts.content) > self.sent_content:
            deltas.append({"content": parts.content[self.sent_content:]})
            self.sent_content = len(parts.content)
        for index, call in enumerate(parts.calls):
            if index == len(self.call_ids):
                if call.name is None or (final and not call.complete):
                    break
                self.call_ids.append(tool_call_id(self.shape))
                self.sent_arguments.append(0)
                deltas.append({"tool_calls": [{"index": index, "id": self.call_ids[index], "type": "function",
                                               "function": {"name": call.name, "arguments": ""}}]})
            if len(call.arguments) > self.sent_arguments[index]:
                fragment = call.arguments[self.sent_arguments[index]:]
                deltas.append({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
                self.sent_arguments[index] = len(call.arguments)
        return deltas
