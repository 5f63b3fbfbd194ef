"""Token references (grammars/token_refs.py): a grammar element that matches one token id (a special or added
token) in EBNF and Lark, the masks that allow exactly that id where the grammar names it and never its spelling,
the matcher's marker path, jump-forward around it, tool-call formats and structural tags writing their markers
as tokens where the vocabulary has them, the parsers reading the markers back whether the detokenizer kept or
skipped them, and an engine run on a tiny random model whose tool call holds the marker's id.

Vocabularies: Qwen3's real tokenizer (`<tool_call>` / `</tool_call>` are added, non-special tokens; `<|im_end|>`
is special), Mistral 7B v0.1's with `[TOOL_CALLS]` added as a special token (as v0.3 has it), GPT-2's ranks with
Llama 3.1's `<|python_tag|>` / `<|eom_id|>` added (GPT-2 has a byte token for 0xFF), and SmolLM2's (no marker is
one token there: the markers stay text)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
from grammar_vocabs import TOKENIZERS, qwen3, smollm2

from radixgen.grammars import GrammarError, Vocabulary, clear_cache, compile_grammar
from radixgen.grammars.backends.common import peer_source
from radixgen.grammars.ebnf_embed import prefix_rules
from radixgen.grammars.structural_tag import StructuralTag, TagStructure, structural_tag_ebnf
from radixgen.grammars.token_refs import MAX_REF_IDS, marker_bytes
from radixgen.grammars.tool_formats import FunctionSpec, ToolChoice, format_calls, tool_call_ebnf
from radixgen.grammars.tool_parsers import parse_tool_output
from radixgen.runtime.constraints import build_vocabulary
from radixgen.tokenizer import Tokenizer

# ------------------------------------------------------------------------------------------------ vocabularies
# ids 0-255: one byte each (255 is b"\xff", as GPT-2 has it); then EOS and two special tokens; then an added
# (non-special) token and a text token that is a prefix of it
TINY = [bytes([b]) for b in range(256)] + [b"<eos>", b"[TOOL_CALLS]", b"<|python_tag|>", b"<tool_call>", b"<tool"]
EOS, TOOL_CALLS, PYTHON_TAG, TOOL_CALL, TOOL_PREFIX = 256, 257, 258, 259, 260
BYTES = Vocabulary(TINY, eos_token_ids=[EOS], special_ids=[TOOL_CALLS, PYTHON_TAG])


def allowed(matcher) -> set[int]:
    return set(matcher.allowed_token_ids().tolist())


@functools.cache
def mistral() -> tuple[Tokenizer, Vocabulary]:
    """Mistral 7B v0.1's tokenizer with `[TOOL_CALLS]` added as a special token (id 32000)."""
    spec = json.loads((TOKENIZERS / "mistral-7b-v0.1.tokenizer.json").read_text())
    spec["added_tokens"].append({"id": 32000, "content": "[TOOL_CALLS]", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True})
    tok = Tokenizer.from_file(_written(spec, "mistral-tool-calls"))
    return tok, build_vocabulary(tok)


@functools.cache
def llama3ish() -> tuple[Tokenizer, Vocabulary]:
    """GPT-2's ranks with Llama 3.1's `<|python_tag|>` (50257) and `<|eom_id|>` (50258) as special tokens."""
    tok = Tokenizer.from_file(TOKENIZERS / "r50k_base.tiktoken", pattern="gpt2",
                              special_tokens={"<|endoftext|>": 50256, "<|python_tag|>": 50257, "<|eom_id|>": 50258})
    return tok, build_vocabulary(tok)


@functools.cache
def qwen() -> tuple[Tokenizer, Vocabulary]:
    return Tokenizer.from_file(TOKENIZERS / "qwen3"), qwen3()[0]


def _written(spec: dict, name: str) -> Path:
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=name))
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder


def test_the_fixtures_hold_the_markers_as_single_tokens():
    tok, vocab = qwen()
    assert vocab.token_id_of("<tool_call>") == tok.token_to_id("<tool_call>") == 151657
    assert 151657 not in vocab.special_ids and vocab.token_id_of("</tool_call>") == 151658
    assert vocab.token_id_of("<|im_end|>") in vocab.special_ids
    assert mistral()[1].token_id_of("[TOOL_CALLS]") == 32000 and 32000 in mistral()[1].special_ids
    assert llama3ish()[1].token_id_of("<|python_tag|>") == 50257
    assert smollm2()[0].token_id_of("<tool_call>") is None and smollm2()[0].token_id_of("[TOOL_CALLS]") is None


