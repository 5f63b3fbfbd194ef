"""Tool-call grammars and parsers (grammars/tool_formats.py, tool_parsers.py, free_text.py, reasoning.py): what each
format and tool choice accepts, the parsers' round trip, partial (streamed) parses that only grow, and a property
test: random walks through the grammar of random schemas always parse into calls that validate, whole and as
the server streams them token by token."""

from __future__ import annotations

import functools
import json
import re

import jsonschema
import numpy as np
import pytest
from grammar_vocabs import TOKENIZERS, smollm2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixgen.grammars import Vocabulary, compile_grammar
from radixgen.grammars.ebnf_embed import EmbeddedRules, ToolSchemaError, prefix_rules
from radixgen.grammars.free_text import text_until
from radixgen.grammars.reasoning import split_reasoning, thinking_ebnf
from radixgen.grammars.tool_formats import (
    SPELLINGS,
    TOOL_FORMATS,
    FunctionSpec,
    ToolChoice,
    format_calls,
    tool_call_ebnf,
    tool_call_rules,
)
from radixgen.grammars.tool_parsers import parse_tool_output
from radixgen.server.chat_output import ChoiceStream, assistant_message
from radixgen.server.openai_tools import ChatShape
from radixgen.tokenizer import Tokenizer

BYTES = Vocabulary([bytes([b]) for b in range(256)] + [b"<eos>"], eos_token_ids=[256])
WEATHER = FunctionSpec("get_weather", {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["c", "f"]},
    "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]}},
    "required": ["city"]})
TIME = FunctionSpec("get_time", {"type": "object", "properties": {"ok": {"type": "boolean"}}})
PARIS = ("get_weather", {"city": "Pa\"ris)", "unit": "c", "where": {"lat": 48.8}})
NOW = ("get_time", {"ok": True})


def accepts(grammar: str, text: str) -> bool:
    matcher = compile_grammar(grammar, BYTES, syntax="ebnf").matcher()
    return matcher.advance_bytes(text.encode()) and matcher.is_accepting()


# (choice, parallel, text builder, accepted)
CASES = [
    ("auto", True, lambda f: format_calls(f, [PARIS]), True),
    ("auto", True, lambda f: "Let me check. " + format_calls(f, [PARIS, NOW]), True),
    ("auto", True, lambda f: "just text", True),
    ("auto", False, lambda f: format_calls(f, [PARIS, NOW]), False),
    ("required", True, lambda f: format_calls(f, [NOW, PARIS]), True),
    ("required", True, lambda f: "text " + format_calls(f, [PARIS]), False),
    ("required", True, lambda f: "just text", False),
    ("required", False, lambda f: format_calls(f, [NOW]), True),
    ("required", True, lambda f: format_calls(f, [("get_weather", {"unit": "c"})]), False),  # city is required
    ("required", True, lambda f: format_calls(f, [("get_weather", {"city": "x", "unit": "k"})]), False),  # enum
    ("required", True, lambda f: format_calls(f, [("get_weather", {"city": "x", "zip": 1})]), False),  # extra
    ("required", True, lambda f: format_calls(f, [("nope", {})]), False),
    ("named", True, lambda f: format_calls(f, [NOW]), True),
    ("named", True, lambda f: format_calls(f, [PARIS]), False),
    ("named", True, lambda f: format_calls(f, [NOW, NOW]), False),  # one call of it, as vLLM and SGLang make it
]


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
@pytest.mark.parametrize("choice, parallel, build, accepted", CASES)
def test_format_grammar_accepts(fmt, choice, parallel, build, accepted):
    tool_choice = ToolChoice("named", "get_time") if choice == "named" else ToolChoice(choice)
    grammar = tool_call_ebnf([WEATHER, TIME], fmt, tool_choice, parallel)
    assert accepts(grammar, build(fmt)) is accepted


# A byte vocabulary in which the markers are single tokens: Mistral's a special one, Qwen's two added ones.
MARKERS = {"[TOOL_CALLS]": 257, "<tool_call>": 258, "</tool_call>": 259}
MARKED = Vocabulary([bytes([b]) for b in range(256)] + [b"<eos>", *(m.encode() for m in MARKERS)],
                    eos_token_ids=[256], special_ids=[257])


def marked_ids(text: str) -> list[int]:
    """`text` as the tokenizer would give it: each marker as its token, the rest byte by byte."""
    ids: list[int] = []
    for piece in re.split("(" + "|".join(re.escape(m) for m in MARKERS) + ")", text):
        ids += [MARKERS[piece]] if piece in MARKERS else list(piece.encode())
    return ids


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
@pytest.mark.parametrize("choice", ["auto", "required"])
def test_markers_are_their_tokens_where_the_vocabulary_has_them(fmt, choice):
    grammar = tool_call_ebnf([WEATHER, TIME], fmt, ToolChoice(choice))
    text = ("Let me see. " if choice == "auto" else "") + format_calls(fmt, [PARIS, NOW])
    m = compile_grammar(grammar, MARKED, syntax="ebnf").matcher()
    assert all(m.advance(t) for t in marked_ids(text)) and m.is_accepting()
    spelled = compile_grammar(grammar, MARKED, syntax="ebnf").matcher()
    has_marker = any(marker in text for marker in MARKERS)
    assert (spelled.advance_bytes(text.encode()) and spelled.is_accepting()) is not has_marker
    parsed = parse_tool_output(text, fmt)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.complete_calls] == [PARIS, NOW]


