"""One generation request as the scheduler sees it: token ids, lengths, and the handles it holds."""

from __future__ import annotations

import enum
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from radixgen.grammars.backend import CompiledGrammar, GrammarMatcher
    from radixgen.radix import RadixNode
    from radixgen.runtime.output_sink import OutputSink
    from radixgen.runtime.outputs import BeamResult, FinishReason, TokenLogprob, TopLogprobs
    from radixgen.runtime.sampling_params import SamplingParams
    from radixgen.runtime.stop_checker import Detokenizer, StopChecker


_NO_DRAFTS: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
_NO_DRAFTS.flags.writeable = False


class ReqState(enum.Enum):
    WAITING = "waiting"  # queued for admission
    RUNNING = "running"  # holds a req_to_token row and KV slots
    BEAMS = "beams"  # a beam search's request: its beams (requests of their own) run for it
    FINISHED = "finished"


@dataclass
class Req:
    """Scheduler-side request.

    Lengths (positions index `fill_ids = origin_ids + output_ids`):
        tree_len    leading positions whose KV slots belong to the radix tree (locked through `node`)
        kv_len      positions whose KV is computed and held in the request's req_to_token row
                    (tree_len <= kv_len <= len(fill_ids)); slots in [tree_len, kv_len) are owned by this request
        synced_len  leading positions whose entries in the device req_to_token row are current (kept by the
                    scheduler: a scheduled item rewrites them from min(synced_len, start))
    The next forward computes fill_ids[kv_len : kv_len + extend].
    """

    rid: str
    origin_ids: npt.NDArray[np.int64]  # prompt ids
    params: SamplingParams
    namespace: Hashable = None  # the prefix cache's namespace (radixgen.radix.Namespace)
    output_ids: list[int] = field(default_factory=list)
    state: ReqState = ReqState.WAITING
    req_pool_idx: int | None = None
    node: RadixNode | None = None  # locked radix node covering [0, tree_len)
    tree_len: int = 0
    kv_len: int = 0
    synced_len: int = 0
    cached_tokens: int = 0  # prompt tokens served from the cache at first admission
    admitted_once: bool = False
    admit_seq: int = 0  # admission order; preemption picks the largest
    # Prompt logprobs: first prompt position whose logprob is wanted (None = none).
    logprob_start_len: int | None = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    input_token_logprobs: list[TokenLogprob] = field(default_factory=list)
    input_top_logprobs: list[TopLogprobs] = field(default_factory=list)
    output_token_logprobs: list[TokenLogprob] = field(default_factory=list)
    output_top_logprobs: list[TopLogprobs] = field(default_factory=list)
    # Constrained decoding.
    grammar: CompiledGrammar | None = None
    matcher: GrammarMatcher | None = None
    decode_steps_saved: int = 0
    # A thinking budget (params.thinking_budget): the tokens that close the section, until it is closed.
    thinking_close_ids: list[int] | None = None
    # Speculative decoding: the drafts the next step verifies (set by the engine before scheduling), and totals.
    draft_ids: npt.NDArray[np.int64] = field(default_factory=lambda: _NO_DRAFTS)
    spec_verify_steps: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    # Beam search: the rid of the request whose beam this is (its own rid once its beams run), else None.
    beam_group: str | None = None
    beam_results: tuple[BeamResult, ...] = ()  # a finished beam search's returned sequences, best first
    # Finish.
    finish_reason: FinishReason | None = None
    # Streaming/output plumbing (set by the engine front).
    sink: OutputSink | None = None
    detok: Detokenizer | None = None
    stop_checker: StopChecker | None = None
    emitted_text: str = ""
    stream: bool = False  # a caller reads per-token chunks (else text is produced once, at the finish)
    text_pos: int = 0  # output tokens already turned into text
    text_done: bool = False  # the detokenizer was flushed: the text is final
    created: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None

    @property
    def fill_len(self) -> int:
        return len(self.origin_ids) + len(self.output_ids)

    def fill_ids(self) -> npt.NDArray[np.int64]:
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

    def output_budget(self, max_context: int) -> int:
        """Output tokens this request may still add: up to max_new_tokens and the room left in the context."""
        limit = max_context - self.prompt_len
        if self.params.max_new_tokens is not None:
            limit = min(limit, self.params.max_new_tokens)
        return limit - len(self.output_ids)