# ------------------------------------------------------------------------------------------------ syntax
# (syntax, grammar, the ids allowed first)
FIRST_MASKS = [
    ("ebnf", "root ::= <[257]>", {TOOL_CALLS}),
    ("ebnf", "root ::= <[257-258]> | <[259]>", {TOOL_CALLS, PYTHON_TAG, TOOL_CALL}),
    ("ebnf", "root ::= <[0-2,4]>", {0, 1, 2, 4}),
    ("ebnf", "root ::= <|python_tag|>", {PYTHON_TAG}),
    ("ebnf", "root ::= <[TOOL_CALLS]>", {TOOL_CALLS}),
    ("ebnf", "root ::= <tool_call>", {TOOL_CALL}),  # an added token that is no special one
    ("ebnf", 'root ::= <~"[TOOL_CALLS]">', {TOOL_CALLS}),
    ("ebnf", 'root ::= <~"<tool_call>">', {TOOL_CALL}),
    ("ebnf", 'root ::= <~"<nope>">', {ord("<")}),  # no such token: the text
    ("ebnf", 'root ::= "a"? <[257]>', {ord("a"), TOOL_CALLS}),
    ("lark", "start: <[257]>", {TOOL_CALLS}),
    ("lark", "start: <|python_tag|> | <[TOOL_CALLS]>", {PYTHON_TAG, TOOL_CALLS}),
    ("lark", 'start: x\nx: "b" | <tool_call>', {ord("b"), TOOL_CALL}),
    ("lark", 'start: <[257]>\n%ignore " "', {ord(" "), TOOL_CALLS}),
    ("lark", 'start: <~"<tool_call>">', {TOOL_CALL}),
]


@pytest.mark.parametrize("syntax, grammar, first", FIRST_MASKS)
def test_a_reference_allows_exactly_its_ids(syntax, grammar, first):
    matcher = compile_grammar(grammar, BYTES, syntax=syntax).matcher()
    assert allowed(matcher) == first


@pytest.mark.parametrize("syntax, grammar, message", [
    ("ebnf", "root ::= <|nope|>", "no single token of the vocabulary spells it"),
    ("ebnf", "root ::= <[261]>", "outside the vocabulary"),
    ("ebnf", "root ::= <[5-3]>", "ends before it starts"),
    ("ebnf", f"root ::= <[0-{MAX_REF_IDS}]>", "more than"),
    ("ebnf", "root ::= < x >", "opens no token reference"),
    ("lark", "start: A\nA: \"a\" <[257]>", "cannot be used inside a terminal"),
    ("lark", "start: <|nope|>", "no single token"),
])
def test_bad_references_are_refused(syntax, grammar, message):
    with pytest.raises(GrammarError, match=message):
        compile_grammar(grammar, BYTES, syntax=syntax)


def test_references_inside_literals_classes_regexes_and_comments_are_text():
    grammar = 'root ::= "<[257]>" [<] /<x>/ # <|nope|>\n'
    matcher = compile_grammar(grammar, BYTES, syntax="ebnf").matcher()
    assert matcher.advance_bytes(b"<[257]><<x>") and matcher.is_accepting()
    lark = 'start: "<[257]>" /<y>/  // <|nope|>\n'
    assert compile_grammar(lark, BYTES).matcher().advance_bytes(b"<[257]><y>")


def test_prefixing_rules_leaves_references_alone():
    text = 'root ::= <|python_tag|> body <~"<tool_call>"> <[1-3]>\nbody ::= "x"'
    assert prefix_rules(text, "p-") == 'p-root ::= <|python_tag|> p-body <~"<tool_call>"> <[1-3]>\np-body ::= "x"'


# ------------------------------------------------------------------------------------------------ masks, matcher
def test_the_marker_is_never_spelled_and_specials_never_read_as_text():
    grammar = compile_grammar('root ::= "a" <[TOOL_CALLS]> "[" [^\\]]* "]"', BYTES, syntax="ebnf")
    m = grammar.matcher()
    assert m.advance(ord("a"))
    assert allowed(m) == {TOOL_CALLS}
    for spelled in (ord("["), 255, TOOL_PREFIX, PYTHON_TAG, EOS):  # text, the 0xFF byte token, other specials
        assert not m.accepts_token(spelled)
    assert not m.advance_bytes(b"[TOOL_CALLS]")
    assert m.advance(TOOL_CALLS) and m.advance(ord("["))
    inside = allowed(m)  # free text: no special token, no 0xFF byte, no marker bytes
    assert TOOL_CALLS not in inside and PYTHON_TAG not in inside and 255 not in inside and EOS not in inside
    assert ord("[") in inside and TOOL_CALL in inside  # an added token is text where the grammar has text
    assert m.advance(ord("]")) and allowed(m) == {EOS} and m.advance(EOS) and m.is_terminated()


