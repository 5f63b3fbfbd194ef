"""The engine's side of beam search: the beams of each search as running requests, one step of all of them.

A beam search request prefills as any request; at its first sample it becomes the holder of its search
(`ReqState.BEAMS`, no row of its own) and its beams run as requests of their own, forked from it: a fork shares
its parent's KV slots (the scheduler's `fork`: the table row's slots, never the KV), so the prompt's KV is held
once whatever `num_beams`, and a beam's own KV is one slot per token it adds. Each step scores every beam of
the step at once (`beam_search.beam_candidates`), lets the searches choose (`beam_search.choose`, one pass per
shape of search), then turns the beams nobody continues into the new children (`Scheduler.refork_many`: same
request and row, the parent's slots), so a search never holds more than num_beams rows. The scheduler's part of a
step is one call each for every search at once (`release_beams` for the searches that ended, `refork_many`);
only new forks (a search's first step) go one by one. A new beam's grammar is a fork of its parent's matcher.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from radixgen.runtime.beam_search import BeamChoices, BeamGroup, BeamHypothesis, beam_candidates, choose, ngram_bans
from radixgen.runtime.request import Req, ReqState
from radixgen.runtime.sampler import apply_grammar
from radixgen.runtime.scheduler import Scheduler

# the packed masks of the constrained beams among `reqs` and the logits row of each (the engine's mask filler)
MaskFiller = Callable[[list[Req]], tuple[torch.Tensor | None, torch.Tensor | None]]


@dataclass
class BeamRun:
    """One beam search in flight: the request that asked for it, its running beams (best first), its state."""

    root: Req
    beams: list[Req]
    group: BeamGroup


@dataclass(frozen=True)
class EndedSearch:
    """A search that has ended this step: its request and its returned hypotheses (best first)."""

    root: Req
    results: list[BeamHypothesis]


@dataclass(frozen=True)
class BeamMoves:
    """How one block's choices become requests, row i for search rows[i] (as lists, read per beam). New beam j is
    `pool[sources[i][j]]`, pool = the old beams then the forks made in order. `ops[i]`: the children that are not
    their parent's first, in the order their request is made: the k-th takes over old beam `dropped[i][k]` (a
    refork) while any is left, else it is a new fork; the dropped beams left over are released."""

    parents: list[list[int]]
    tokens: list[list[int]]
    sources: list[list[int]]
    ops: list[list[int]]
    dropped: list[list[int]]


def beam_moves(choices: BeamChoices, sizes: npt.NDArray[np.int64]) -> BeamMoves:
    """The requests of the new beams for every search of a block at once (`sizes`: each row's running beams
    before the step): a parent's first child continues the parent's own request; each further child, taken
    parent by parent in order of their first child, takes a dropped beam's request, the last dropped first."""
    parents = choices.parents
    width = parents.shape[1]
    cols = np.arange(width, dtype=np.int64)
    first_of = (parents[:, :, None] == parents[:, None, :]).argmax(axis=2)  # the first child of each's parent
    first = first_of == cols
    held = (parents[:, :, None] == cols[None, None, :]).any(axis=1)  # old beam p has a child
    dropped = ~held & (cols[None, :] < sizes[:, None])
    ops = np.argsort(np.where(first, width * width, first_of * width + cols), axis=1, kind="stable")
    order = np.argsort(np.where(dropped, -cols, 1), axis=1, kind="stable")
    n_ops, n_dropped = (~first).sum(axis=1), dropped.sum(axis=1)
    target = np.where(cols < n_dropped[:, None], order, sizes[:, None] + cols - n_dropped[:, None])
    sources = parents.copy()
    rows, ks = np.nonzero(cols[None, :] < n_ops[:, None])
    sources[rows, ops[rows, ks]] = target[rows, ks]
    return BeamMoves(parents.tolist(), choices.tokens.tolist(), sources.tolist(),
                     [o[:n] for o, n in zip(ops.tolist(), n_ops.tolist())],
                     [o[:n] for o, n in zip(order.tolist(), n_dropped.tolist())])