def test_none_has_no_grammar_and_bad_choices_are_refused():
    assert tool_call_ebnf([WEATHER], "hermes", ToolChoice("none")) is None
    with pytest.raises(ValueError, match="not a declared function"):
        tool_call_ebnf([WEATHER], "hermes", ToolChoice("named", "other"))
    with pytest.raises(ValueError, match="unique"):
        tool_call_ebnf([WEATHER, WEATHER], "hermes", ToolChoice("required"))


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_bad_schema_names_function_and_pointer(fmt):
    bad = FunctionSpec("f", {"type": "object", "properties": {"x": {"type": "string", "pattern": "(?<=a)b"}}})
    with pytest.raises(ToolSchemaError, match=r"tools\[1\]\.function\.parameters \(f\).*/properties/x"):
        tool_call_ebnf([TIME, bad], fmt, ToolChoice("required"))


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_an_unknown_type_is_named_by_its_pointer_and_a_named_choice_by_its_index(fmt):
    typo = FunctionSpec("f", {"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": ["string", "int"]}}}, "c": {"enum": [{"type": "not-a-schema"}]}}})
    with pytest.raises(ToolSchemaError, match=r"tools\[1\]\.function\.parameters \(f\): "
                                              r"/properties/a/properties/b: unknown type 'int'"):
        tool_call_ebnf([TIME, typo], fmt, ToolChoice("named", "f"))
    data_only = FunctionSpec("g", {"type": "object", "properties": {"c": {"enum": [{"type": "x"}]}, "d": {}},
                                   "dependentRequired": {"type": ["d"]}})
    assert tool_call_ebnf([data_only], fmt, ToolChoice("required"))  # values and names, not schemas
    nested = FunctionSpec("h", {"type": "object", "properties": {"l": {"type": "array", "items": {"anyOf": [
        {"type": "string"}, {"type": "float"}]}}}})
    with pytest.raises(ToolSchemaError, match=r"/properties/l/items/anyOf/1: unknown type 'float'"):
        tool_call_ebnf([nested], fmt, ToolChoice("auto"))


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_parse_round_trip_and_streamed_prefixes_only_grow(fmt):
    text = "Sure. " + format_calls(fmt, [PARIS, NOW])
    parsed = parse_tool_output(text, fmt)
    assert parsed.content == "Sure. "
    assert [(c.name, json.loads(c.arguments)) for c in parsed.complete_calls] == [PARIS, NOW]
    content, args = "", ["", ""]
    for k in range(len(text) + 1):
        part = parse_tool_output(text[:k], fmt, final=False)
        assert part.content.startswith(content)
        content = part.content
        for i, call in enumerate(part.calls):
            assert call.arguments.startswith(args[i]) or not args[i]
            args[i] = call.arguments
    assert args == [c.arguments for c in parsed.complete_calls]
    assert parse_tool_output("no calls here", fmt).calls == ()
    trigger = SPELLINGS[fmt].trigger
    assert parse_tool_output("x" + trigger[:-1], fmt, final=False).content == "x"  # a trigger may be coming


def test_free_text_stops_at_triggers():
    text = text_until("t-", {"<tool_call>": '"!"', "aab": '"?"'}, may_end=True)
    grammar = f"root ::= {text.start}\n{text.text}"
    table = [("hello <tool", True), ("x<tool_call>!", True), ("x<tool_call>", False), ("aaab?", True),
             ("aab", False), ("<<tool_call>!", True), ("x<tool_call>! more", False)]
    for sample, accepted in table:
        assert accepts(grammar, sample) is accepted, sample
    with pytest.raises(ValueError, match="inside"):
        text_until("t-", {"ab": '"x"', "xaby": '"y"'})


def test_prefix_rules_leaves_literals_alone():
    src = 'root ::= "root" [a-z] /x{2}/ value{1,2} # value\nvalue ::= "v"'
    assert prefix_rules(src, "p-") == 'p-root ::= "root" [a-z] /x{2}/ p-value{1,2} # value\np-value ::= "v"'