def test_an_added_token_named_as_a_token_refuses_its_spelling_there():
    tok, vocab = qwen()
    m = compile_grammar('root ::= "Hi" <tool_call> "\\n"', vocab, syntax="ebnf").matcher()
    assert m.advance(tok.encode("Hi", add_special_tokens=False)[0])
    assert allowed(m) == {151657}
    spelled = Tokenizer.encode(tok, "<tool_", add_special_tokens=False)
    assert spelled[0] != 151657 and not m.accepts_token(spelled[0])
    assert m.advance(151657) and allowed(m) == set(tok.encode("\n", add_special_tokens=False))


def test_forced_bytes_stop_before_a_marker_and_the_token_is_forced_as_an_id():
    m = compile_grammar('root ::= "ab" <[TOOL_CALLS]> "cd" (<|python_tag|> | "e")', BYTES, syntax="ebnf").matcher()
    assert m.forced_suffix() == b"ab" and m.forced_token() is None
    assert m.advance_bytes(b"ab")
    assert m.forced_suffix() == b"" and m.forced_token() == TOOL_CALLS
    assert not m.is_terminated() and not m.is_accepting()
    assert m.advance(TOOL_CALLS) and m.forced_suffix() == b"cd" and m.forced_token() is None
    assert m.advance_bytes(b"cd") and m.forced_token() is None  # a choice: the token or "e"
    assert allowed(m) == {PYTHON_TAG, ord("e")}
    assert m.advance(PYTHON_TAG) and m.is_terminated()
    m.rollback(3)
    assert m.forced_token() == TOOL_CALLS and m.num_advanced == 1


def test_eos_named_as_a_token_is_read_as_one_where_the_grammar_names_it():
    m = compile_grammar('root ::= "a" <[256]> "b"', BYTES, syntax="ebnf").matcher()
    assert m.advance(ord("a")) and allowed(m) == {EOS}
    assert m.advance(EOS) and not m.is_terminated() and m.advance(ord("b"))
    assert allowed(m) == {EOS} and m.advance(EOS) and m.is_terminated()


def test_references_survive_the_disk_cache(tmp_path):
    from radixgen.grammars.disk_cache import GrammarDiskCache

    grammar = 'root ::= ( "x" | <[257-258]> )+'
    vocab = Vocabulary(TINY, [EOS], [TOOL_CALLS, PYTHON_TAG], grammar_cache=GrammarDiskCache(tmp_path))
    first = compile_grammar(grammar, vocab, syntax="ebnf").matcher()
    clear_cache()
    again = compile_grammar(grammar, vocab, syntax="ebnf").matcher()
    assert list(tmp_path.glob("*.grammar"))
    for m in (first, again):
        assert m.advance(PYTHON_TAG) and allowed(m) == {ord("x"), TOOL_CALLS, PYTHON_TAG, EOS}


def test_a_range_reads_each_of_its_ids():
    vocab = llama3ish()[1]
    grammar = compile_grammar("root ::= <[50256-50258]> <[50257]>", vocab, syntax="ebnf")
    m = grammar.matcher()
    assert allowed(m) == {50256, 50257, 50258}
    assert m.advance(50258) and allowed(m) == {50257}
    byte_ff = next(i for i, b in enumerate(vocab.token_bytes) if b == b"\xff")
    assert not m.accepts_token(byte_ff) and not m.advance_bytes(marker_bytes(50257)[:1] + b"x")


# ------------------------------------------------------------------------------------------------ tool formats
WEATHER = FunctionSpec("get_weather", {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}},
                                       "required": ["unit"]})
TIME = FunctionSpec("get_time")


def _walk(grammar: str, vocab: Vocabulary, tokens: list[int]) -> object:
    m = compile_grammar(grammar, vocab, syntax="ebnf").matcher()
    for t in tokens:
        assert m.advance(t), t
    return m


