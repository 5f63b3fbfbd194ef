"""Which outputs of a prompt's sub-requests are returned: `best_of`'s n best (runtime/best_of.py picks them), and a
beam search's beams, each its own output, best first (the engine's one request holds them all).

A beam search is one engine request, so one sub-request, whose beams are known only when it ends. The server
runs every sub-request as a stream (generation.py), which the engine refuses for a beam search to its own
callers (they would wait for nothing); `SubRequestEngine` runs it as a stream of one chunk, its end, whose
meta_info's `finished_beams` carry the beams.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from radixgen.runtime.best_of import SampleGroup, cumulative_logprob, returned_samples
from radixgen.runtime.sampling_params import SamplingParams
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
    """A finished beam search's returned beams as outputs, best first, as `Engine.generate` gives them: each
    meta_info is the search's with the beam's `completion_tokens`, `finish_reason`, `beam_score` and
    `cumulative_logprob`."""
    outputs = []
    for beam in meta["finished_beams"]:
        info = {**meta, "completion_tokens": len(beam["output_ids"]), "finish_reason": beam["finish_reason"],
                "beam_score": beam["score"], "cumulative_logprob": beam["cumulative_logprob"]}
        outputs.append(Output(beam["text"], list(beam["output_ids"]), info))
    return outputs


@dataclass(frozen=True)
class SubRequestEngine:
    """The engine as a `Generation` calls it: every sub-request a stream, a beam search's a stream of one
    chunk (its end: no text, the beams in meta_info's `finished_beams`). Validation errors still raise before
    anything is queued, as for any sub-request.

    Engine.async_generate refuses stream=True for a beam search, so this builds the request and reads its
    sink through the engine's own steps of async_generate (`_prepare`, `_stream_async`), without the refusal;
    aborting on close and the abort-by-rid path are the stream's as for any other sub-request."""

    engine: Any

    async def async_generate(self, input_ids: list[int], sampling_params: SamplingParams, stream: bool,
                             return_logprob: bool = False, top_logprobs_num: int = 0,
                             logprob_start_len: int | None = None) -> Any:
        if not (stream and sampling_params.is_beam_search):
            return await self.engine.async_generate(
                input_ids=input_ids, sampling_params=sampling_params, stream=stream, return_logprob=return_logprob,
                top_logprobs_num=top_logprobs_num, logprob_start_len=logprob_start_len)
        return await self._beam_stream(input_ids, sampling_params, return_logprob, top_logprobs_num,
                                       logprob_start_len)

    async def _beam_stream(self, input_ids: list[int], params: SamplingParams, return_logprob: bool,
                           top_logprobs_num: int, logprob_start_len: int | None) -> AsyncIterator[dict[str, Any]]:
        engine = self.engine
        engine._check_open()
        loop = asyncio.get_running_loop()
        reqs, _, _ = await loop.run_in_executor(engine._compile_pool, engine._prepare, None, input_ids, params,
                                                return_logprob, top_logprobs_num, logprob_start_len, None)
        return engine._stream_async(reqs[0], loop)
