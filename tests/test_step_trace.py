"""The engine's step trace (`EngineConfig.step_trace`): one record per step the loop ran, what the runner did
with it and the loop's seconds, taken (and forgotten) through `Engine.take_step_records`."""

from __future__ import annotations

import pytest
from test_jump_forward_markers import CHAIN, char_engine  # noqa: F401  (the fixture)

from radixgen.runtime.engine_config import EngineConfig
from radixgen.runtime.step_trace import StepRecord, StepTrace


def test_every_step_is_recorded_with_its_batch_and_the_loop_s_time(char_engine, monkeypatch):  # noqa: F811
    engine, _ = char_engine
    assert engine.core.step_trace is None and engine.take_step_records() == []  # off unless asked for
    monkeypatch.setattr(engine.core, "step_trace", StepTrace(512))
    before = engine.get_stats()
    out = engine.generate(["go 1: ", "go 2: "], {"ebnf": CHAIN, "temperature": 0, "max_new_tokens": 40})
    after = engine.get_stats()
    records = engine.take_step_records()
    assert all(isinstance(r, StepRecord) for r in records)
    assert len(records) == after["steps"] - before["steps"]
    assert [r.index for r in records] == list(range(before["steps"], after["steps"]))
    assert sum(r.tokens for r in records) == after["forward_tokens"] - before["forward_tokens"]
    assert records[0].mode == "extend" and records[0].batch_size == 2  # both prompts in one prefill
    assert {r.path for r in records} == {"eager"}  # the CPU: no graphs
    assert sum(r.mode == "decode" for r in records) == after["decode_steps"] - before["decode_steps"]
    assert all(r.wall_s >= r.forward_s >= 0 and r.grammar_s >= 0 and r.sample_s >= 0 for r in records)
    assert sum(r.grammar_s for r in records) > 0  # constrained requests: mask fills and matcher advances
    assert all(o["meta_info"]["finish_reason"]["type"] != "abort" for o in out)
    assert engine.take_step_records() == []  # taken once


def test_the_option_is_checked():
    with pytest.raises(ValueError, match="step_trace"):
        EngineConfig.from_options(None, step_trace=-1)
    with pytest.raises(ValueError, match="at least one"):
        StepTrace(0)
    trace = StepTrace(2)
    for i in range(3):
        trace.add(StepRecord(i, "decode", 1, 1, "graph", True, 0.01, 0.001, 0.0, 0.002))
    assert [r.index for r in trace.records()] == [1, 2]  # a ring of the last steps
