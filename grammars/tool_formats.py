"""Tool calls as a grammar: the declared functions, a model's tool-call format and the tool choice, compiled to
one GBNF text whose every accepted output is a call (or calls) of a declared function with arguments that
validate against its JSON Schema, spelled the way the model writes them.

Formats (`TOOL_FORMATS`), with the text that opens a tool-call section (its trigger):

    hermes    <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>   (Qwen 2.5/3, Hermes; one block a call)
    llama3    {"name": "f", "parameters": {...}}                              (Llama 3.1 JSON; calls joined by "; ")
    mistral   [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]            (Mistral)
    pythonic  [f(a=1, b="x"), g()]                                            (Llama 3.2/4 pythonic)

Tool choice: `required` (at once a call of any function), `named` (at once exactly one call of that one, as
vLLM and SGLang make it), `auto` (free text without the trigger; once the trigger appears the rest is calls),
`none` (no constraint: no grammar). With `parallel` several calls may follow one another, else exactly one.

The markers `<tool_call>`, `</tool_call>` and `[TOOL_CALLS]` are single tokens in the checkpoints that use them
(Mistral's is a control token, Qwen's are added tokens), so the grammar names them as tokens where the
vocabulary has them and as text elsewhere (`token_refs.soft_token`): the model writes its own token, never a
spelling of it, and free text never holds a marker's text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from radixgen.grammars.ebnf_embed import PYTHON_KEYWORDS, ToolSchemaError, embed_json_schema
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.free_text import text_until
from radixgen.grammars.json_schema_merge import JSON_TYPES
from radixgen.grammars.json_schema_text import literal
from radixgen.grammars.token_refs import soft_token

ToolFormat = Literal["hermes", "llama3", "mistral", "pythonic"]
TOOL_FORMATS: tuple[ToolFormat, ...] = get_args(ToolFormat)
ToolChoiceMode = Literal["auto", "none", "required", "named"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
EMPTY_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class FunctionSpec:
    """One declared function: its name, what it does, and the JSON Schema of its arguments (an object)."""

    name: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: dict(EMPTY_PARAMETERS))
    description: str = ""

    def __post_init__(self) -> None:
        if not _FUNCTION_NAME.fullmatch(self.name):
            raise GrammarError(f"function name must be 1-64 letters, digits, '_', '.' or '-', got {self.name!r}")


@dataclass(frozen=True)
class ToolChoice:
    """Whether and which function the model must call; `name` only for `named`."""

    mode: ToolChoiceMode = "auto"
    name: str | None = None

    def __post_init__(self) -> None:
        if (self.mode == "named") != (self.name is not None):
            raise GrammarError("a named tool choice needs a function name (and only it has one)")


@dataclass(frozen=True)
class FormatSpelling:
    """How a format writes a section of calls: `trigger` opens it, calls are joined by `separator` (each later
    call opening with `call_open`), `close` ends it; `arguments_key` names the JSON field holding the
    arguments (None: Python keyword arguments); `marker`: the start of `trigger` a model writes as one token
    ("" when none)."""

    trigger: str
    call_open: str
    separator: str
    close: str
    arguments_key: str | None
    marker: str = ""


HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
SPELLINGS: dict[ToolFormat, FormatSpelling] = {
    "hermes": FormatSpelling(HERMES_OPEN, HERMES_OPEN, "\n", "", "arguments", HERMES_OPEN),
    "llama3": FormatSpelling('{"name": ', '{"name": ', "; ", "", "parameters"),
    "mistral": FormatSpelling("[TOOL_CALLS][", "", ", ", "]", "arguments", "[TOOL_CALLS]"),
    "pythonic": FormatSpelling("[", "", ", ", "]", None),
}


def check_format(name: str) -> ToolFormat:
    for fmt in TOOL_FORMATS:
        if fmt == name:
            return fmt
    raise GrammarError(f"tool-call format must be one of {TOOL_FORMATS}, got {name!r}")


# ------------------------------------------------------------------------------------------------ arguments
_SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}  # name -> schema
_SUBSCHEMAS = {"items", "prefixItems", "additionalItems", "additionalProperties", "unevaluatedItems",
               "unevaluatedProperties", "contains", "propertyNames", "not", "if", "then", "else", "anyOf", "oneOf",
               "allOf"}  # a schema, or a list of them


def _pointer_step(key: object) -> str:
    return "/" + str(key).replace("~", "~0").replace("/", "~1")


def _check_types(schema: Any, owner: str, pointer: str = "") -> None:
    """A `type` that names no JSON type (`"int"`, `"str"`: a common slip) as a ToolSchemaError naming its JSON
    pointer, which the schema compiler's own message does not carry."""
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            _check_types(item, owner, f"{pointer}/{i}")
        return
    if not isinstance(schema, Mapping):
        return
    declared = schema.get("type")
    for name in [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else []:
        if name not in JSON_TYPES:
            raise ToolSchemaError(f"{owner}: {pointer or '/'}: unknown type {name!r} (JSON Schema's types: "
                                  f"{', '.join(JSON_TYPES)})")
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            for name, sub in value.items():
                _check_types(sub, owner, pointer + _pointer_step(key) + _pointer_step(name))
        elif key in _SUBSCHEMAS:
            _check_types(value, owner, pointer + _pointer_step(key))


def _object_properties(fn: FunctionSpec, owner: str) -> tuple[list[tuple[str, Any]], set[str]]:
    params = fn.parameters
    props = params.get("properties", {})
    if params.get("type", "object") != "object" or not isinstance(props, Mapping):
        raise ToolSchemaError(f"{owner}: /: pythonic calls need an object schema with `properties`")
    for key in props:
        if not _IDENTIFIER.fullmatch(key):
            raise ToolSchemaError(f"{owner}: /properties/{key}: a pythonic argument name must be an identifier")
    required = params.get("required", [])
    return list(props.items()), set(required if isinstance(required, list) else [])


def _python_arguments(fn: FunctionSpec, prefix: str, owner: str, rules: list[str]) -> str:
    """Rules for `a=1, b="x"`: declared order, required ones present, optional ones skippable."""
    props, required = _object_properties(fn, owner)
    defs = {k: fn.parameters[k] for k in ("$defs", "definitions") if k in fn.parameters}
    first, after = f"{prefix}a{len(props)}-first", f"{prefix}a{len(props)}-after"
    rules += [f'{first} ::= ""', f'{after} ::= ""']
    for i in reversed(range(len(props))):
        key, sub = props[i]
        sub_schema = {**defs, **sub} if isinstance(sub, Mapping) else sub
        value = embed_json_schema(sub_schema, f"{prefix}p{i}-", owner, PYTHON_KEYWORDS, f"/properties/{key}")
        rules.append(value.text)
        item = f"{literal(key + '=')} {value.start}"
        nxt_first, nxt_after = first, after
        first, after = f"{prefix}a{i}-first", f"{prefix}a{i}-after"
        skip = key not in required
        rules.append(f"{first} ::= {item} {nxt_after}" + (f" | {nxt_first}" if skip else ""))
        rules.append(f'{after} ::= ", " {item} {nxt_after}' + (f" | {nxt_after}" if skip else ""))
    return first


def _calls(functions: Sequence[tuple[int, FunctionSpec]], fmt: ToolFormat, prefix: str, rules: list[str],
           ) -> tuple[str, str]:
    """(`whole`, `after_trigger`): rules for one call of the (index in `tools`, function) pairs, and for one call
    whose first `call_open` bytes (the trigger's part of it) were already read."""
    spelling = SPELLINGS[fmt]
    alternatives = []
    for i, fn in functions:
        owner = f"tools[{i}].function.parameters ({fn.name})"
        _check_types(fn.parameters, owner)
        if spelling.arguments_key is None:
            args = _python_arguments(fn, f"{prefix}f{i}-", owner, rules)
            alternatives.append(f"{literal(fn.name + '(')} {args} \")\"")
        else:
            embedded = embed_json_schema(fn.parameters, f"{prefix}f{i}-", owner)
            rules.append(embedded.text)
            head = f'{json.dumps(fn.name)}, "{spelling.arguments_key}": '
            alternatives.append(f"{literal(head)} {embedded.start} \"}}\"")
    named = f"{prefix}named"
    rules.append(f"{named} ::= " + " | ".join(alternatives))
    if spelling.arguments_key is None:
        return named, named
    body = f"{prefix}body"  # {"name": "f", "arguments": {...}}
    rules.append(f'{body} ::= "{{\\"name\\": " {named}')
    if fmt == "hermes":  # <tool_call>\n{...}\n</tool_call>
        block = f"{prefix}block"
        rules.append(f'{block} ::= "\\n"? {body} "\\n"? {soft_token(HERMES_CLOSE)}')
        return f"{soft_token(HERMES_OPEN)} {block}", block
    if fmt == "llama3":  # the trigger is the call's `{"name": `
        return body, named
    return body, body


def _section(functions: Sequence[tuple[int, FunctionSpec]], fmt: ToolFormat, parallel: bool, prefix: str,
             rules: list[str]) -> str:
    """The rule for a whole section of calls after its trigger."""
    spelling = SPELLINGS[fmt]
    whole, after_trigger = _calls(functions, fmt, prefix, rules)
    more = f" ( {literal(spelling.separator)} {whole} )*" if parallel else ""
    close = f" {literal(spelling.close)}" if spelling.close else ""
    section = f"{prefix}section"
    rules.append(f"{section} ::= {after_trigger}{more}{close}")
    return section


def tool_call_ebnf(functions: Sequence[FunctionSpec], fmt: ToolFormat, choice: ToolChoice = ToolChoice(),
                   parallel: bool = True, prefix: str = "tc-") -> str | None:
    """The GBNF text (start rule `root`) of the model's output for this tool choice; None for `none`. A
    `ToolSchemaError` names the function and the JSON pointer of a parameter schema that cannot be compiled."""
    rules = tool_call_rules(functions, fmt, choice, parallel, prefix)
    return None if rules is None else f"root ::= {rules[0]}\n{rules[1]}"


def tool_call_rules(functions: Sequence[FunctionSpec], fmt: ToolFormat, choice: ToolChoice = ToolChoice(),
                    parallel: bool = True, prefix: str = "tc-") -> tuple[str, str] | None:
    """(start expression, rules text) of `tool_call_ebnf`, for embedding in a larger grammar."""
    if choice.mode == "none":
        return None
    if not functions:
        raise GrammarError("tool calls need at least one declared function")
    names = [fn.name for fn in functions]
    if len(set(names)) != len(names):
        raise GrammarError(f"function names must be unique, got {names}")
    chosen = list(enumerate(functions))
    if choice.mode == "named":
        chosen = [(i, fn) for i, fn in chosen if fn.name == choice.name]
        if not chosen:
            raise GrammarError(f"tool_choice names {choice.name!r}, which is not a declared function ({names})")
    rules: list[str] = []
    section = _section(chosen, fmt, parallel and choice.mode != "named", prefix, rules)
    spelling = SPELLINGS[check_format(fmt)]
    rest = spelling.trigger[len(spelling.marker):]  # the trigger's text after its marker token
    after_marker = f"{literal(rest)} {section}" if rest else section
    if choice.mode == "auto":
        text = (text_until(f"{prefix}text-", {}, tokens={spelling.marker: after_marker}) if spelling.marker
                else text_until(f"{prefix}text-", {spelling.trigger: section}))
        rules.append(text.text)
        start = text.start
    elif spelling.marker:
        start = f"{soft_token(spelling.marker)} {after_marker}"
    else:
        start = f"{literal(spelling.trigger)} {section}"
    return start, "\n".join(r.rstrip("\n") for r in rules) + "\n"


def format_calls(fmt: ToolFormat, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """A section of calls (name, arguments) as the format writes it, for prompts and conversation history;
    the grammar of `tool_call_ebnf` accepts it when the calls fit the declared functions."""
    spelling = SPELLINGS[fmt]
    pieces = []
    for name, arguments in calls:
        if spelling.arguments_key is None:
            pieces.append(f"{name}(" + ", ".join(f"{k}={_python_literal(v)}" for k, v in arguments.items()) + ")")
            continue
        body = json.dumps({"name": name, spelling.arguments_key: dict(arguments)}, ensure_ascii=False)
        pieces.append(f"{HERMES_OPEN}\n{body}\n{HERMES_CLOSE}" if fmt == "hermes" else body)
    joined = spelling.separator.join(pieces)
    opening = spelling.trigger[:len(spelling.trigger) - len(spelling.call_open)]
    return opening + joined + spelling.close


def tools_prompt(tools: Sequence[Mapping[str, Any]], fmt: ToolFormat) -> str:
    """A system text listing `tools` (OpenAI tool objects) and showing how to call them in `fmt`, for chat
    templates that do not describe tools themselves."""
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    example = format_calls(fmt, [("<function-name>", {"<argument>": "<value>"})])
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listing}\n"
            f"</tools>\n\nTo call functions, answer with exactly this format:\n{example}")


def _python_literal(value: Any) -> str:
    if value is True or value is False or value is None:
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_python_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_python_literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)
