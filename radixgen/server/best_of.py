"""`best_of` over HTTP: of each prompt's sub-requests, the outputs returned (runtime/best_of.py picks them)."""

from __future__ import annotations

from collections.abc import Sequence

from radixgen.runtime.best_of import SampleGroup, cumulative_logprob, returned_samples
from radixgen.server.generation import Output
from radixgen.server.native_protocol import LOGPROB_KEYS, TOP_LOGPROB_KEYS


def returned_outputs(outputs: Sequence[Output], groups: Sequence[SampleGroup], keep_logprobs: bool,
                     ) -> list[tuple[int, Output]]:
    """(sub-request index, output) of each output returned, in order: a best_of prompt's n best, their
    meta_info with `cumulative_logprob` (and without logprobs unless `keep_logprobs`), any other prompt's all."""
    cumulative = [cumulative_logprob(o.meta_info.get("output_token_logprobs")) for o in outputs]
    returned = []
    for i, ranked in returned_samples(groups, cumulative):
        out = outputs[i]
        if ranked:
            dropped = () if keep_logprobs else (*LOGPROB_KEYS, *TOP_LOGPROB_KEYS)
            meta = {k: v for k, v in out.meta_info.items() if k not in dropped}
            out = Output(out.text, out.output_ids, {**meta, "cumulative_logprob": cumulative[i]})
        returned.append((i, out))
    return returned
