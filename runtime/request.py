"""One generation request as the scheduler sees it: token ids, lengths, and the handles it holds."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class ReqState(enum.Enum):
    PENDING = "pending"  # waiting for its grammar to compile (never blocks the engine loop)
    WAITING = "waiting"  # queued for admission
    RUNNING = "running"  # holds a req_to_token row and KV slots
    FINISHED = "finished"


@dataclass
class Req:
    """Scheduler-side request.

    Lengths (positions index `fill_ids = origin_ids + output_ids`):
        tree_len   leading positions whose KV slots belong to the radix tree (locked through `node`)
        kv_len     positions whose KV is computed and held in the request's req_to_token row
                   (tree_len <= kv_len <= len(fill_ids)); slots in [tree_len, kv_len) are owned by this request
    The next forward computes fill_ids[kv_len : kv_len + extend].
    """

    rid: str
    origin_ids: np.ndarray  # int64 prompt ids
    params: Any  # SamplingParams
    namespace: Any = None
    output_ids: list[int] = field(default_factory=list)
    state: ReqState = ReqState.WAITING
    req_pool_idx: int | None = None
    node: Any = None  # locked radix node covering [0, tree_len)
    tree_len: int = 0
    kv_len: int = 0
    synced_len: int = 0  # positions of the device req_to_token row known to be current
    cached_tokens: int = 0  # prompt tokens served from the cache at first admission
    admitted_once: bool = False
    admit_seq: int = 0  # admission order; preemption picks the largest
    # Prompt logprobs: first prompt position whose logprob is wanted (None = none).
    logprob_start_len: int | None = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    input_token_logprobs: list = field(default_factory=list)
    input_top_logprobs: list = field(default_factory=list)
    output_token_logprobs: list = field(default_factory=list)
    output_top_logprobs: list = field(default_factory=list)
    # Constrained decoding.
    grammar: Any = None
    matcher: Any = None
    decode_steps_saved: int = 0
    # Finish.
    finish_reason: dict | None = None
    abort_requested: bool = False
    # Streaming/output plumbing (set by the engine front).
    sink: Any = None
    detok: Any = None
    stop_checker: Any = None
    emitted_text: str = ""
    stream: bool = False  # a caller reads per-token chunks (else text is produced once, at the finish)
    text_pos: int = 0  # output tokens already turned into text
    text_done: bool = False  # the detokenizer was flushed: the text is final
    created: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None

    @property
    def fill_len(self) -> int:
        return len(self.origin_ids) + len(self.output_ids)

    def fill_ids(self) -> np.ndarray:
        if not self.output_ids:
            return self.origin_ids
        return np.concatenate([self.origin_ids, np.asarray(self.output_ids, dtype=np.int64)])

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the next sample."""
        return self.fill_len - self.kv_len

    @property
    def prompt_len(self) -> int:
        return len(self.origin_ids)

    @property
    def scoring_floor(self) -> int | None:
        """Prompt logprobs from position s need logits at s-1, so the cache may serve at most s-1 tokens."""
        if self.logprob_start_len is None:
            return None
        return max(self.logprob_start_len - 1, 0)
