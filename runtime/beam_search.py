"""Beam search's bookkeeping, with transformers' semantics (`generate(num_beams=..., do_sample=False)`).

A request's running beams are engine requests decoded in lockstep; each step the engine scores their next
tokens together (`beam_candidates`: log_softmax, the bans, plus each beam's running score, the top
`max(2, 1 + #eos) * num_beams` over all its beams' tokens, in one device pass per shape of search), and
`choose` then does on the host what transformers' `_beam_search` does with those candidates, for every search
of one shape in one pass over a [searches, candidates] block: the best `num_beams` that do not stop continue,
those among the first `num_beams` that stop (EOS, or the length limit) enter the finished hypotheses, scored
sum logprob / length ** length_penalty, and the early-stopping rule (True / False / "never") decides when the
search ends. Numbers are float32 as there, so scores match.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from radixgen.runtime.sampling_params import SamplingParams

_PENALTY = np.float32(-1.0e9)  # transformers' "never this one" offset

# (search, beam) -> that running beam's output tokens so far (read only for the hypotheses that finish)
BeamOutputs = Callable[[int, int], Sequence[int]]


@dataclass(frozen=True)
class BeamHypothesis:
    """A finished beam: its output tokens (the stopping token included), its score and its sum of logprobs."""

    output_ids: tuple[int, ...]
    score: float
    cumulative_logprob: float


@dataclass
class BeamGroup:
    """One request's beam search: its running beams' scores (best first) and its finished hypotheses (slot i holds
    `hypotheses[finished_refs[i]]` where `finished_flags[i]`, slots best first)."""

    params: SamplingParams
    max_new_tokens: int  # the length limit: max_new_tokens, or the room left in the context
    eos_ids: frozenset[int]
    running_scores: npt.NDArray[np.float32] = field(default_factory=lambda: np.zeros(1, dtype=np.float32))
    generated: int = 0  # tokens every running beam holds
    finished_scores: npt.NDArray[np.float32] = field(init=False)
    finished_flags: npt.NDArray[np.bool_] = field(init=False)
    finished_refs: npt.NDArray[np.int64] = field(init=False)
    hypotheses: list[BeamHypothesis] = field(default_factory=list)  # every one that entered, in entry order
    improvable: bool = True  # transformers' is_early_stop_heuristic_unsatisfied
    eos_array: npt.NDArray[np.int64] = field(init=False, repr=False)  # eos_ids as an array

    def __post_init__(self) -> None:
        self.eos_array = np.fromiter(self.eos_ids, dtype=np.int64, count=len(self.eos_ids))
        n = self.params.num_beams
        self.finished_scores = np.full(n, _PENALTY, dtype=np.float32)
        self.finished_flags = np.zeros(n, dtype=np.bool_)
        self.finished_refs = np.zeros(n, dtype=np.int64)

    @property
    def num_beams(self) -> int:
        return self.params.num_beams

    @property
    def num_candidates(self) -> int:
        return max(2, 1 + len(self.eos_ids)) * self.num_beams

    def results(self) -> list[BeamHypothesis]:
        """The returned hypotheses, best first."""
        n = self.params.beams_returned
        return [self.hypotheses[r] for r, f in zip(self.finished_refs[:n].tolist(), self.finished_flags[:n]) if f]


@dataclass(frozen=True)
class CandidateBlock:
    """The candidates of the searches `rows` (indices into the step's searches), all of one shape (running beams,
    num_beams, candidates): row i holds search rows[i]'s, best first: accumulated score, running beam, token."""

    rows: npt.NDArray[np.int64]
    scores: npt.NDArray[np.float32]  # [searches, candidates]
    beams: npt.NDArray[np.int64]
    tokens: npt.NDArray[np.int64]


@dataclass(frozen=True)
class BeamChoices:
    """A step's outcome for the searches of one block: in row i (search rows[i]) new beam j continues running beam
    `parents[i, j]` with `tokens[i, j]` at running score `scores[i, j]`; `done[i]`: that search has ended (its
    finished hypotheses are final)."""

    rows: npt.NDArray[np.int64]
    parents: npt.NDArray[np.int64]  # [searches, num_beams]
    tokens: npt.NDArray[np.int64]
    scores: npt.NDArray[np.float32]
    done: npt.NDArray[np.bool_]  # [searches]


