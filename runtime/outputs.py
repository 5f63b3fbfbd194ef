"""What the engine loop hands back for a request: why it finished, its final report, and its output chunks.

Typed inside the engine; `to_dict` gives the public shape `radixgen.Engine` returns (docs/engine_api.md):
finish reasons `{"type": "stop" | "length", "matched": ...}` or `{"type": "abort", "message": ...}`, chunks
`{"text", "output_ids", "finished", "meta_info"}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

TokenLogprob: TypeAlias = tuple[float | None, int]
"""(logprob, token id); the logprob is None where the token was not sampled (forced, or the first prompt token)."""

TopLogprobs: TypeAlias = list[tuple[float, int]] | None
"""The best (logprob, token id) pairs at one position; None where the token was not sampled."""


@dataclass(frozen=True, slots=True)
class StopFinish:
    """A stop condition matched: the stop token id, the stop string, or None (the grammar ended on another token)."""

    matched: int | str | None

    def to_dict(self) -> dict[str, Any]:
        return {"type": "stop", "matched": self.matched}


@dataclass(frozen=True, slots=True)
class LengthFinish:
    """The output reached max_new_tokens or the end of the context."""

    def to_dict(self) -> dict[str, Any]:
        return {"type": "length", "matched": None}


@dataclass(frozen=True, slots=True)
class AbortFinish:
    """The request was ended before a stop condition: aborted, failed, or the engine shut down."""

    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"type": "abort", "message": self.message}


FinishReason: TypeAlias = StopFinish | LengthFinish | AbortFinish


@dataclass(frozen=True, slots=True)
class BeamResult:
    """One returned sequence of a beam search: its text and tokens, its score (sum logprob / length **
    length_penalty, transformers' `sequences_scores`), its sum of logprobs, and why it ended."""

    text: str
    output_ids: tuple[int, ...]
    score: float
    cumulative_logprob: float
    finish_reason: FinishReason

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "output_ids": list(self.output_ids), "score": self.score,
                "cumulative_logprob": self.cumulative_logprob, "finish_reason": self.finish_reason.to_dict()}


@dataclass(frozen=True, slots=True)
class MetaInfo:
    """A finished request's report (the public `meta_info`). Logprob lists are None unless they were asked for."""

    id: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: FinishReason
    e2e_latency: float
    decode_steps_saved: int
    ttft: float | None = None
    spec_verify_steps: int = 0  # speculative decoding: steps that verified drafts of this request
    spec_draft_tokens: int = 0  # ... the drafts they verified
    spec_accepted_tokens: int = 0  # ... and the drafts kept
    constraint_relaxations: tuple[str, ...] = ()  # what a JSON Schema asked that its grammar could not enforce
    constraint_narrowings: tuple[str, ...] = ()  # what its grammar enforces more strictly (key order, inferred types)
    input_token_logprobs: list[TokenLogprob] | None = None
    output_token_logprobs: list[TokenLogprob] | None = None
    input_top_logprobs: list[TopLogprobs] | None = None
    output_top_logprobs: list[TopLogprobs] | None = None
    cumulative_logprob: float | None = None  # best_of, beam search: the sum of the output's token logprobs
    beam_score: float | None = None  # beam search: this sequence's score
    finished_beams: tuple[BeamResult, ...] = ()  # beam search: every returned sequence, best first

    def to_dict(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "id": self.id,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason.to_dict(),
            "e2e_latency": self.e2e_latency,
            "decode_steps_saved": self.decode_steps_saved,
        }
        if self.ttft is not None:
            info["ttft"] = self.ttft
        if self.spec_verify_steps:
            info["spec_verify_steps"] = self.spec_verify_steps
            info["spec_draft_tokens"] = self.spec_draft_tokens
            info["spec_accepted_tokens"] = self.spec_accepted_tokens
        if self.constraint_relaxations:
            info["constraint_relaxations"] = list(self.constraint_relaxations)
        if self.constraint_narrowings:
            info["constraint_narrowings"] = list(self.constraint_narrowings)
        if self.cumulative_logprob is not None:
            info["cumulative_logprob"] = self.cumulative_logprob
        if self.beam_score is not None:
            info["beam_score"] = self.beam_score
        if self.finished_beams:
            info["finished_beams"] = [b.to_dict() for b in self.finished_beams]
        for key in ("input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs"):
            value = getattr(self, key)
            if value is not None:
                info[key] = value
        return info


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One request's output since its previous chunk; the last chunk carries the request's `meta`."""

    text: str
    output_ids: list[int]
    meta: MetaInfo | None = None

    @property
    def finished(self) -> bool:
        return self.meta is not None

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "output_ids": self.output_ids, "finished": self.finished,
                "meta_info": None if self.meta is None else self.meta.to_dict()}
