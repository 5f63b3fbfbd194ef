"""One grammar's rules inside another: EBNF text with every rule name prefixed, so several JSON Schemas (one per
tool) and a surrounding grammar share one GBNF text without their rule names colliding.

The text is scanned token by token in the dialect of `ebnf.py`: literals, character classes, `/regex/` terminals,
token references and comments are copied as they are; every other name (a rule's definition or a reference) gets
the prefix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from radixgen.grammars.ebnf import parse_ebnf
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.json_schema import json_schema_to_ebnf
from radixgen.grammars.json_schema_report import SchemaError
from radixgen.grammars.token_refs import ref_end

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
# JSON's three keywords as Python spells them (a pythonic tool call writes its arguments as Python literals).
PYTHON_KEYWORDS = {'"true"': '"True"', '"false"': '"False"', '"null"': '"None"'}


@dataclass(frozen=True)
class EmbeddedRules:
    """Rules ready to append to a grammar: `start` is the (prefixed) rule that matches the whole embedded
    language; `text` holds its rules, one `NAME ::= ...` per line."""

    start: str
    text: str


def _quoted_end(text: str, pos: int, close: str) -> int:
    """The index just past the closing `close` of a token opened at `pos` (backslash escapes skipped)."""
    i = pos + 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == close:
            return i + 1
        i += 1
    return len(text)


def prefix_rules(text: str, prefix: str, literals: Mapping[str, str] | None = None) -> str:
    """`text` with every rule name prefixed by `prefix`; string literals found in `literals` are replaced by
    their value there (whole literal tokens only, e.g. PYTHON_KEYWORDS)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "\"'":
            end = _quoted_end(text, i, ch)
            token = text[i:end]
            out.append(literals.get(token, token) if literals else token)
            i = end
        elif ch == "[":
            end = _quoted_end(text, i, "]")
            out.append(text[i:end])
            i = end
        elif ch == "/":
            end = _quoted_end(text, i, "/")
            out.append(text[i:end])
            i = end
        elif ch == "#":
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(text[i:end])
            i = end
        elif ch == "<" and (ref := ref_end(text, i)) is not None:  # a token reference (token_refs.py)
            out.append(text[i:ref])
            i = ref
        elif ch == "{":  # a repetition count: digits and a comma only
            end = text.index("}", i) + 1
            out.append(text[i:end])
            i = end
        else:
            match = _NAME.match(text, i)
            if match:
                out.append(prefix + match.group(0))
                i = match.end()
            else:
                out.append(ch)
                i += 1
    return "".join(out)


def embed_ebnf(text: str, prefix: str, literals: Mapping[str, str] | None = None, start: str = "root") -> EmbeddedRules:
    """An EBNF grammar's rules under `prefix`, its start rule `prefix + start`."""
    return EmbeddedRules(prefix + start, prefix_rules(text, prefix, literals).strip() + "\n")


class ToolSchemaError(SchemaError):
    """A function's parameter schema that cannot be compiled; the message names the function and the JSON
    pointer of the offending subschema."""


def embed_json_schema(schema: Mapping[str, Any] | bool, prefix: str, owner: str,
                      literals: Mapping[str, str] | None = None, pointer: str = "") -> EmbeddedRules:
    """The grammar of `schema` (strict: no properties or items it does not mention, compact JSON) under `prefix`;
    a `ToolSchemaError` `owner: /json/pointer: why` when it cannot be compiled, or only with relaxations (the
    grammar would accept more than the schema), so every accepted text validates (`pointer`: where `schema`
    sits inside the document `owner` names)."""
    try:
        conversion = json_schema_to_ebnf(dict(schema) if isinstance(schema, Mapping) else schema, strict=True)
        parse_ebnf(conversion.ebnf)  # a `pattern` the regex compiler refuses fails here, under its owner's name
        if conversion.relaxations:  # the grammar would accept arguments the schema refuses
            raise GrammarError(f"cannot be enforced exactly: {conversion.relaxations[0]}")
    except GrammarError as exc:
        message = str(exc)
        if pointer:
            message = pointer + (message[1:] if message.startswith("/:") else message if message.startswith("/")
                                 else ": " + message)
        raise ToolSchemaError(f"{owner}: {message}") from None
    return embed_ebnf(conversion.ebnf, prefix, literals)


def constraint_rules(kind: str, source: str, prefix: str) -> EmbeddedRules:
    """A request constraint (`Constraint.kind`, `.source`) as rules to embed, compiled as it would be alone (a
    JSON Schema with the JSON Schema compiler's defaults); Lark grammars cannot be embedded."""
    if kind == "json_schema":
        return embed_ebnf(json_schema_to_ebnf(source).ebnf, prefix)
    if kind == "ebnf":
        return embed_ebnf(source, prefix)
    if kind == "regex":
        escaped = re.sub(r"(?<!\\)((?:\\\\)*)/", r"\1\\/", source)
        return EmbeddedRules(prefix + "root", f"{prefix}root ::= /{escaped}/\n")
    raise GrammarError(f"a {kind} constraint cannot be combined with another grammar (use ebnf, regex or json_schema)")
