"""Picking one choice from per-token logprobs: the three `choices_method`s of SGLang's `select`.

Every backend scores all choices in one batched prefill and hands the per-choice token logprobs here, so the
decision rule is the same whichever backend produced the numbers.
- `token_length_normalized` (default): highest mean logprob per token.
- `greedy_token_selection`: walk the tokens left to right keeping the choices whose logprob at that position is
  the highest; a choice that has run out of tokens continues with its own mean logprob.
- `unconditional_likelihood_normalized`: highest mean of (conditional - unconditional) logprob, the
  unconditional logprobs coming from scoring each choice without the prompt; it discounts choices that are
  likely whatever was asked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

METHODS = ("token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized")


@dataclass(frozen=True)
class ChoiceScores:
    """Decision and its evidence; the dict form is what `s.get_meta_info(name)` shows for a select."""

    index: int
    normalized_logprobs: list[float]
    token_logprobs: list[list[float]]
    unconditional_token_logprobs: list[list[float]] | None = None

    def meta_info(self) -> dict:
        meta = {
            "normalized_prompt_logprobs": self.normalized_logprobs,
            "input_token_logprobs": self.token_logprobs,
        }
        if self.unconditional_token_logprobs is not None:
            meta["unconditional_token_logprobs"] = self.unconditional_token_logprobs
        return meta


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"choices_method must be one of {METHODS}, got {method!r}")
    return method


def needs_unconditional(method: str) -> bool:
    return method == "unconditional_likelihood_normalized"


def _mean(values: Sequence[float] | np.ndarray) -> float:
    return float(np.mean(values)) if len(values) else -math.inf


def decide(
    method: str,
    token_logprobs: list[list[float]],
    unconditional: list[list[float]] | None = None,
    temperature: float = 0.0,
    rng: np.random.Generator | None = None,
) -> ChoiceScores:
    """Pick a choice index from each choice's token logprobs (and unconditional ones where the method needs them).

    With `temperature > 0` the normalised scores are sampled from as a softmax instead of taking the argmax.
    """
    check_method(method)
    normalized = [_mean(lp) for lp in token_logprobs]
    if method == "token_length_normalized":
        scores = np.array(normalized)
    elif method == "unconditional_likelihood_normalized":
        if unconditional is None:
            raise ValueError("unconditional_likelihood_normalized needs the unconditional logprobs")
        scores = np.array([_mean(np.subtract(c, u)) for c, u in zip(token_logprobs, unconditional)])
        normalized = scores.tolist()
    else:
        return ChoiceScores(_greedy(token_logprobs), normalized, token_logprobs, unconditional)
    if temperature > 0:
        rng = rng or np.random.default_rng()
        z = scores / temperature
        p = np.exp(z - np.max(z))
        index = int(rng.choice(len(scores), p=p / p.sum()))
    else:
        index = int(np.argmax(scores))
    return ChoiceScores(index, normalized, token_logprobs, unconditional)


def _greedy(token_logprobs: list[list[float]]) -> int:
    width = max(len(lp) for lp in token_logprobs)
    table = np.full((len(token_logprobs), width), -math.inf)
    for i, lp in enumerate(token_logprobs):
        table[i, : len(lp)] = lp
        table[i, len(lp):] = _mean(lp)  # a shorter choice competes on with its own average
    alive = np.arange(len(token_logprobs))
    for col in range(width):
        column = table[alive, col]
        alive = alive[column == column.max()]
        if len(alive) == 1:
            break
    return int(alive[0])


def shared_prefix_len(id_lists: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix common to all lists (where scoring of the choices starts)."""
    n = min(len(ids) for ids in id_lists)
    first = id_lists[0]
    for i in range(n):
        if any(ids[i] != first[i] for ids in id_lists[1:]):
            return i
    return n
