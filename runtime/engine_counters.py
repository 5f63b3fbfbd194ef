"""What the engine loop counts: monotonic counters of steps, tokens and phase times, and rings of per-step
values for medians and tails (`EngineCore.stats()` reports both)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class EngineCounters:
    """Monotonic counts since start (or the last flush for the cache ones)."""

    steps: int = 0
    decode_steps: int = 0
    overlapped_steps: int = 0  # steps launched before the previous step's tokens were delivered
    forward_tokens: int = 0  # tokens that went through the model
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    jump_forward_tokens: int = 0
    spec_verify_steps: int = 0  # steps that verified drafts
    spec_draft_tokens: int = 0  # drafted tokens verified
    spec_accepted_tokens: int = 0  # ... and kept
    finished: int = 0
    aborted: int = 0
    preemptions: int = 0
    # Wall time of the loop's phases (seconds), to attribute cost (e.g. of constrained decoding).
    forward_seconds: float = 0.0
    decode_forward_seconds: float = 0.0  # the part of forward_seconds in decode steps (every request adds one token)
    grammar_seconds: float = 0.0  # mask filling + matcher advances + jump-forward
    grammar_request_steps: int = 0  # constrained requests summed over steps (grammar_seconds' denominator)
    sample_seconds: float = 0.0
    draft_seconds: float = 0.0  # proposing drafts (n-gram lookup, the draft model), grammar work excluded


class StepTimes:
    """The last `capacity` per-step values of one measure (a ring), for medians and tails that counters lack."""

    def __init__(self, capacity: int = 4096) -> None:
        self._values = np.zeros(capacity, dtype=np.float64)
        self._count = 0

    def add(self, value: float) -> None:
        self._values[self._count % len(self._values)] = value
        self._count += 1

    def quantile(self, q: float) -> float | None:
        n = min(self._count, len(self._values))
        return float(np.quantile(self._values[:n], q)) if n else None

    def clear(self) -> None:
        self._count = 0
