"""Structural tags (SGLang's and XGrammar's `response_format: {"type": "structural_tag", ...}`): free text in which
a tagged region, once its trigger appears, must be `begin`, a JSON value of the tag's schema, then `end`; free
text goes on after it.

    {"type": "structural_tag",
     "structures": [{"begin": "<function=get_weather>", "schema": {...}, "end": "</function>"}],
     "triggers": ["<function="]}

Every structure's `begin` starts with exactly one trigger, and no trigger occurs inside another. Marker-like
pieces of the texts (`<tool_call>`, `<|python_tag|>`, `[TOOL_CALLS]`: `MARKER`) are written as their single
tokens where the model's vocabulary has them, as text elsewhere (token_refs.py); a trigger that is one such
marker never occurs as text in the free text, its token opens the region.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixgen.grammars.ebnf_embed import embed_json_schema
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.free_text import check_triggers, text_until
from radixgen.grammars.json_schema_text import literal
from radixgen.grammars.token_refs import soft_token

MARKER = re.compile(r"<[^<>\s]+>|\[[A-Z][A-Z0-9_]*\]")  # a text a tokenizer may hold as one added token


@dataclass(frozen=True)
class TagStructure:
    """One tagged region: the text that opens it, the JSON Schema of its body, the text that closes it."""

    begin: str
    schema: Mapping[str, Any] | bool
    end: str


@dataclass(frozen=True)
class StructuralTag:
    structures: tuple[TagStructure, ...]
    triggers: tuple[str, ...]


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise GrammarError(f"{where}: must be a string")
    return value


def structural_tag_from_dict(spec: Mapping[str, Any], where: str = "response_format") -> StructuralTag:
    """The tag of a request's `response_format` object; a GrammarError naming the field that is wrong."""
    structures = spec.get("structures")
    triggers = spec.get("triggers")
    if not isinstance(structures, list) or not structures:
        raise GrammarError(f"{where}.structures: must be a non-empty array of {{begin, schema, end}}")
    if not isinstance(triggers, list) or not triggers:
        raise GrammarError(f"{where}.triggers: must be a non-empty array of strings")
    out = []
    for i, item in enumerate(structures):
        at = f"{where}.structures[{i}]"
        if not isinstance(item, Mapping):
            raise GrammarError(f"{at}: must be an object with begin, schema and end")
        schema = item.get("schema", True)
        if not isinstance(schema, (Mapping, bool)):
            raise GrammarError(f"{at}.schema: must be a JSON Schema")
        begin, end = _string(item.get("begin"), f"{at}.begin"), _string(item.get("end"), f"{at}.end")
        out.append(TagStructure(begin, schema, end))
    return StructuralTag(tuple(out), tuple(_string(t, f"{where}.triggers[{i}]") for i, t in enumerate(triggers)))


def structural_tag_ebnf(tag: StructuralTag, prefix: str = "st-", where: str = "response_format") -> str:
    """The GBNF text (start `root`) of `tag`; GrammarError (a ToolSchemaError for a schema) naming the field."""
    start, rules = structural_tag_rules(tag, prefix, where)
    return f"root ::= {start}\n{rules}"


def structural_tag_rules(tag: StructuralTag, prefix: str = "st-", where: str = "response_format") -> tuple[str, str]:
    """(start expression, rules) of `structural_tag_ebnf`, for embedding (after a thinking section)."""
    triggers: Sequence[str] = tag.triggers
    try:
        check_triggers(triggers)
    except GrammarError as exc:
        raise GrammarError(f"{where}.triggers: {exc}") from None
    text_start = f"{prefix}text-0"
    by_trigger: dict[str, list[str]] = {t: [] for t in triggers}
    lines = []
    for i, item in enumerate(tag.structures):
        owner = [t for t in triggers if item.begin.startswith(t)]
        if not owner:
            raise GrammarError(f"{where}.structures[{i}].begin: {item.begin!r} starts with none of the triggers")
        body = embed_json_schema(item.schema, f"{prefix}s{i}-", f"{where}.structures[{i}].schema")
        lines.append(body.text.rstrip("\n"))
        rest = item.begin[len(owner[0]):]
        head = f"{spelled(rest)} " if rest else ""
        by_trigger[owner[0]].append(f"{head}{body.start} {spelled(item.end) + ' ' if item.end else ''}{text_start}")
    continuations: dict[str, str] = {}
    tokens: dict[str, str] = {}
    for j, (trigger, alternatives) in enumerate(by_trigger.items()):
        if not alternatives:
            raise GrammarError(f"{where}.triggers[{j}]: {trigger!r} begins no structure")
        rule = f"{prefix}tag-{j}"
        lines.append(f"{rule} ::= " + " | ".join(alternatives))
        (tokens if MARKER.fullmatch(trigger) else continuations)[trigger] = rule
    text = text_until(f"{prefix}text-", continuations, tokens=tokens)
    return text.start, text.text + "\n".join(lines) + "\n"


def spelled(text: str) -> str:
    """GBNF for `text` with its marker-like pieces (`<tool_call>`, `<|python_tag|>`, `[TOOL_CALLS]`) written as
    their single tokens where the vocabulary has them (`token_refs.soft_token`), the rest as text."""
    parts, pos = [], 0
    for match in MARKER.finditer(text):
        if match.start() > pos:
            parts.append(literal(text[pos:match.start()]))
        parts.append(soft_token(match.group()))
        pos = match.end()
    if pos < len(text):
        parts.append(literal(text[pos:]))
    return " ".join(parts) if parts else '""'
