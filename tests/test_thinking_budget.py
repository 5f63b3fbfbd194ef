"""A thinking budget (`thinking_budget`): after that many output tokens of an open thinking section the engine
appends `</think>` itself, exactly at the budget, with speculation too (kept drafts past it are dropped)."""

from __future__ import annotations

import pytest

from radixgen.grammars.reasoning import THINK_CLOSE
from radixgen.runtime.engine import Engine
from radixgen.runtime.sampling_params import SamplingParams, SamplingParamsError

PROMPTS = ["Copy this list exactly: apple, banana, cherry, date, elderberry, fig, grape. Copy: apple, banana,",
           "Once upon a time, in a small village by the sea, there lived an old fisherman who"]
GREEDY = {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}


@pytest.fixture(scope="module")
def engines(default_model_path):
    plain = Engine(str(default_model_path))
    spec = Engine(str(default_model_path), speculative_algorithm="ngram")
    yield plain, spec
    plain.shutdown()
    spec.shutdown()


def test_the_budget_closes_the_section_at_its_token(engines):
    plain, spec = engines
    close = plain.tokenizer.encode(THINK_CLOSE, add_special_tokens=False)
    free = plain.generate(PROMPTS, GREEDY)
    for budget in (1, 6):
        outs = plain.generate(PROMPTS, {**GREEDY, "thinking_budget": budget}, return_logprob=True)
        for out, ref in zip(outs, free):
            ids = out["output_ids"]
            assert ids[:budget] == ref["output_ids"][:budget]
            assert ids[budget : budget + len(close)] == close
            assert THINK_CLOSE in out["text"] and len(ids) == GREEDY["max_new_tokens"]
            logprobs = out["meta_info"]["output_token_logprobs"]
            assert len(logprobs) == len(ids) and all(lp is None for lp, _ in logprobs[budget : budget + len(close)])
        # verify steps keep drafts past the budget only up to it: the same tokens as decoding one at a time
        assert [o["output_ids"] for o in spec.generate(PROMPTS, {**GREEDY, "thinking_budget": budget})] == [
            o["output_ids"] for o in outs]
    assert spec.get_stats()["spec_verify_steps"] > 0
    for eng in engines:
        assert eng.flush_cache()
        stats = eng.get_stats()
        assert stats["kv_slots_free"] == stats["kv_slots_total"]


def test_a_closed_section_is_left_alone_and_bad_budgets_are_refused(engines):
    """A section the output closes itself (here a grammar makes it start with the close) ends the watch: the
    budget appends no second close, though the grammar would take one."""
    plain, _ = engines
    params = {"temperature": 0, "max_new_tokens": 24, "regex": r"</think> [a-z ,]{3,60}(</think>)?[a-z ,]{0,60}"}
    out = plain.generate(PROMPTS[1], {**params, "thinking_budget": 6})
    assert out["text"].count(THINK_CLOSE) == 1 and out["text"].startswith(THINK_CLOSE)
    assert out["output_ids"] == plain.generate(PROMPTS[1], params)["output_ids"]  # the budget changed nothing
    with pytest.raises(SamplingParamsError, match="thinking_budget"):
        SamplingParams(thinking_budget=-1)