def test_thinking_then_constrained_answer():
    answer = EmbeddedRules(*tool_call_rules([TIME], "hermes", ToolChoice("required")))
    call = format_calls("hermes", [NOW])
    closed = thinking_ebnf(answer, opened=False)
    assert accepts(closed, f"<think>\nmaybe <tool_call> here\n</think>\n\n{call}")
    assert accepts(closed, call) and not accepts(closed, "<think>x</think>\nhello")
    opened = thinking_ebnf(answer, opened=True)
    assert accepts(opened, f"hmm</think>{call}") and not accepts(opened, call)
    split = split_reasoning("<think>\nwhy\n</think>\n\nhi", opened=False)
    assert (split.reasoning, split.content) == ("why\n", "hi")
    assert split_reasoning("why</thi", opened=True, final=False).reasoning == "why"
    assert split_reasoning("plain", opened=False).reasoning is None


# ------------------------------------------------------------------------------------------------ property
LEAVES = st.sampled_from([
    {"type": "string", "maxLength": 6}, {"type": "integer", "minimum": -5, "maximum": 500}, {"type": "boolean"},
    {"type": "number"}, {"enum": ["red", "green", 3]}, {"type": "string", "enum": ["a b", "c\"d"]},
    {"type": "null"}, {"const": "fixed"},
])


def _objects(children):
    keys = st.sampled_from(["a", "b", "city", "n_2", "deep"])
    return st.dictionaries(keys, children, min_size=0, max_size=3).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props) or ["a"]), unique=True).map(
            lambda req: {"type": "object", "properties": props, "required": [r for r in req if r in props]}))


SCHEMAS = st.recursive(LEAVES, lambda children: st.one_of(
    _objects(children), st.builds(lambda item: {"type": "array", "items": item, "maxItems": 2}, children)),
    max_leaves=6)


def random_walk(grammar: str, vocab: Vocabulary, decode, seed: int, max_steps: int = 400):
    """Sample allowed tokens uniformly until EOS (picked with probability 1/2 once allowed); None if too long."""
    rng = np.random.default_rng(seed)
    matcher = compile_grammar(grammar, vocab, syntax="ebnf").matcher()
    ids: list[int] = []
    eos = set(vocab.eos_token_ids)
    for _ in range(max_steps):
        allowed = matcher.allowed_token_ids()
        ends = [t for t in allowed if t in eos]
        if ends and (rng.random() < 0.5 or len(ends) == len(allowed)):
            return decode(ids)
        choices = [t for t in allowed if t not in eos]
        token = int(choices[rng.integers(len(choices))])
        assert matcher.advance(token)
        ids.append(token)
    return None


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(props=_objects(SCHEMAS), seed=st.integers(0, 2**16), choice=st.sampled_from(["required", "auto", "named"]))
def test_random_walks_parse_and_validate(fmt, props, seed, choice):
    vocab, _encode = smollm2()
    tok = _tokenizer()
    other = FunctionSpec("other_fn", props)
    functions = [other, TIME]
    tool_choice = ToolChoice("named", "other_fn") if choice == "named" else ToolChoice(choice)
    grammar = tool_call_ebnf(functions, fmt, tool_choice, parallel=True)
    ids = random_walk(grammar, vocab, list, seed)
    if ids is None:  # ran past the step budget (a long free text)
        return
    text = tok.decode(ids)
    WALKED.append(text)
    parsed = parse_tool_output(text, fmt)
    if choice != "auto":
        assert parsed.complete_calls and parsed.content == ""
    assert all(c.complete for c in parsed.calls)
    schemas = {fn.name: fn.parameters for fn in functions}
    for call in parsed.complete_calls:
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])
    # The server's path, whole and streamed token by token: the same calls, each valid.
    shape = ChatShape(tool_format=fmt, markers_kept=True)
    message = assistant_message(text, shape)
    whole = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    assert whole == [(c.name, c.arguments) for c in parsed.complete_calls]
    content, calls = streamed_message(tok, ids, shape)
    assert calls == whole
    assert (content.strip() or None if whole else content) == message["content"]
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), schemas[name])


def streamed_message(tok: Tokenizer, ids: list[int], shape: ChatShape) -> tuple[str, list[tuple[str, str]]]:
    """The content and calls a client assembles from the stream deltas of `ids`, decoded one token at a time as
    the engine sends them: names on the delta that has an id, arguments appended per index."""
    detok = tok.incremental_detokenizer()
    stream = ChoiceStream(shape)
    pieces = [detok.feed(t) for t in ids] + [detok.flush()]
    deltas = [d for piece in pieces for d in stream.feed(piece)] + stream.feed("", final=True)
    content, calls = "", []
    for delta in deltas:
        content += delta.get("content", "")
        for part in delta.get("tool_calls", []):
            if "id" in part:
                assert part["index"] == len(calls) and part["function"]["arguments"] == ""
                calls.append([part["function"]["name"], ""])
            calls[part["index"]][1] += part["function"]["arguments"]
    return content, [(name, arguments) for name, arguments in calls]


WALKED: list[str] = []


def test_walks_were_taken():
    assert WALKED, "every random walk ran out of steps; the property test checked nothing"


@functools.cache
def _tokenizer() -> Tokenizer:
    return Tokenizer.from_file(TOKENIZERS / "smollm2-135m-instruct.tokenizer.gguf")
