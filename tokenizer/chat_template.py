"""Chat templates rendered the way transformers' `apply_chat_template` renders them.

Same environment: jinja2's ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loop controls;
`tojson` that does not escape HTML or non-ASCII; `raise_exception` and `strftime_now` as globals; the special
tokens (`bos_token`, `eos_token`, ...) and any extra keyword arguments as template variables. Message keys
whose value is None are dropped first, as transformers does.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def compile_chat_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render_chat_template(
    source: str,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    **variables: Any,
) -> str:
    cleaned = [{k: v for k, v in m.items() if v is not None} for m in messages]
    return compile_chat_template(source).render(
        messages=cleaned,
        tools=tools,
        documents=documents,
        add_generation_prompt=add_generation_prompt,
        **variables,
    )