def test_mistral_required_opens_with_the_control_token():
    tok, vocab = mistral()
    grammar = tool_call_ebnf([WEATHER, TIME], "mistral", ToolChoice("required"))
    m = compile_grammar(grammar, vocab, syntax="ebnf").matcher()
    assert allowed(m) == {32000}
    assert not m.accepts_token(tok.encode("[", add_special_tokens=False)[-1])
    text = format_calls("mistral", [("get_time", {})])
    ids = tok.encode(text, add_special_tokens=False)  # the tokenizer matches the marker as its token
    assert ids[0] == 32000
    m = _walk(grammar, vocab, ids)
    assert m.is_accepting()
    decoded = tok.decode(ids, skip_special_tokens=True)
    assert not decoded.startswith("[TOOL_CALLS]")  # skipped: the parser finds the calls all the same
    for shown in (decoded, tok.decode(ids)):
        parsed = parse_tool_output(shown, "mistral")
        assert [(c.name, c.arguments) for c in parsed.complete_calls] == [("get_time", "{}")]


def test_hermes_on_qwen_writes_both_markers_as_its_added_tokens():
    tok, vocab = qwen()
    grammar = tool_call_ebnf([WEATHER, TIME], "hermes", ToolChoice("required"), parallel=False)
    text = format_calls("hermes", [("get_weather", {"unit": "f"})])
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == 151657 and ids[-1] == 151658
    m = compile_grammar(grammar, vocab, syntax="ebnf").matcher()
    assert allowed(m) == {151657}
    for t in ids[:-1]:
        assert m.advance(t)
    assert allowed(m) == {151658}  # the close marker, never "</" spelled
    assert m.advance(ids[-1]) and m.is_accepting()
    assert parse_tool_output(tok.decode(ids), "hermes").complete_calls[0].name == "get_weather"


def test_auto_free_text_cannot_spell_the_marker_but_may_end_in_its_token():
    tok, vocab = mistral()
    grammar = tool_call_ebnf([TIME], "mistral", ToolChoice("auto"))
    m = compile_grammar(grammar, vocab, syntax="ebnf").matcher()
    assert m.advance_bytes(b"Let me look [TOOL_CALLS")
    assert not m.accepts_token(tok.token_to_id("]"))  # the marker's text never occurs in free text
    assert 32000 in allowed(m)
    assert m.advance(32000) and m.forced_suffix() == b'[{"name": "get_time", "arguments": {}}'
    parsed = parse_tool_output('Let me look [TOOL_CALLS[{"name": "get_time", "arguments": {}}]', "mistral")
    assert parsed.content == "Let me look [TOOL_CALLS" and parsed.complete_calls[0].name == "get_time"


def test_without_single_tokens_the_markers_stay_text():
    vocab, encode = smollm2()
    grammar = tool_call_ebnf([TIME], "hermes", ToolChoice("required"))
    text = format_calls("hermes", [("get_time", {})])
    m = _walk(grammar, vocab, encode(text))
    assert m.is_accepting()
    assert len(encode("<tool_call>")) > 1


def test_llama3_calls_after_a_python_tag_are_read():
    parsed = parse_tool_output('<|python_tag|>{"name": "get_time", "parameters": {}}', "llama3")
    assert parsed.content == "" and parsed.complete_calls[0].name == "get_time"


def test_a_structural_tag_trigger_that_is_one_token_opens_with_it():
    tok, vocab = qwen()
    tag = StructuralTag((TagStructure('<tool_call>\n{"name": "get_time", "arguments": ', {"type": "object"},
                                      "}\n</tool_call>"),), ("<tool_call>",))
    grammar = structural_tag_ebnf(tag)
    m = compile_grammar(grammar, vocab, syntax="ebnf").matcher()
    assert m.advance_bytes(b"Sure. <tool_call")
    assert 151657 in allowed(m) and not m.accepts_token(tok.token_to_id(">"))
    ids = tok.encode('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call> done', add_special_tokens=False)
    assert ids[0] == 151657
    for t in ids:
        assert m.advance(t)
    assert m.is_accepting()


