"""Jump-forward through a forced chain (runtime/engine_core.py `_count_jump`): the sampled token, the text the
grammar forces after it, a forced marker (a special or added token), the text forced after that marker, further
markers, all in one jump while the row fits the multi-token graphs, the output budget holds and the longer jump
pays. On a character-level vocabulary (the tokenization is the same either way) the outputs equal decoding
without jump-forward, token for token; on Mistral's tokenizer the text after `[TOOL_CALLS]` is tokenized as the
tokenizer tokenizes the whole text (its Metaspace prefixes no space after a special token)."""

from __future__ import annotations

import json

import pytest
from test_special_token_grammar import TIME, WEATHER, _write_tokenizer, _written

from radixgen.grammars import compile_grammar
from radixgen.grammars.tool_formats import ToolChoice, tool_call_ebnf
from radixgen.grammars.tool_parsers import parse_tool_output
from radixgen.runtime.constraints import build_vocabulary

# Sampled: a letter, a digit; everything else is forced: "yz", <tool_call>, `\n{"n": `, then "}", </tool_call>,
# "\nok", <tool_call>, "end" (the grammar ends there: no EOS step).
CHAIN = r'root ::= [a-c] "yz" <tool_call> "\n{\"n\": " [0-9] "}" </tool_call> "\nok" <tool_call> "end"'


@pytest.fixture(scope="module")
def char_engine(tmp_path_factory):
    pytest.importorskip("transformers")
    from model_fixtures import write_tiny_checkpoint

    from radixgen.runtime.engine import Engine

    root = tmp_path_factory.mktemp("jump-markers")
    checkpoint = write_tiny_checkpoint(root / "llama", "llama", seed=7, overrides={"max_position_embeddings": 2048})
    ids = _write_tokenizer(root / "tok")
    with Engine(str(checkpoint), tokenizer_path=str(root / "tok"), device="cpu", max_total_tokens=2048) as engine:
        yield engine, ids


def _jumps(engine, monkeypatch) -> list[tuple[list[int], int]]:
    """Record every jump `_count_jump` returns: (its ids, how many of them lie outside the step's row)."""
    seen: list[tuple[list[int], int]] = []
    count = engine.core._count_jump

    def spy(req, ids, outside, lost=0):
        out = count(req, ids, outside, lost)
        seen.append((list(out), outside))
        return out

    monkeypatch.setattr(engine.core, "_count_jump", spy)
    return seen


def _generate(engine, monkeypatch, params: dict, jump: bool) -> dict:
    monkeypatch.setattr(engine.core.config, "enable_jump_forward", jump)
    return engine.generate("go: ", params)


def _valid_prefix(engine, grammar: str, ids: list[int]):
    """The matcher after `ids`, asserting the grammar takes every one of them."""
    matcher = compile_grammar(grammar, build_vocabulary(engine.tokenizer), syntax="ebnf").matcher()
    for t in ids:
        assert matcher.advance(t), t
    return matcher


def _spell(engine, text: str) -> list[int]:
    return engine.tokenizer.encode(text, add_special_tokens=False)


def test_one_jump_takes_the_text_after_each_forced_marker(char_engine, monkeypatch):
    engine, ids = char_engine
    params = {"ebnf": CHAIN, "temperature": 0, "max_new_tokens": 60}
    seen = _jumps(engine, monkeypatch)
    out = _generate(engine, monkeypatch, params, jump=True)
    output = out["output_ids"]
    assert engine.tokenizer.decode(output, skip_special_tokens=False).endswith("</tool_call>\nok<tool_call>end")
    open_, close = ids["<tool_call>"], ids["</tool_call>"]
    # Two jumps, each after a sampled token: the first through <tool_call> into `\n{"n": `, the second through
    # two markers and the text between and after them, up to the grammar's end.
    assert [j for j, _ in seen] == [output[:1] + _spell(engine, "yz") + [open_] + _spell(engine, '\n{"n": '),
                                    output[11:12] + _spell(engine, "}") + [close] + _spell(engine, "\nok") + [open_]
                                    + _spell(engine, "end")]
    assert out["meta_info"]["decode_steps_saved"] == len(output) - 2 == 19
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    assert _valid_prefix(engine, CHAIN, output).is_terminated()
    assert _generate(engine, monkeypatch, params, jump=False)["output_ids"] == output


