"""Generated text -> tool calls, per format (tool_formats.py): the text before the tool-call section, then each
call's name and arguments (JSON text), also while the text is still arriving.

`parse_tool_output(text, fmt, final=False)` reads a prefix of an output: it holds back a tail that may become
the trigger, reports a call's name once its spelling is complete and its arguments as far as they have come
(JSON formats: the raw arguments text, which grows by appending; pythonic: all at once when the call closes,
converted to JSON). The text the grammar accepts always parses; other text parses as far as it fits.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

from radixgen.grammars.tool_formats import SPELLINGS, ToolFormat

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_PY_CALL = re.compile(r"\s*(?:,\s*)?([A-Za-z_][A-Za-z0-9_.-]*)\(")
_JSON_CALL_OPEN = '{"name": '
PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class CallProgress:
    """One call as far as it has been read: `name` once complete, `arguments` (JSON text) so far."""

    name: str | None
    arguments: str
    complete: bool


@dataclass(frozen=True)
class ToolCall:
    """One complete call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class ToolParse:
    """`content`: the text before the tool-call section (all of it when there is none, less a held-back tail
    that may still turn into the trigger unless the text is final); `calls`: the section's calls so far."""

    content: str
    calls: tuple[CallProgress, ...]

    @property
    def complete_calls(self) -> list[ToolCall]:
        return [ToolCall(c.name, c.arguments) for c in self.calls if c.complete and c.name is not None]


