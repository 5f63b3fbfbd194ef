"""The engine's side of beam search: the beams of each search as running requests, one step of all of them.

A beam search request prefills as any request; at its first sample it becomes the holder of its search
(`ReqState.BEAMS`, no row of its own) and its beams run as requests of their own, forked from it: a fork shares
its parent's KV slots (the scheduler's `fork`: the table row's slots, never the KV), so the prompt's KV is held
once whatever `num_beams`, and a beam's own KV is one slot per token it adds. Each step scores every beam of
the step at once (`beam_search.beam_candidates`), lets the searches choose (`beam_search.choose`, one pass per
shape of search), then turns the beams nobody continues into the new children (`Scheduler.refork`: same request
and row, the parent's slots), so a search never holds more than num_beams rows.
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
        ended = []
        for run, entry in zip(runs, at):  # in the step's order (forks append running requests)
            assert entry is not None, "every search of the step is in a block"
            moves, i, done = entry
            if done:
                ended.append(EndedSearch(run.root, run.group.results()))
                self.end(run.root)
            else:
                self._apply(run, moves, i)
        return ended

    def end(self, root: Req) -> None:
        """Release every beam of the search `root` asked for (nothing of theirs is cached)."""
        run = self.runs.pop(root.rid, None)
        if run is None:
            return
        for beam in run.beams:
            if beam.state is ReqState.RUNNING:
                self.scheduler.release_beam(beam)

    # ------------------------------------------------------------------ internals
    def _start(self, root: Req) -> BeamRun:
        """The request becomes its search's holder; its one beam (so far) holds its prompt's KV."""
        root.beam_group = root.rid
        group = BeamGroup(root.params, root.output_budget(self.max_context), self.eos_of(root))
        first = self._fork(root, root)
        self.scheduler.start_beams(root)
        self.scheduler.release_beam(root, ReqState.BEAMS)
        run = BeamRun(root, [first], group)
        self.runs[root.rid] = run
        return run

    def eos_of(self, req: Req) -> frozenset[int]:
        """The tokens that end a beam of `req`: EOS (unless ignore_eos) and its stop_token_ids."""
        eos = frozenset() if req.params.ignore_eos else self.eos_ids
        return eos | frozenset(req.params.stop_token_ids)

    def _fork(self, root: Req, parent: Req) -> Req:
        """A new beam continuing `parent` (its own request and row)."""
        child = Req(rid=f"{root.rid}#beam{next(self._ids)}", origin_ids=root.origin_ids, params=root.params,
                    namespace=root.namespace, beam_group=root.rid)
        self._take_tokens(root, child, parent)
        self.scheduler.fork(parent, child)
        return child

    def _refork(self, root: Req, beam: Req, parent: Req) -> Req:
        """A dropped beam turned into a new one continuing `parent` (its request and row reused)."""
        self._take_tokens(root, beam, parent)
        self.scheduler.refork(beam, parent)
        return beam

    def _take_tokens(self, root: Req, beam: Req, parent: Req) -> None:
        """`beam` holds the parent's output tokens, and its grammar stands where the parent's does."""
        beam.output_ids = list(parent.output_ids)
        if root.grammar is not None:
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

    def _apply(self, run: BeamRun, moves: BeamMoves, i: int) -> None:
        """Search `run` takes its row `i` of `moves`: the reforks and forks of its further children, the release
        of the dropped beams left over, then each new beam's token appended (and its grammar advanced)."""
        old, parents, dropped = run.beams, moves.parents[i], moves.dropped[i]
        pool = list(old)
        for k, j in enumerate(moves.ops[i]):
            parent = old[parents[j]]
            if k < len(dropped):
                self._refork(run.root, old[dropped[k]], parent)
            else:
                pool.append(self._fork(run.root, parent))
        for d in dropped[len(moves.ops[i]):]:
            self.scheduler.release_beam(old[d])
        run.beams = beams = [pool[s] for s in moves.sources[i]]
        tokens = moves.tokens[i]
        for beam, token in zip(beams, tokens):
            beam.output_ids.append(token)
        if run.root.grammar is None:
            return
        for beam, token in zip(beams, tokens):
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