class BeamSearches:
    """Every beam search of one engine loop."""

    def __init__(self, scheduler: Scheduler, masks: MaskFiller, eos_ids: frozenset[int], token_count: int,
                 max_context: int) -> None:
        self.scheduler = scheduler
        self.masks = masks
        self.eos_ids = eos_ids
        self.token_count = token_count
        self.max_context = max_context
        self.runs: dict[str, BeamRun] = {}
        self._ids = itertools.count()

    def run_of(self, req: Req) -> BeamRun | None:
        return self.runs.get(req.beam_group) if req.beam_group is not None else None

    def step(self, reqs: Sequence[Req], logits: torch.Tensor, rows: np.ndarray) -> list[EndedSearch]:
        """One step of the searches whose beams (or, at their first sample, whose request) are `reqs`, their
        logits in rows `rows` of `logits`. Returns the searches that ended."""
        row_of = dict(zip([r.rid for r in reqs], rows.tolist()))
        runs = []
        for req in reqs:
            if req.beam_group is None:
                run = self._start(req)
                row_of[run.beams[0].rid] = row_of[req.rid]
                runs.append(run)
            elif req.rid == self.runs[req.beam_group].beams[0].rid:
                runs.append(self.runs[req.beam_group])
        ordered = [b for run in runs for b in run.beams]
        assert len(ordered) == len(reqs), "a step holds every beam of its searches"
        index = torch.as_tensor([row_of[b.rid] for b in ordered], device=logits.device)
        logprobs = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
        sizes = np.array([len(run.beams) for run in runs], dtype=np.int64)
        starts = np.cumsum(sizes) - sizes
        groups = [run.group for run in runs]
        self._ban(logprobs, runs, groups, ordered, starts, sizes)
        blocks = beam_candidates(logprobs, starts, sizes, groups)
        choices = [choose(groups, block, lambda g, b: runs[g].beams[b].output_ids) for block in blocks]
        at: list[tuple[BeamMoves, int, bool] | None] = [None] * len(runs)  # each search's moves, row, end
        for choice in choices:
            moves = beam_moves(choice, sizes[choice.rows])
            for i, (g, done) in enumerate(zip(choice.rows.tolist(), choice.done.tolist())):
                at[g] = (moves, i, done)
        ended, going = [], []
        for run, entry in zip(runs, at):  # in the step's order (forks append running requests)
            assert entry is not None, "every search of the step is in a block"
            moves, i, done = entry
            if done:
                ended.append(EndedSearch(run.root, run.group.results()))
            else:
                going.append((run, moves, i))
        self._move(going, [e.root for e in ended])
        return ended

    def end(self, root: Req) -> None:
        """Release every beam of the search `root` asked for (nothing of theirs is cached)."""
        self.scheduler.release_beams(self._ended_beams([root]))

    # ------------------------------------------------------------------ internals
    def _ended_beams(self, roots: Sequence[Req]) -> list[Req]:
        """The running beams of the searches `roots` asked for, those searches forgotten."""
        beams: list[Req] = []
        for root in roots:
            run = self.runs.pop(root.rid, None)
            if run is not None:
                beams.extend(b for b in run.beams if b.state is ReqState.RUNNING)
        return beams

    def _start(self, root: Req) -> BeamRun:
        """The request becomes its search's holder; its one beam (so far) holds its prompt's KV."""
        root.beam_group = root.rid
        group = BeamGroup(root.params, root.output_budget(self.max_context), self.eos_of(root))
        first = self._child(root)
        self._take_tokens(root, first, root)
        self.scheduler.fork(root, first)
        self.scheduler.start_beams(root)
        self.scheduler.release_beam(root, ReqState.BEAMS)
        run = BeamRun(root, [first], group)
        self.runs[root.rid] = run
        return run

    def eos_of(self, req: Req) -> frozenset[int]:
        """The tokens that end a beam of `req`: EOS (unless ignore_eos) and its stop_token_ids."""
        eos = frozenset() if req.params.ignore_eos else self.eos_ids
        return eos | frozenset(req.params.stop_token_ids)

    def _child(self, root: Req) -> Req:
        """A new beam's request (not running yet)."""
        return Req(rid=f"{root.rid}#beam{next(self._ids)}", origin_ids=root.origin_ids, params=root.params,
                   namespace=root.namespace, beam_group=root.rid)

    def _take_tokens(self, root: Req, beam: Req, parent: Req) -> None:
        """`beam` holds the parent's output tokens, and its grammar stands where the parent's does: a fork of
        the parent beam's matcher (which has seen exactly those tokens, stopping tokens aside), or a fresh one
        where the parent is the search's own request."""
        beam.output_ids = list(parent.output_ids)
        if root.grammar is None:
            return
        if parent is not root and parent.matcher is not None:
            beam.matcher = parent.matcher.fork()
            return
        beam.matcher = root.grammar.matcher()
        eos = self.eos_of(root)
        for t in beam.output_ids:
            if t not in eos and not beam.matcher.advance(t):
                raise RuntimeError(f"beam of {root.rid}: its grammar refused its own token {t}")

    def _ban(self, logprobs: torch.Tensor, runs: list[BeamRun], groups: list[BeamGroup], ordered: list[Req],
             starts: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]) -> None:
        """-inf where a beam may not continue: its grammar, padding ids past the tokenizer, EOS before
        min_new_tokens, a repeated n-gram (as transformers' logits processors do, after the log-softmax)."""
        if self.token_count < logprobs.shape[1]:
            logprobs[:, self.token_count:] = float("-inf")
        mask, mask_rows = self.masks(ordered)
        if mask is not None:
            apply_grammar(logprobs, mask, mask_rows)
        rows, cols = eos_bans(groups, starts, sizes)
        for r, run in enumerate(runs):  # a rare option: its scan is per beam
            n = run.group.params.no_repeat_ngram_size
            for i, beam in enumerate(run.beams if n else ()):
                ids = ngram_bans(beam.fill_ids(), n)
                rows = np.concatenate([rows, np.full(len(ids), int(starts[r]) + i, dtype=np.int64)])
                cols = np.concatenate([cols, ids])
        if len(rows):
            at = torch.as_tensor(rows, device=logprobs.device)
            to = torch.as_tensor(cols, device=logprobs.device)
            logprobs[at, to] = float("-inf")

    def _move(self, going: list[tuple[BeamRun, BeamMoves, int]], ended: list[Req]) -> None:
        """Every search of the step takes its moves at once: the beams of the `ended` searches and the dropped
        beams no child takes are released (one `release_beams`), the dropped beams that a further child takes
        become forks of its parent in place (one `refork_many`), the other further children are new forks; then
        each new beam's token is appended (and its grammar advanced). Search `going[k]` takes row i of its
        moves."""
        released = self._ended_beams(ended)
        reforks: list[tuple[Req, Req, Req]] = []  # (root, beam, parent)
        forks: list[tuple[Req, Req, Req]] = []  # (root, child, parent)
        for run, moves, i in going:
            old, parents, dropped, ops = run.beams, moves.parents[i], moves.dropped[i], moves.ops[i]
            pool = list(old)
            for k, j in enumerate(ops):
                if k < len(dropped):
                    reforks.append((run.root, old[dropped[k]], old[parents[j]]))
                else:
                    child = self._child(run.root)
                    forks.append((run.root, child, old[parents[j]]))
                    pool.append(child)
            released.extend(old[d] for d in dropped[len(ops):])
            run.beams = [pool[s] for s in moves.sources[i]]
        self.scheduler.release_beams(released)
        for root, beam, parent in reforks + forks:
            self._take_tokens(root, beam, parent)
        self.scheduler.refork_many([b for _, b, _ in reforks], [p for _, _, p in reforks])
        for _, child, parent in forks:
            self.scheduler.fork(parent, child)
        for run, moves, i in going:
            self._append(run, moves.tokens[i])

    def _append(self, run: BeamRun, tokens: list[int]) -> None:
        """Each running beam of `run` takes its token; its grammar sees it unless it is a stopping token."""
        for beam, token in zip(run.beams, tokens):
            beam.output_ids.append(token)
        if run.root.grammar is None:
            return
        for beam, token in zip(run.beams, tokens):
            if token in run.group.eos_ids:
                continue  # a stopping token kept running (too few others): the grammar does not see it
            if beam.matcher is not None and not beam.matcher.advance(token):
                raise RuntimeError(f"beam of {run.root.rid}: its grammar refused token {token}")


def eos_bans(groups: Sequence[BeamGroup], starts: npt.NDArray[np.int64],
              sizes: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(row, token) of every EOS ban of the step: each beam of a search short of its min_new_tokens, at each of
    that search's stopping tokens (a search's beams hold equally many tokens: all of them or none)."""
    short = np.array([g.generated < g.params.min_new_tokens and len(g.eos_array) > 0 for g in groups], dtype=np.bool_)
    if not short.any():
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    which = np.flatnonzero(short)
    eos = [groups[s].eos_array for s in which.tolist()]
    widths = np.array([len(e) for e in eos], dtype=np.int64)
    beam_rows = _segments(starts[which], sizes[which])  # every beam of the short searches
    per_beam = np.repeat(np.arange(len(which)), sizes[which])  # its search (among the short ones)
    counts = widths[per_beam]
    offsets = np.cumsum(widths) - widths
    return np.repeat(beam_rows, counts), np.concatenate(eos)[_segments(offsets[per_beam], counts)]


def _segments(starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The ranges [starts[i], starts[i] + lengths[i]) one after another."""
    total = int(lengths.sum())
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(total, dtype=np.int64)
