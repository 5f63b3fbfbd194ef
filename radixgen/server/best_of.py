"""Which outputs of a prompt's sub-requests are returned: `best_of`'s n best (runtime/best_of.py picks them), and a
beam search's beams, each its own output, best first (the engine's one request holds them all).

A beam search is one engine request, so one sub-request, whose beams are known only when it ends: its stream
(`Engine.stream_request`) is one chunk, its end, whose meta_info's `finished_beams` carry the beams.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixgen.runtime.best_of import SampleGroup, beam_results, cumulative_logprob, returned_samples
from radixgen.server.generation import Output
from radixgen.server.native_protocol import LOGPROB_KEYS, TOP_LOGPROB_KEYS


def returned_outputs(outputs: Sequence[Output], groups: Sequence[SampleGroup], keep_logprobs: bool,
                     ) -> list[tuple[int, Output]]:
    """(sub-request index, output) of each output returned, in order: a best_of prompt's n best, their
    meta_info with `cumulative_logprob` (and without logprobs unless `keep_logprobs`); a beam search's beams,
    best first (`beam_outputs`); any other prompt's all."""
    cumulative = [cumulative_logprob(o.meta_info.get("output_token_logprobs")) for o in outputs]
    returned: list[tuple[int, Output]] = []
    for i, ranked in returned_samples(groups, cumulative):
        out = outputs[i]
        if out.meta_info.get("finished_beams"):
            returned.extend((i, beam) for beam in beam_outputs(out.meta_info))
            continue
        if ranked:
            dropped = () if keep_logprobs else (*LOGPROB_KEYS, *TOP_LOGPROB_KEYS)
            meta = {k: v for k, v in out.meta_info.items() if k not in dropped}
            out = Output(out.text, out.output_ids, {**meta, "cumulative_logprob": cumulative[i]})
        returned.append((i, out))
    return returned


def beam_outputs(meta: dict[str, Any]) -> list[Output]:
    """A finished beam search's returned beams as outputs, best first, as `Engine.generate` gives them
    (`runtime.best_of.beam_results`)."""
    return [Output(text, ids, info) for text, ids, info in beam_results(meta)]
