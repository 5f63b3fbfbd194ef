"""Beam search's bookkeeping, with transformers' semantics (`generate(num_beams=..., do_sample=False)`).

A request's running beams are engine requests decoded in lockstep; each step the engine scores their next
tokens together (`beam_candidates`: log_softmax, the bans, plus each beam's running score, the top
`max(2, 1 + #eos) * num_beams` over all its beams' tokens, in one device pass for every group of the step),
and `BeamGroup.advance` then does on the host what transformers' `_beam_search` does with those candidates:
the best `num_beams` that do not stop continue, those among the first `num_beams` that stop (EOS, or the length
limit) enter the finished hypotheses, scored sum logprob / length ** length_penalty, and the early-stopping
rule (True / False / "never") decides when the search ends. Numbers are float32 as there, so scores match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from radixgen.runtime.sampling_params import SamplingParams

_PENALTY = np.float32(-1.0e9)  # transformers' "never this one" offset


@dataclass(frozen=True)
class BeamHypothesis:
    """A finished beam: its output tokens (the stopping token included), its score and its sum of logprobs."""

    output_ids: tuple[int, ...]
    score: float
    cumulative_logprob: float


@dataclass(frozen=True)
class BeamChoice:
    """A step's outcome for one group: new beam j continues running beam `parents[j]` with `tokens[j]` at
    running score `scores[j]`; `done`: the search has ended (the finished hypotheses are final)."""

    parents: npt.NDArray[np.int64]
    tokens: npt.NDArray[np.int64]
    scores: npt.NDArray[np.float32]
    done: bool


@dataclass
class BeamGroup:
    """One request's beam search: its running beams' scores (best first) and its finished hypotheses."""

    params: SamplingParams
    max_new_tokens: int  # the length limit: max_new_tokens, or the room left in the context
    eos_ids: frozenset[int]
    running_scores: npt.NDArray[np.float32] = field(default_factory=lambda: np.zeros(1, dtype=np.float32))
    generated: int = 0  # tokens every running beam holds
    finished_scores: npt.NDArray[np.float32] = field(init=False)
    finished_flags: npt.NDArray[np.bool_] = field(init=False)
    finished: list[BeamHypothesis | None] = field(init=False)
    improvable: bool = True  # transformers' is_early_stop_heuristic_unsatisfied
    eos_array: npt.NDArray[np.int64] = field(init=False, repr=False)  # eos_ids as an array

    def __post_init__(self) -> None:
        self.eos_array = np.fromiter(self.eos_ids, dtype=np.int64, count=len(self.eos_ids))
        n = self.params.num_beams
        self.finished_scores = np.full(n, _PENALTY, dtype=np.float32)
        self.finished_flags = np.zeros(n, dtype=np.bool_)
        self.finished = [None] * n

    @property
    def num_beams(self) -> int:
        return self.params.num_beams

    @property
    def num_candidates(self) -> int:
        return max(2, 1 + len(self.eos_ids)) * self.num_beams

    def advance(self, cand_scores: npt.NDArray[np.float32], cand_beams: npt.NDArray[np.int64],
                cand_tokens: npt.NDArray[np.int64], beam_outputs: Sequence[Sequence[int]]) -> BeamChoice:
        """One step from the candidates (best first: accumulated score, running beam, token) and each running
        beam's output tokens so far."""
        nb = self.num_beams
        length = self.generated + 1  # the candidates' length
        hits = (cand_tokens[:, None] == self.eos_array[None, :]).any(axis=1)
        if length >= self.max_new_tokens:
            hits[:] = True
        # The best num_beams that do not stop continue (transformers' _get_running_beams_for_next_iteration).
        running = cand_scores + hits.astype(np.float32) * _PENALTY
        keep = _top(running, nb)
        # Those of the first num_beams candidates that stop become finished (_update_finished_beams).
        scored = (cand_scores / np.float32(length ** self.params.length_penalty)).astype(np.float32)
        full = bool(self.finished_flags.all()) and self.params.early_stopping is True
        scored = scored + np.float32(_PENALTY * full) + np.float32(_PENALTY * (not self.improvable))
        just = hits.copy()
        just[nb:] = False
        scored = scored + (~just).astype(np.float32) * _PENALTY
        merged = np.concatenate([self.finished_scores, scored.astype(np.float32)])
        best = _top(merged, nb)
        old = list(self.finished)
        flags = np.concatenate([self.finished_flags, just])
        hyps: list[BeamHypothesis | None] = []
        for i in best:
            if i < nb:
                hyps.append(old[i])
            elif just[i - nb]:
                c = i - nb
                parent = int(cand_beams[c])
                hyps.append(BeamHypothesis((*beam_outputs[parent], int(cand_tokens[c])), float(merged[i]),
                                           float(cand_scores[c])))
            else:
                hyps.append(None)
        self.finished_scores, self.finished_flags, self.finished = merged[best], flags[best], hyps
        self.running_scores = running[keep]
        self.generated = length
        self.improvable = self._still_improvable()
        done = not (self.improvable and not (self.finished_flags.all() and self.params.early_stopping is True)
                    and not hits.all())
        return BeamChoice(cand_beams[keep], cand_tokens[keep], self.running_scores, done)

    def _still_improvable(self) -> bool:
        """transformers' _check_early_stop_heuristic: can the best running beam still beat the worst finished?"""
        p = self.params
        if p.early_stopping == "never" and p.length_penalty > 0.0:
            length = self.max_new_tokens
        else:
            length = self.generated
        best_possible = np.float32(self.running_scores[0] / np.float32(length ** p.length_penalty))
        worst = np.where(self.finished_flags, self.finished_scores.min(), _PENALTY)
        return self.improvable and bool((best_possible > worst).any())

    def results(self) -> list[BeamHypothesis]:
        """The returned hypotheses, best first."""
        return [h for h in self.finished[: self.params.beams_returned] if h is not None]