# ------------------------------------------------------------------------------------------------ parsers
@pytest.mark.parametrize("fmt, text, content, names", [
    ("mistral", '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]', "", ["a", "b"]),
    ("mistral", 'Sure: [{"name": "a", "arguments": {}}]', "Sure: ", ["a"]),
    ("mistral", 'x [{"name": "a", "value": 1}]', 'x [{"name": "a", "value": 1}]', []),  # not a call's layout
    ("hermes", '\n{"name": "a", "arguments": {}}\n\n{"name": "b", "arguments": {}}\n', "\n", ["a", "b"]),
    ("hermes", 'Text {"name": "Bob"} more', 'Text {"name": "Bob"} more', []),
])
def test_parsers_find_calls_whose_marker_was_skipped(fmt, text, content, names):
    parsed = parse_tool_output(text, fmt)
    assert parsed.content == content and [c.name for c in parsed.complete_calls] == names


@pytest.mark.parametrize("fmt, text", [
    ("mistral", 'I will. [{"name": "get_time", "arguments": {"tz": "x"}}, {"name": "b", "arguments": {}}]'),
    ("hermes", 'Ok\n{"name": "get_time", "arguments": {"tz": [1, 2]}}\n'),
])
def test_skipped_marker_streams_only_grow(fmt, text):
    sent_content, sent_calls = "", []
    for end in range(len(text) + 1):
        parsed = parse_tool_output(text[:end], fmt, final=end == len(text))
        assert parsed.content.startswith(sent_content)
        sent_content = parsed.content
        named = [(c.name, c.arguments) for c in parsed.calls if c.name is not None]
        for (name, args), (old_name, old_args) in zip(named, sent_calls):
            assert name == old_name and args.startswith(old_args)
        assert len(named) >= len(sent_calls)
        sent_calls = named
    assert parse_tool_output(text, fmt).complete_calls[0].name == "get_time"


# ------------------------------------------------------------------------------------------------ peers
def test_peer_sources_spell_fallback_references_and_refuse_the_rest():
    assert peer_source("x", 'root ::= <~"[TOOL_CALLS]"> "[" a', "ebnf") == 'root ::= "[TOOL_CALLS]" "[" a'
    assert peer_source("x", 'start: <~"<a>"> | "<b>"', "lark") == 'start: "<a>" | "<b>"'
    assert peer_source("x", "start: <|python_tag|>", "lark", reads_refs=True) == "start: <|python_tag|>"
    with pytest.raises(GrammarError, match="cannot read the token reference <\\[5\\]>"):
        peer_source("xgrammar", "root ::= <[5]>", "ebnf")


def test_xgrammar_compiles_a_tool_grammar_with_its_markers_as_text():
    pytest.importorskip("xgrammar")
    from radixgen.grammars.backends.xgrammar_backend import XGrammarBackend
    from radixgen.grammars.constraint import Constraint

    vocab, encode = smollm2()
    grammar = tool_call_ebnf([TIME], "mistral", ToolChoice("required"))
    matcher = XGrammarBackend(vocab).compile(Constraint("ebnf", grammar)).matcher()
    for t in encode(format_calls("mistral", [("get_time", {})])):
        assert matcher.advance(t)


def test_llguidance_reads_the_same_lark_references_as_radixgen():
    pytest.importorskip("llguidance")
    from radixgen.grammars.backends.llguidance_backend import LLGuidanceBackend
    from radixgen.grammars.constraint import Constraint

    vocab, encode = smollm2()
    source = 'start: "a" <|im_start|> "b"'
    ids = [encode("a")[0], vocab.token_id_of("<|im_start|>"), encode("b")[0]]
    ours = compile_grammar(source, vocab).matcher()
    peer = LLGuidanceBackend(vocab, encode).compile(Constraint("grammar", source)).matcher()
    for token in ids:
        assert ours.advance(token) and peer.advance(token)
    assert ours.is_terminated()


# ------------------------------------------------------------------------------------------------ the engine
SPECIAL_ADDED = {"[TOOL_CALLS]": True, "<tool_call>": False, "</tool_call>": False, "<|end|>": True}