def choose(groups: Sequence[BeamGroup], block: CandidateBlock, outputs: BeamOutputs) -> BeamChoices:
    """One step of the searches of `block` (`groups`: every search of the step) from their candidates:
    transformers' _get_running_beams_for_next_iteration, _update_finished_beams, _check_early_stop_heuristic and
    _beam_search_has_unfinished_sequences, one row per search. Updates each group's state."""
    gs = [groups[i] for i in block.rows.tolist()]
    nb = gs[0].num_beams  # a block's searches are of one num_beams
    scores, beams, tokens = block.scores, block.beams, block.tokens
    # Per search: the candidates' length, the denominators of the finished and of the best possible score
    # (Python's float pow, then float32, as a search on its own rounds them), the flags of its state.
    length = [g.generated + 1 for g in gs]
    facts = np.array([_facts(g, n) for g, n in zip(gs, length)], dtype=np.float64)
    finished_den, best_den = facts[:, 0].astype(np.float32), facts[:, 1].astype(np.float32)
    at_limit, es_true, improvable = facts[:, 2] > 0, facts[:, 3] > 0, facts[:, 4] > 0
    fin_scores = np.array([g.finished_scores for g in gs])
    fin_flags = np.array([g.finished_flags for g in gs])
    fin_refs = np.array([g.finished_refs for g in gs])
    row = np.arange(len(gs))[:, None]

    hits = (tokens[:, :, None] == _padded_eos(gs)[:, None, :]).any(axis=2) | at_limit[:, None]
    # The best num_beams that do not stop continue (transformers' _get_running_beams_for_next_iteration).
    running = scores + hits.astype(np.float32) * _PENALTY
    keep = _top(running, nb)
    # Those of the first num_beams candidates that stop become finished (_update_finished_beams).
    scored = scores / finished_den[:, None]
    full = fin_flags.all(axis=1) & es_true
    scored = scored + (full.astype(np.float32) * _PENALTY)[:, None] + \
        ((~improvable).astype(np.float32) * _PENALTY)[:, None]
    just = hits.copy()
    just[:, nb:] = False
    scored = scored + (~just).astype(np.float32) * _PENALTY
    merged = np.concatenate([fin_scores, scored], axis=1)
    best = _top(merged, nb)
    new_scores = merged[row, best]
    new_flags = np.concatenate([fin_flags, just], axis=1)[row, best]
    new_refs = fin_refs[row, np.minimum(best, nb - 1)]  # right where an old hypothesis is kept
    for i, j in np.argwhere(new_flags & (best >= nb)).tolist():  # the candidates that entered
        c, g = int(best[i, j]) - nb, gs[i]
        g.hypotheses.append(BeamHypothesis((*outputs(int(block.rows[i]), int(beams[i, c])), int(tokens[i, c])),
                                           float(new_scores[i, j]), float(scores[i, c])))
        new_refs[i, j] = len(g.hypotheses) - 1
    new_running = running[row, keep]
    # transformers' _check_early_stop_heuristic: can the best running beam still beat the worst finished?
    best_possible = new_running[:, 0] / best_den
    worst = np.where(new_flags, new_scores.min(axis=1)[:, None], _PENALTY)
    new_improvable = improvable & (best_possible[:, None] > worst).any(axis=1)
    done = ~(new_improvable & ~(new_flags.all(axis=1) & es_true) & ~hits.all(axis=1))
    for i, (g, still) in enumerate(zip(gs, new_improvable.tolist())):
        g.finished_scores, g.finished_flags, g.finished_refs = new_scores[i], new_flags[i], new_refs[i]
        g.running_scores, g.generated, g.improvable = new_running[i], length[i], still
    return BeamChoices(block.rows, beams[row, keep], tokens[row, keep], new_running, done)


def _facts(g: BeamGroup, length: int) -> tuple[float, float, bool, bool, bool]:
    """A search's numbers for a step whose candidates hold `length` tokens: length ** length_penalty, the best
    hypothetical length ** length_penalty (transformers': the length limit for "never" with a positive penalty),
    whether the length limit is reached, early_stopping is True, and it can still improve."""
    p = g.params
    best = g.max_new_tokens if p.early_stopping == "never" and p.length_penalty > 0.0 else length
    return (length ** p.length_penalty, best ** p.length_penalty, length >= g.max_new_tokens,
            p.early_stopping is True, g.improvable)


def _padded_eos(gs: Sequence[BeamGroup]) -> npt.NDArray[np.int64]:
    """[searches, most eos ids]: each search's stopping tokens, padded with -1 (no token's id)."""
    eos = [g.eos_array for g in gs]
    widths = [len(e) for e in eos]
    width = max(widths)
    if width == min(widths):
        return np.array(eos, dtype=np.int64) if width else np.full((len(gs), 1), -1, dtype=np.int64)
    out = np.full((len(gs), width), -1, dtype=np.int64)
    for i, e in enumerate(eos):
        out[i, : len(e)] = e
    return out


def _top(values: npt.NDArray[np.float32], k: int) -> npt.NDArray[np.int64]:
    """Per row, the indices of the k largest values, largest first; ties in index order."""
    return np.argsort(-values, axis=1, kind="stable")[:, :k].astype(np.int64)


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


def beam_candidates(logprobs: torch.Tensor, starts: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64],
                    groups: Sequence[BeamGroup]) -> list[CandidateBlock]:
    """The top `num_candidates` continuations of each search over all its beams' tokens. `logprobs` [R, V]: every
    beam's processed log-softmax, search g's `sizes[g]` running beams in rows from `starts[g]`. Searches of one
    shape (running beams, num_beams, candidates) share one top-k and make one block; blocks reach the host after
    every top-k is queued."""
    vocab = logprobs.shape[1]
    device = logprobs.device
    shapes: dict[tuple[int, int, int], list[int]] = {}
    for g, (size, group) in enumerate(zip(sizes.tolist(), groups)):
        shapes.setdefault((size, group.num_beams, group.num_candidates), []).append(g)
    parts: list[tuple[list[int], torch.Tensor, torch.Tensor]] = []
    for (size, _, k), members in shapes.items():
        rows = (starts[members][:, None] + np.arange(size, dtype=np.int64)[None, :]).ravel()
        running = np.concatenate([groups[g].running_scores for g in members])
        acc = logprobs.index_select(0, torch.as_tensor(rows, device=device)) + \
            torch.as_tensor(running, device=device)[:, None]
        values, indices = torch.topk(acc.reshape(len(members), size * vocab), min(k, size * vocab), dim=1)
        parts.append((members, values, indices))
    blocks = []
    for members, values, indices in parts:
        top = indices.cpu().numpy().astype(np.int64)
        blocks.append(CandidateBlock(np.asarray(members, dtype=np.int64), values.cpu().numpy().astype(np.float32),
                                     top // vocab, top % vocab))
    return blocks