def test_the_chain_stops_where_the_row_would_leave_the_graphs(char_engine, monkeypatch):
    """With multi-token graphs of at most 4 tokens a row, no jump's row is longer; the text after a marker is
    still taken in the marker's jump as far as the row has room (the rest a later jump takes)."""
    engine, ids = char_engine
    monkeypatch.setattr(type(engine.core.runner), "max_graph_row_tokens", property(lambda self: 4))
    params = {"ebnf": CHAIN, "temperature": 0, "max_new_tokens": 60}
    seen = _jumps(engine, monkeypatch)
    out = _generate(engine, monkeypatch, params, jump=True)
    assert seen and all(len(j) - outside <= 4 for j, outside in seen)
    output = out["output_ids"]
    close = ids["</tool_call>"]
    assert output[11:12] + _spell(engine, "}") + [close] + _spell(engine, "\n") in [j for j, _ in seen]
    # Jumps of 4, 4, 3, 4, 4 and 2 ids (the 6 sampled tokens start them): 15 saved.
    assert out["meta_info"]["decode_steps_saved"] == 15 == len(output) - len(seen)
    assert _valid_prefix(engine, CHAIN, output).is_terminated()
    monkeypatch.undo()
    assert _generate(engine, monkeypatch, params, jump=False)["output_ids"] == output


def test_text_after_a_marker_waits_where_the_longer_jump_does_not_pay(char_engine, monkeypatch):
    """A step whose row holds more than 3 tokens (2 beyond a decode step's) costs 50 decode steps here: the first
    jump takes "yz" and the marker (a marker is taken once the jump pays) but not the text after it, which the
    grammar's matcher must then still expect (the next sampled token is its first character)."""
    engine, ids = char_engine
    monkeypatch.setattr(type(engine.core.runner), "jump_step_cost",
                        lambda self, bs, extra: 1.0 if extra <= 2 else 50.0)
    params = {"ebnf": CHAIN, "temperature": 0, "max_new_tokens": 60}
    seen = _jumps(engine, monkeypatch)
    out = _generate(engine, monkeypatch, params, jump=True)
    output = out["output_ids"]
    assert seen[0][0] == output[:1] + _spell(engine, "yz") + [ids["<tool_call>"]]
    assert all(len(j) - outside <= 4 for j, outside in seen)
    assert _valid_prefix(engine, CHAIN, output).is_terminated()
    monkeypatch.undo()
    assert _generate(engine, monkeypatch, params, jump=False)["output_ids"] == output


@pytest.mark.parametrize("fmt, budget", [
    ("chain", 8),  # the budget ends inside the text after the first marker
    ("chain", 4),  # ... right at the marker
    ("hermes", 200),
    ("mistral", 200),
    ("back to back", 20),
])
def test_greedy_outputs_equal_with_and_without_jump_forward(char_engine, monkeypatch, fmt, budget):
    engine, _ = char_engine
    grammar = {"chain": CHAIN, "back to back": 'root ::= <tool_call> "a" <tool_call> <tool_call> "bc" [xy] <tool_call>'
               ' "\\n"'}.get(fmt) or tool_call_ebnf([WEATHER, TIME], fmt, ToolChoice("required"), parallel=True)
    params = {"ebnf": grammar, "temperature": 0, "max_new_tokens": budget}
    jumped = _generate(engine, monkeypatch, params, jump=True)
    stepped = _generate(engine, monkeypatch, params, jump=False)
    assert jumped["output_ids"] == stepped["output_ids"] and jumped["text"] == stepped["text"]
    assert jumped["meta_info"]["finish_reason"] == stepped["meta_info"]["finish_reason"]
    assert len(jumped["output_ids"]) <= budget and jumped["meta_info"]["decode_steps_saved"] > 0
    matcher = _valid_prefix(engine, grammar, jumped["output_ids"])
    if jumped["meta_info"]["finish_reason"]["type"] == "stop":
        assert matcher.is_accepting()
        if fmt in ("hermes", "mistral"):
            assert parse_tool_output(jumped["text"], fmt).complete_calls


