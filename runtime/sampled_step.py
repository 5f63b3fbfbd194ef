"""One engine step's sampled tokens on their way to the host (see `EngineCore._overlapped_step`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radixgen.runtime.request import Req
from radixgen.runtime.sampler import SampleOutput
from radixgen.runtime.sampling_batch import SamplingBatch


@dataclass
class SampledStep:
    """One step's sampled tokens, delivered to their requests at once (synchronous loop) or after the next step
    is launched (overlapped loop). `host` holds host copies of the device outputs, complete once `ready` is."""

    reqs: list[Req]
    rids: tuple[str, ...]
    counted: list[int]  # per row: the output tokens `sb` has counted, this step's sample included
    sb: SamplingBatch
    out: SampleOutput
    host: list[torch.Tensor | None]  # tokens, logprobs, top-logprob values, top-logprob ids
    ready: torch.cuda.Event | None  # None: host copies are complete (CPU device)
    stale: frozenset[str] = frozenset()  # requests whose sample here is dropped (their tokens changed meanwhile)
    counts: np.ndarray | None = None  # a verify step: rows sampled per request (1 + its drafts); None: one each
    # a verify step's greedy constrained requests drawn without masks, with the logits and rows they were drawn
    # from (the engine masks a row only where the grammar refuses its token)
    lazy: tuple[frozenset[str], torch.Tensor, SamplingBatch] | None = None


def copy_to_host(tensors: list[torch.Tensor | None]) -> tuple[list[torch.Tensor | None], torch.cuda.Event | None]:
    """Start copying device tensors into pinned host memory without waiting; an event marks completion. (A
    blocking copy would also wait for any step launched after these tensors were produced.)"""
    if all(t is None or t.device.type == "cpu" for t in tensors):
        return tensors, None
    host = [None if t is None else torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
            for t in tensors]
    ready = torch.cuda.Event()
    ready.record()
    return host, ready
