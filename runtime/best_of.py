"""`best_of`: of a prompt's `best_of` samples, the `n` with the highest cumulative logprob are returned (vLLM's
semantics), highest first, each reporting its `cumulative_logprob`.

A sample's cumulative logprob is the sum of its output tokens' logprobs as the engine reports them (the sampled
tokens' logprobs); tokens the engine did not sample (forced by a grammar) have none and add nothing. The
samples are ordinary single-sample requests (`SamplingParams.expand_n`), so they share the prompt's KV through
the radix cache; they run with logprobs on, which the caller gets only if it asked for them. A beam search's
returned beams are unfolded here too (`beam_results`), for the engine and the server alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixgen.runtime.outputs import MetaInfo, TokenLogprob
from radixgen.runtime.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class SampleGroup:
    """One prompt's samples among a call's requests: `count` of them from `start`, of which `n` are returned."""

    start: int
    count: int
    n: int

    @property
    def picks_best(self) -> bool:
        return self.count > self.n


def sample_groups(params_per_prompt: Sequence[SamplingParams]) -> list[SampleGroup]:
    """The groups of requests that `expand_n` makes of each prompt's params, laid out prompt after prompt."""
    groups, start = [], 0
    for params in params_per_prompt:
        groups.append(SampleGroup(start, params.num_samples, params.n))
        start += params.num_samples
    return groups


def cumulative_logprob(token_logprobs: Sequence[TokenLogprob] | None) -> float:
    """The sum of the logprobs of a sample's output tokens (tokens without one add nothing)."""
    return float(sum(lp for lp, _ in token_logprobs or () if lp is not None))


def returned_samples(groups: Sequence[SampleGroup], cumulative: Sequence[float]) -> list[tuple[int, bool]]:
    """(request index, ranked) of the samples returned, in order: a group that picks gives its n of highest
    `cumulative` (highest first, ties in sample order; ranked), any other all of its samples as they are."""
    out: list[tuple[int, bool]] = []
    for g in groups:
        indices = range(g.start, g.start + g.count)
        if g.picks_best:
            out.extend((i, True) for i in sorted(indices, key=lambda i: -cumulative[i])[: g.n])
        else:
            out.extend((i, False) for i in indices)
    return out


def ranked_meta(meta: MetaInfo, keep_logprobs: bool) -> MetaInfo:
    """A picked sample's report: with its cumulative logprob, and without logprobs the caller did not ask for."""
    ranked = dataclasses.replace(meta, cumulative_logprob=cumulative_logprob(meta.output_token_logprobs))
    if keep_logprobs:
        return ranked
    return dataclasses.replace(ranked, input_token_logprobs=None, output_token_logprobs=None,
                               input_top_logprobs=None, output_top_logprobs=None)


def beam_results(meta_info: dict[str, Any]) -> list[tuple[str, list[int], dict[str, Any]]]:
    """A finished beam search's returned beams, best first, as (text, output_ids, meta_info): each meta_info is
    the search's (its public dict) with the beam's completion_tokens, finish_reason, beam_score and
    cumulative_logprob. Empty for any other request."""
    out = []
    for beam in meta_info.get("finished_beams", ()):
        info = {**meta_info, "completion_tokens": len(beam["output_ids"]), "finish_reason": beam["finish_reason"],
                "beam_score": beam["score"], "cumulative_logprob": beam["cumulative_logprob"]}
        out.append((beam["text"], list(beam["output_ids"]), info))
    return out