def _top(values: npt.NDArray[np.float32], k: int) -> npt.NDArray[np.int64]:
    """Indices of the k largest values, largest first; ties in index order."""
    return np.argsort(-values, kind="stable")[:k].astype(np.int64)


def ngram_bans(ids: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.int64]:
    """Tokens that would repeat an n-gram of `ids` (transformers' NoRepeatNGramLogitsProcessor): the tokens that
    followed each earlier occurrence of the last n - 1 tokens."""
    if n == 1:
        return np.unique(ids)
    if n <= 0 or len(ids) < n:
        return np.zeros(0, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(ids, n)  # every n-gram, in order
    prefix = ids[len(ids) - (n - 1):]
    hit = (windows[:, : n - 1] == prefix).all(axis=1)
    return np.unique(windows[hit, n - 1])


@dataclass(frozen=True)
class Candidates:
    """Per group (in the order given): its candidates' accumulated scores, running beams and tokens."""

    scores: list[npt.NDArray[np.float32]]
    beams: list[npt.NDArray[np.int64]]
    tokens: list[npt.NDArray[np.int64]]


def beam_candidates(logprobs: torch.Tensor, row_groups: Sequence[tuple[int, int]],
                    running_scores: Sequence[npt.NDArray[np.float32]], counts: Sequence[int]) -> Candidates:
    """The top `counts[g]` continuations of each group over all its beams' tokens. `logprobs` [R, V]: every
    beam's processed log-softmax, group g's beams in rows [start, start + size) of `row_groups[g]`. Groups of
    the same beam count share one top-k; the result reaches the host once."""
    vocab = logprobs.shape[1]
    device = logprobs.device
    order: dict[tuple[int, int], list[int]] = {}
    for g, ((_, size), k) in enumerate(zip(row_groups, counts)):
        order.setdefault((size, k), []).append(g)
    parts: list[tuple[list[int], torch.Tensor, torch.Tensor]] = []
    for (size, k), groups in order.items():
        rows = torch.as_tensor(np.concatenate([np.arange(row_groups[g][0], row_groups[g][0] + size) for g in groups]),
                               device=device)
        scores = torch.as_tensor(np.concatenate([running_scores[g] for g in groups]), device=device)
        acc = (logprobs.index_select(0, rows) + scores[:, None]).reshape(len(groups), size * vocab)
        values, indices = torch.topk(acc, min(k, size * vocab), dim=1)
        parts.append((groups, values, indices))
    host = [(groups, v.cpu().numpy(), i.cpu().numpy()) for groups, v, i in parts]
    out_scores: list[npt.NDArray[np.float32]] = [np.zeros(0, dtype=np.float32)] * len(row_groups)
    out_beams: list[npt.NDArray[np.int64]] = [np.zeros(0, dtype=np.int64)] * len(row_groups)
    out_tokens: list[npt.NDArray[np.int64]] = [np.zeros(0, dtype=np.int64)] * len(row_groups)
    for members, top_values, top_indices in host:
        for j, g in enumerate(members):
            out_scores[g] = top_values[j].astype(np.float32)
            out_beams[g] = (top_indices[j] // vocab).astype(np.int64)
            out_tokens[g] = (top_indices[j] % vocab).astype(np.int64)
    return Candidates(out_scores, out_beams, out_tokens)