def held_back(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


def parse_tool_output(text: str, fmt: ToolFormat, final: bool = True, markers_kept: bool = False) -> ToolParse:
    """The content and calls of `text` (a whole output, or a prefix of one unless `final`).

    A format's marker token (Mistral's `[TOOL_CALLS]`, Hermes' `<tool_call>`) arrives as its text, or not at all
    where the detokenizer skips special tokens: without it, the section starts at the first call spelled in
    the format's exact layout (`[{"name": "f", "arguments": ` for Mistral, `{"name": "f", "arguments": ` for
    Hermes). `markers_kept` says the text was decoded with its special tokens (the server's tool requests), so
    only the marker opens a section and free text in that layout stays content. Llama 3.1's `<|python_tag|>`
    before a call is not content."""
    spelling = SPELLINGS[fmt]
    trigger = spelling.trigger
    at = text.find(trigger)
    after = at + len(trigger)
    hold = held_back(text, trigger)
    if at < 0 and spelling.marker and not markers_kept:
        bare = trigger[len(spelling.marker):]
        at, bare_hold = _bare_section(text, bare, spelling.arguments_key or "", final)
        after = at + len(bare)
        hold = max(hold, bare_hold)
    if at < 0:
        keep = len(text) if final else len(text) - hold
        return ToolParse(text[:keep], ())
    section = text[after:]
    content = text[:at]
    if fmt == "pythonic":
        return ToolParse(content, tuple(_python_calls(section)))
    if fmt == "llama3":
        section = _JSON_CALL_OPEN + section
        content = content.removesuffix(PYTHON_TAG)
    return ToolParse(content, tuple(_json_calls(section, spelling.arguments_key or "")))


def _bare_section(text: str, bare: str, key: str, final: bool) -> tuple[int, int]:
    """(where a section whose marker was skipped starts, or -1; how many characters at the end to hold back
    because they may still become one): the first `bare` + `{"name": "...", "<key>": ` in the text."""
    opening = bare + _JSON_CALL_OPEN
    after_name = f', "{key}": '
    at = text.find(opening)
    while at >= 0:
        name_at = at + len(opening)
        match = _JSON_STRING.match(text, name_at)
        if match is None:
            if not final and _open_string(text[name_at:]):
                return -1, len(text) - at
        else:
            rest = text[match.end():]
            if rest.startswith(after_name):
                return at, 0
            if not final and after_name.startswith(rest):
                return -1, len(text) - at
        at = text.find(opening, at + 1)
    return -1, 0 if final else held_back(text, opening)


def _open_string(text: str) -> bool:
    """`text` is the start of a JSON string that has not closed yet (or nothing at all)."""
    return text == "" or (text[0] == '"' and _JSON_STRING.match(text) is None and "\n" not in text)


def _closing(text: str, start: int, depth: int) -> int | None:
    """The index of the bracket that brings `depth` open brackets (plus those met from `start`) back to none,
    strings skipped whole; None while that has not happened."""
    i, n = start, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            match = _JSON_STRING.match(text, i)
            if match is None:
                return None
            i = match.end()
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _value_end(text: str, start: int) -> int | None:
    """The index just past the JSON object or array starting at `start`, or None while it is unfinished."""
    close = _closing(text, start, 0)
    return None if close is None else close + 1


def _json_calls(section: str, key: str) -> list[CallProgress]:
    calls: list[CallProgress] = []
    cursor = 0
    after_name = f', "{key}": '
    while True:
        at = section.find(_JSON_CALL_OPEN, cursor)
        if at < 0:
            return calls
        name_at = at + len(_JSON_CALL_OPEN)
        match = _JSON_STRING.match(section, name_at)
        if match is None:
            return calls + [CallProgress(None, "", False)]
        name = json.loads(match.group(0))
        rest = section[match.end():]
        if not rest.startswith(after_name):
            return calls + ([CallProgress(name, "", False)] if after_name.startswith(rest) else [])
        args_at = match.end() + len(after_name)
        end = _value_end(section, args_at) if section[args_at:args_at + 1] == "{" else None
        if end is None:
            return calls + [CallProgress(name, section[args_at:], False)]
        calls.append(CallProgress(name, section[args_at:end], True))
        cursor = end


def _python_calls(section: str) -> list[CallProgress]:
    calls: list[CallProgress] = []
    cursor = 0
    while True:
        match = _PY_CALL.match(section, cursor)
        if match is None:
            rest = section[cursor:].lstrip(", ")
            partial = bool(rest) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", rest) is not None
            return calls + ([CallProgress(None, "", False)] if partial else [])
        name = match.group(1)
        close = _call_end(section, match.end())
        if close is None:
            return calls + [CallProgress(name, "", False)]
        try:
            arguments = json.dumps(python_arguments(section[match.end():close]), ensure_ascii=False)
        except (SyntaxError, ValueError):
            return calls
        calls.append(CallProgress(name, arguments, True))
        cursor = close + 1


def _call_end(text: str, start: int) -> int | None:
    """The index of the `)` closing a call whose arguments start at `start`, or None while it is open."""
    close = _closing(text, start, 1)
    return close if close is not None and text[close] == ")" else None


def python_arguments(source: str) -> dict[str, object]:
    """`a=1, b="x"` -> {"a": 1, "b": "x"}; strings are read as JSON spells them (the grammar writes them so),
    True/False/None (and true/false/null) as JSON's literals. A ValueError for anything else."""
    call = ast.parse(f"f({source})", mode="eval").body
    if not isinstance(call, ast.Call) or call.args:
        raise ValueError("pythonic arguments must be keyword arguments")
    text = f"f({source})"
    return {kw.arg or "": _python_value(kw.value, text) for kw in call.keywords}


_NAMED = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}


def _python_value(node: ast.expr, text: str) -> object:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            try:
                return json.loads(ast.get_source_segment(text, node) or '""')
            except ValueError:  # not JSON's spelling (a text the grammar did not write)
                return node.value
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMED:
        return _NAMED[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        value = node.operand.value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
    if isinstance(node, ast.List):
        return [_python_value(v, text) for v in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            key = _python_value(k, text) if k is not None else None
            if not isinstance(key, str):
                raise ValueError("object keys must be strings")
            out[key] = _python_value(v, text)
        return out
    raise ValueError(f"not a literal: {ast.dump(node)}")
