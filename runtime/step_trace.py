"""A ring of the engine loop's last steps, kept when asked for (`EngineConfig.step_trace`): what each step ran
and where the loop's time went. Profiling a run on a lent GPU reads it instead of patching the loop."""

from __future__ import annotations

import collections
from dataclasses import dataclass


@dataclass(frozen=True)
class StepRecord:
    """One engine step: its batch, how the runner ran the forward, and the loop's seconds in it.

    `wall_s` runs from the step's start (a delivery of the step before, when this one could not overlap it, is
    part of it) to its samples being launched; `forward_s` is the forward's launch (a graph replay call, or the
    whole eager forward on the CPU); `grammar_s` and `sample_s` are the loop counters' parts of the step."""

    index: int
    mode: str  # "decode" (one new token per request) | "extend"
    batch_size: int
    tokens: int
    path: str  # "graph", "multi-token <tokens>", "verify <k>", "eager" (`ModelRunner.last_forward_path`)
    overlapped: bool  # launched before the previous step's tokens were delivered
    wall_s: float
    forward_s: float
    grammar_s: float
    sample_s: float


class StepTrace:
    """The last `capacity` steps' records, oldest first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a step trace keeps at least one step, got {capacity}")
        self._records: collections.deque[StepRecord] = collections.deque(maxlen=capacity)

    def add(self, record: StepRecord) -> None:
        self._records.append(record)

    def records(self) -> list[StepRecord]:
        return list(self._records)

    def clear(self) -> None:
        self._records.clear()