@pytest.fixture(scope="module")
def mistral_engine(tmp_path_factory):
    pytest.importorskip("transformers")
    from grammar_vocabs import TOKENIZERS
    from model_fixtures import write_tiny_checkpoint

    from radixgen.runtime.engine import Engine

    spec = json.loads((TOKENIZERS / "mistral-7b-v0.1.tokenizer.json").read_text())
    spec["added_tokens"].append({"id": 32000, "content": "[TOOL_CALLS]", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True})
    folder = _written(spec, "mistral-jump")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    root = tmp_path_factory.mktemp("jump-mistral")
    checkpoint = write_tiny_checkpoint(root / "llama", "llama", seed=3,
                                       overrides={"max_position_embeddings": 512, "vocab_size": 32001})
    with Engine(str(checkpoint), tokenizer_path=str(folder), device="cpu", max_total_tokens=512) as engine:
        yield engine


def test_text_after_a_special_marker_is_tokenized_as_the_tokenizer_does(mistral_engine, monkeypatch):
    """Mistral's tokenizer prefixes a text with a space (Metaspace, `first`), but not the text right after a
    special token: encoded alone, `[{"a": ` would start with ` [`, a token the grammar refuses."""
    engine = mistral_engine
    grammar = r'root ::= "x" <[TOOL_CALLS]> "[{\"a\": " [0-9] "}]"'
    assert _spell(engine, '[{"a": ')[0] != _spell(engine, '[TOOL_CALLS][{"a": ')[1]
    seen = _jumps(engine, monkeypatch)
    out = _generate(engine, monkeypatch, {"ebnf": grammar, "temperature": 0, "max_new_tokens": 30}, jump=True)
    output = out["output_ids"]
    spelled = engine.tokenizer.decode(output, skip_special_tokens=False)
    assert spelled.startswith('x[TOOL_CALLS][{"a": ') and spelled.endswith("}]")
    # One jump through the marker and the text after it, in the tokenizer's own tokens for that text there.
    assert seen[0][0] == output[:7] == output[:1] + _spell(engine, '[TOOL_CALLS][{"a": ')
    assert out["meta_info"]["decode_steps_saved"] >= 6
    assert _valid_prefix(engine, grammar, output).is_terminated()


def test_the_chain_in_the_overlapped_loop_delivers_what_stepping_does(char_engine, monkeypatch):
    """Overlapped (the CUDA default for constrained requests; forced here on the CPU), a launched step already
    computes the sampled token: it lies outside the jump's row, and the chain after it is taken all the same."""
    engine, _ = char_engine
    params = {"ebnf": CHAIN, "temperature": 0, "max_new_tokens": 60}
    stepped = _generate(engine, monkeypatch, params, jump=False)
    monkeypatch.setattr(engine.core.scheduler.limits, "overlap_constrained", True)
    seen = _jumps(engine, monkeypatch)
    before = engine.get_stats()["overlapped_steps"]
    jumped = _generate(engine, monkeypatch, params, jump=True)
    assert engine.get_stats()["overlapped_steps"] > before
    assert jumped["output_ids"] == stepped["output_ids"]
    assert jumped["meta_info"]["decode_steps_saved"] == 19 and any(outside for _, outside in seen)
    assert engine.flush_cache()
    stats = engine.get_stats()
    assert stats["kv_slots_free"] == stats["kv_slots_total"]


def test_forced_text_after_a_sampled_token_jumps_on_a_sentencepiece_tokenizer(mistral_engine, monkeypatch):
    """The forced `}]` after a sampled digit is tokenized as a continuation (`encode(continued=True)`): encoded
    as a fresh text it would start with Mistral's prefix space, which the grammar refuses, and no jump would be
    taken."""
    engine = mistral_engine
    grammar = r'root ::= "{\"a\": " [0-9] "}]"'
    assert engine.tokenizer.encode("}]", add_special_tokens=False)[0] != \
        engine.tokenizer.encode("}]", add_special_tokens=False, continued=True)[0]
    seen = _jumps(engine, monkeypatch)
    out = _generate(engine, monkeypatch, {"ebnf": grammar, "temperature": 0, "max_new_tokens": 30}, jump=True)
    assert _valid_prefix(engine, grammar, out["output_ids"]).is_terminated()
    tail = engine.tokenizer.encode("}]", add_special_tokens=False, continued=True)
    digit_jumps = [ids for ids, _ in seen if engine.tokenizer.decode(ids[:1]).strip().isdigit()]
    assert digit_jumps == [[out["output_ids"][-1 - len(tail)], *tail]]  # the digit and `}]` in one step