def _write_tokenizer(folder: Path) -> dict[str, int]:
    """A character-level tokenizer.json: printable ASCII and newline, then the markers as added tokens (Mistral's
    special, Qwen's not) and `<|end|>` (EOS); returns the markers' ids."""
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {ch: i for i, ch in enumerate(chars)}
    ids = {text: len(vocab) + i for i, text in enumerate(SPECIAL_ADDED)}
    added = [{"id": ids[text], "content": text, "special": special, "normalized": False, "single_word": False,
              "lstrip": False, "rstrip": False} for text, special in SPECIAL_ADDED.items()]
    spec = {"version": "1.0", "added_tokens": added, "normalizer": None, "pre_tokenizer": None,
            "post_processor": None, "decoder": None,
            "model": {"type": "BPE", "vocab": {**vocab, **ids}, "merges": []}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>"}))
    return ids


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    pytest.importorskip("transformers")
    from model_fixtures import write_tiny_checkpoint

    from radixgen.runtime.engine import Engine

    root = tmp_path_factory.mktemp("special-tokens")
    checkpoint = write_tiny_checkpoint(root / "llama", "llama", seed=7, overrides={"max_position_embeddings": 2048})
    ids = _write_tokenizer(root / "tok")
    with Engine(str(checkpoint), tokenizer_path=str(root / "tok"), device="cpu", max_total_tokens=2048) as engine:
        yield engine, ids


@pytest.mark.parametrize("fmt", ["mistral", "hermes"])
def test_an_engine_tool_call_holds_the_marker_token_and_parses(tiny_engine, fmt):
    engine, ids = tiny_engine
    grammar = tool_call_ebnf([WEATHER, TIME], fmt, ToolChoice("required"), parallel=False)
    params = {"ebnf": grammar, "temperature": 1.0, "seed": 3, "max_new_tokens": 120}
    out = engine.generate("call a tool: ", params)
    output_ids = out["output_ids"]
    if fmt == "mistral":
        assert output_ids[0] == ids["[TOOL_CALLS]"] and out["text"].startswith("[{")  # skipped in the text
    else:
        assert output_ids[0] == ids["<tool_call>"] and ids["</tool_call>"] in output_ids
        assert out["text"].startswith("<tool_call>")  # an added token that is not special: kept
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    calls = parse_tool_output(out["text"], fmt).complete_calls
    assert len(calls) == 1 and calls[0].name in ("get_weather", "get_time")
    spelled = engine.tokenizer.decode(output_ids, skip_special_tokens=False)
    assert parse_tool_output(spelled, fmt).complete_calls == calls
    np.testing.assert_array_equal(np.array(output_ids) < len(engine.tokenizer.all_token_bytes()), True)


@pytest.mark.parametrize("fmt", ["mistral", "hermes"])
def test_a_chat_request_with_required_tools_returns_the_call(tiny_engine, fmt):
    import urllib.error
    import urllib.request

    from radixgen.server.launch import BackgroundServer
    from radixgen.server.state import ServerSettings

    engine, _ = tiny_engine
    template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    settings = ServerSettings(port=0, owns_engine=False, tool_call_format=fmt, chat_template=template)
    tools = [{"type": "function", "function": {"name": f.name, "parameters": dict(f.parameters)}}
             for f in (WEATHER, TIME)]
    body = {"model": "m", "messages": [{"role": "user", "content": "weather?"}], "tools": tools,
            "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 120, "seed": 5}
    srv = BackgroundServer(engine, settings).start()
    try:
        request = urllib.request.Request(srv.url + "/v1/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                choice = json.loads(response.read())["choices"][0]
        except urllib.error.HTTPError as exc:
            raise AssertionError(exc.read().decode()) from None
    finally:
        srv.stop()
    calls = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "tool_calls" and len(calls) == 1
    assert calls[0]["function"]["name"] in ("get_weather", "get_time")
    assert isinstance(json.loads(calls[0]["function"]["arguments"]), dict)


def test_jump_forward_appends_a_forced_special_token_without_a_decode_step(tiny_engine):
    """Forced text stops before a marker (it is no text); the jump then appends the marker as its token and goes on
    with the text forced after it, so the output equals decoding without jump-forward while neither the marker
    nor the text after it costs a decode step of its own."""
    engine, ids = tiny_engine
    params = {"ebnf": 'root ::= "x" "yz" <tool_call> "w" <tool_call>', "temperature": 0, "max_new_tokens": 20}
    jumped = engine.generate("go: ", params)
    letters = [engine.tokenizer.encode(c, add_special_tokens=False)[0] for c in "xyzw"]
    marker = ids["<tool_call>"]
    assert jumped["output_ids"][:6] == letters[:3] + [marker, letters[3], marker]
    # Sampled: "x" only; "yz", both markers and the "w" between them were appended by one jump. Without the text
    # after a marker it would be 4 saved ("w" sampled), without the markers 3.
    assert jumped["meta_info"]["decode_steps_saved"] == 5
