"""The jump-forward policy weighs a jump against the whole batch (runtime/engine_core.py `_jump_pays`): the step
that appends forced tokens costs every running request, so with B running and a step of c decode steps' time a
jump pays when it saves at least B * (c - 1) tokens, c the cost of the graph that holds the step's extra tokens;
tokens that fit the graph the jumps already taken for that step need are free. Outputs stay those of decoding
without jump-forward either way (a character-level vocabulary)."""

from __future__ import annotations

import pytest
from test_jump_forward_markers import CHAIN, _generate, char_engine  # noqa: F401  (the fixture)


def _cost(self, bs: int, extra: int) -> float:
    """Graphs holding up to 3 and 7 tokens beyond a decode step's: 2 and 3 decode steps' time."""
    if extra <= 0:
        return 1.0
    return 2.0 if extra <= 3 else 3.0 if extra <= 7 else 1.0 + 0.25 * (extra + 1)


@pytest.fixture
def core(char_engine, monkeypatch):  # noqa: F811
    engine, _ = char_engine
    core = engine.core
    monkeypatch.setattr(type(core.runner), "jump_step_cost", _cost)
    monkeypatch.setattr(core.scheduler, "waiting", type(core.scheduler.waiting)())
    monkeypatch.setattr(core, "_jump_extra_tokens", 0)
    return core


def test_a_jump_pays_for_the_whole_batch(core, monkeypatch):
    monkeypatch.setattr(core.scheduler, "running", [object()] * 8)
    assert not core._jump_pays(7, 3) and core._jump_pays(8, 3)  # 8 requests x (2 - 1) steps
    assert not core._jump_pays(0, 1)


def test_tokens_within_the_graph_the_jumps_taken_need_are_free(core, monkeypatch):
    monkeypatch.setattr(core.scheduler, "running", [object()] * 8)
    monkeypatch.setattr(core, "_jump_extra_tokens", 2)
    assert core._jump_pays(1, 1)  # 3 extra tokens: the graph the step already needs
    assert not core._jump_pays(7, 5) and core._jump_pays(8, 5)  # 7 extra: 3 steps' time, 1 more


def test_one_request_pays_for_itself(core, monkeypatch):
    monkeypatch.setattr(core.scheduler, "running", [object()])
    assert core._jump_pays(1, 3) and not core._jump_pays(1, 7) and core._jump_pays(2, 7)


def _eight_with_and_without_jumps(engine, monkeypatch) -> list[dict]:
    """Eight requests through CHAIN with jump-forward, asserting their outputs equal those without it."""
    params = {"ebnf": CHAIN, "temperature": 0, "max_new_tokens": 60}
    prompts = [f"go {i}: " for i in range(8)]
    monkeypatch.setattr(engine.core.config, "enable_jump_forward", True)
    jumped = engine.generate(prompts, params)
    monkeypatch.setattr(engine.core.config, "enable_jump_forward", False)
    stepped = engine.generate(prompts, params)
    assert [o["output_ids"] for o in jumped] == [o["output_ids"] for o in stepped]
    return jumped


def test_a_batch_too_dear_to_jump_decodes_the_same_tokens(char_engine, monkeypatch):  # noqa: F811
    """Eight requests and multi-token steps of 100 decode steps' time: no jump is taken, and the outputs equal
    those without jump-forward; with one request at that price the long forced runs still are not taken either."""
    engine, _ = char_engine
    monkeypatch.setattr(type(engine.core.runner), "jump_step_cost",
                        lambda self, bs, extra: 1.0 if extra <= 0 else 100.0)
    jumped = _eight_with_and_without_jumps(engine, monkeypatch)
    assert all(o["meta_info"]["decode_steps_saved"] == 0 for o in jumped)
    params = {"ebnf": CHAIN, "temperature": 0, "max_new_tokens": 60}
    assert _generate(engine, monkeypatch, params, jump=True)["meta_info"]["decode_steps_saved"] == 0


def test_jumps_that_pay_only_together_are_taken_together(char_engine, monkeypatch):  # noqa: F811
    """Eight requests in step through the same grammar: one jump alone saves fewer tokens than the step costs the
    batch (8 x (c - 1)), so each is declined while the step is delivered; their sum pays, so all are taken at the
    end of the delivery. Outputs equal decoding without jump-forward."""
    engine, _ = char_engine
    monkeypatch.setattr(type(engine.core.runner), "jump_step_cost",  # one graph up to 8 extra tokens, then eager
                        lambda self, bs, extra: 1.0 + 0.25 * min(max(extra, 0), 8))
    declined: list[int] = []
    take = engine.core._take_deferred_jumps

    def spy():
        declined.append(len(engine.core._deferred_jumps))
        return take()

    monkeypatch.setattr(engine.core, "_take_deferred_jumps", spy)
    jumped = _eight_with_and_without_jumps(engine, monkeypatch)
    assert declined and max(declined) > 1
    assert all(o["meta_info"]["decode_steps_saved"] > 0 for o in jumped)


def test_a_request_asking_for_logprobs_samples_every_token(char_engine, monkeypatch):  # noqa: F811
    """Jumped tokens were never sampled, so they would have no logprob: such a request does not jump, and each
    of its tokens carries the model's logprob; its output is the one without jump-forward."""
    engine, _ = char_engine
    params = {"ebnf": CHAIN, "temperature": 0, "max_new_tokens": 60}
    monkeypatch.setattr(engine.core.config, "enable_jump_forward", True)
    with_logprobs = engine.generate("go: ", params, return_logprob=True)
    plain = engine.generate("go: ", params)
    logprobs = with_logprobs["meta_info"]["output_token_logprobs"]
    assert len(logprobs) == len(with_logprobs["output_ids"])
    assert all(lp is not None and lp <= 0.0 for lp, *_ in logprobs)
    assert with_logprobs["meta_info"]["decode_steps_saved"] == 0 < plain["meta_info"]["decode_steps_saved"]
    assert with_logprobs["output_ids"] == plain["output_ids"]


def test_the_first_jump_of_an_overlapped_delivery_pays_for_the_wait_it_causes(core, monkeypatch):
    """Delivering while a launched step runs, a jump makes the next step wait for the host: a delivery of half
    a decode step's time adds 0.5 to the first jump's cost, not to a later one's within its graph."""
    monkeypatch.setattr(core.scheduler, "running", [object()] * 8)
    monkeypatch.setattr(type(core.runner), "decode_seconds", lambda self, bs: 0.010)
    monkeypatch.setattr(core, "_deliver_seconds", 0.005)
    monkeypatch.setattr(core, "_delivering_overlapped", True)
    assert not core._jump_pays(11, 3) and core._jump_pays(12, 3)  # 8 x (2 + 0.5 - 1)
    monkeypatch.setattr(core, "_jump_extra_tokens", 2)
    assert core._jump_pays(1, 1) and not core._jump_pays(7, 5) and core._jump_pays(8, 5)
    monkeypatch.setattr(core, "_delivering_overlapped", False)
    monkeypatch.setattr(core, "_jump_extra_tokens", 0)
    assert core._jump_pays(8, 3)
