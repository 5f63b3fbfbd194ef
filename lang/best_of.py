"""`gen(best_of=b, n=k)`: of b answers, the k with the highest cumulative logprob, read from any backend's meta
info (the native `output_token_logprobs`, or an OpenAI completion's `logprobs.token_logprobs`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixgen.lang.backend import GenResult
from radixgen.runtime.best_of import SampleGroup, cumulative_logprob, returned_samples

# The meta info keys that hold logprobs, native then OpenAI's.
LOGPROB_KEYS = ("input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs",
                "logprobs")


def answer_logprob(meta: dict[str, Any]) -> float:
    """The sum of the logprobs of an answer's output tokens (entries `[logprob, id]` or `[logprob, id, text]`)."""
    entries = meta.get("output_token_logprobs")
    if entries is not None:
        return cumulative_logprob([(entry[0], entry[1]) for entry in entries])
    token_logprobs = (meta.get("logprobs") or {}).get("token_logprobs") or []
    return cumulative_logprob([(lp, 0) for lp in token_logprobs])


def best_answers(answers: Sequence[GenResult], n: int, keep_logprobs: bool) -> list[GenResult]:
    """The n answers of highest cumulative logprob, best first, each meta info with its `cumulative_logprob`
    (and without logprobs unless `keep_logprobs`)."""
    cumulative = [answer_logprob(a.meta_info) for a in answers]
    best = []
    for i, _ in returned_samples([SampleGroup(0, len(answers), n)], cumulative):
        meta = {k: v for k, v in answers[i].meta_info.items() if keep_logprobs or k not in LOGPROB_KEYS}
        best.append(GenResult(answers[i].text, {**meta, "cumulative_logprob": cumulative[i]}))
    return best
