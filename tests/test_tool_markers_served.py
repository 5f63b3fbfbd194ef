"""Tool-call markers that are special tokens reach the server's parser whatever `skip_special_tokens` says: a
Mistral `[TOOL_CALLS]` (a control token) opens the calls, and free text spelled in a call's layout without it
stays content. On a tiny random model over a character-level tokenizer whose markers are added tokens
(`[TOOL_CALLS]` special, `<tool_call>` not), with the official `openai` client."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from radixgen.grammars.tool_formats import SPELLINGS
from radixgen.server.chat_output import ChoiceStream, assistant_message
from radixgen.server.openai_tools import ChatShape

openai = pytest.importorskip("openai")
pytest.importorskip("transformers")

MARKERS = {"[TOOL_CALLS]": True, "<tool_call>": False, "</tool_call>": False, "<|end|>": True}  # text -> special
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string", "maxLength": 8}}, "required": ["tz"]}}}
COUNT = {"type": "function", "function": {"name": "count", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"]}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (TIME, COUNT)}
ASK = [{"role": "user", "content": "time?"}]
TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


def _write_tokenizer(folder: Path) -> None:
    """Printable ASCII and newline one character a token, then the markers as added tokens; `<|end|>` is EOS."""
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {ch: i for i, ch in enumerate(chars)}
    ids = {text: len(vocab) + i for i, text in enumerate(MARKERS)}
    added = [{"id": ids[text], "content": text, "special": special, "normalized": False, "single_word": False,
              "lstrip": False, "rstrip": False} for text, special in MARKERS.items()]
    spec = {"version": "1.0", "added_tokens": added, "normalizer": None, "pre_tokenizer": None,
            "post_processor": None, "decoder": None, "model": {"type": "BPE", "vocab": {**vocab, **ids}, "merges": []}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>"}))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from model_fixtures import write_tiny_checkpoint

    from radixgen.runtime.engine import Engine

    root = tmp_path_factory.mktemp("served-markers")
    checkpoint = write_tiny_checkpoint(root / "llama", "llama", seed=11, overrides={"max_position_embeddings": 1024})
    _write_tokenizer(root / "tok")
    with Engine(str(checkpoint), tokenizer_path=str(root / "tok"), device="cpu", max_total_tokens=1024) as eng:
        yield eng


@pytest.fixture(scope="module", params=["mistral", "hermes"])
def client(request, engine):
    from radixgen.server.launch import BackgroundServer
    from radixgen.server.state import ServerSettings

    settings = ServerSettings(port=0, owns_engine=False, tool_call_format=request.param, chat_template=TEMPLATE)
    srv = BackgroundServer(engine, settings).start()
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120), request.param
    srv.stop()


def _valid(calls) -> list[tuple[str, dict]]:
    out = []
    for call in calls or []:
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        out.append((call.function.name, args))
    return out


@pytest.mark.parametrize("skip", [True, False])
def test_required_calls_parse_though_special_tokens_are_skipped(client, skip):
    client, _fmt = client
    kwargs = {"messages": ASK, "tools": [TIME, COUNT], "tool_choice": "required", "parallel_tool_calls": False,
              "max_tokens": 60, "temperature": 1.0, "extra_body": {"skip_special_tokens": skip}}
    for seed in range(3):
        r = client.chat.completions.create(model="m", seed=seed, logprobs=True, **kwargs)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        calls = _valid(choice.message.tool_calls)
        assert len(calls) == 1
        first = choice.logprobs.content[0].token
        assert first in ("[TOOL_CALLS]", "<tool_call>")  # the marker is the output's first token
        with client.chat.completions.stream(model="m", seed=seed, **kwargs) as stream:
            for _ in stream:
                pass
            final = stream.get_final_completion()
        assert _valid(final.choices[0].message.tool_calls) == calls


def test_auto_text_never_holds_its_marker_and_its_calls_are_valid(client):
    client, fmt = client
    marker = SPELLINGS[fmt].marker
    for seed in range(4):
        r = client.chat.completions.create(model="m", messages=ASK, tools=[TIME, COUNT], max_tokens=40,
                                           temperature=1.0, seed=seed)
        message = r.choices[0].message
        _valid(message.tool_calls)
        assert marker not in (message.content or "")  # (another format's marker is text like any other)


@pytest.mark.parametrize("fmt, text", [
    ("mistral", 'Shown as [{"name": "get_time", "arguments": {"tz": "x"}}] in the docs.'),
    ("hermes", 'Write {"name": "get_time", "arguments": {}} between the tags.'),
])
def test_a_calls_layout_without_its_marker_stays_content_when_markers_are_kept(fmt, text):
    kept = ChatShape(tool_format=fmt, markers_kept=True)
    assert assistant_message(text, kept) == {"role": "assistant", "content": text}
    stream = ChoiceStream(kept)
    deltas = [d for k in range(len(text)) for d in stream.feed(text[k])] + stream.feed("", final=True)
    assert "".join(d.get("content", "") for d in deltas) == text and not stream.made_calls
    skipped = assistant_message(text, ChatShape(tool_format=fmt))  # decoded without specials: read as a call
    assert [c["function"]["name"] for c in skipped["tool_calls"]] == ["get_time"]
