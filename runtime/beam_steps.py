"""The engine's side of beam search: the beams of each search as running requests, one step of all of them.

A beam search request prefills as any request; at its first sample it becomes the holder of its search
(`ReqState.BEAMS`, no row of its own) and its beams run as requests of their own, forked from it: a fork shares
its parent's KV slots (the scheduler's `fork`: the table row's slots, never the KV), so the prompt's KV is held
once whatever `num_beams`, and a beam's own KV is one slot per token it adds. Each step scores every beam of
the step at once (`beam_search.beam_candidates`), lets each search choose (`BeamGroup.advance`), then turns the
beams nobody continues into the new children (`Scheduler.refork`: same request and row, the parent's slots), so
a search never holds more than num_beams rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from radixgen.runtime.beam_search import BeamChoice, BeamGroup, BeamHypothesis, beam_candidates, ngram_bans
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
        row_of = {r.rid: int(row) for r, row in zip(reqs, rows)}
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
        self._ban(logprobs, runs, ordered)
        starts = np.cumsum([0] + [len(run.beams) for run in runs])[:-1]
        cands = beam_candidates(logprobs, [(int(s), len(run.beams)) for s, run in zip(starts, runs)],
                                [run.group.running_scores for run in runs], [run.group.num_candidates for run in runs])
        ended = []
        for g, run in enumerate(runs):
            choice = run.group.advance(cands.scores[g], cands.beams[g], cands.tokens[g],
                                       [b.output_ids for b in run.beams])
            if choice.done:
                ended.append(EndedSearch(run.root, run.group.results()))
                self.end(run.root)
            else:
                self._apply(run, choice)
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

    def _ban(self, logprobs: torch.Tensor, runs: list[BeamRun], ordered: list[Req]) -> None:
        """-inf where a beam may not continue: its grammar, padding ids past the tokenizer, EOS before
        min_new_tokens, a repeated n-gram (as transformers' logits processors do, after the log-softmax)."""
        if self.token_count < logprobs.shape[1]:
            logprobs[:, self.token_count:] = float("-inf")
        mask, mask_rows = self.masks(ordered)
        if mask is not None:
            apply_grammar(logprobs, mask, mask_rows)
        rows: list[np.ndarray] = []
        cols: list[np.ndarray] = []
        r = 0
        for run in runs:  # a search's beams hold equally many tokens: EOS is banned for all or none of them
            params, n = run.group.params, len(run.beams)
            eos = run.group.eos_array
            if run.group.generated < params.min_new_tokens and len(eos):
                rows.append(np.repeat(np.arange(r, r + n, dtype=np.int64), len(eos)))
                cols.append(np.tile(eos, n))
            if params.no_repeat_ngram_size:
                for i, beam in enumerate(run.beams):
                    ids = ngram_bans(beam.fill_ids(), params.no_repeat_ngram_size)
                    rows.append(np.full(len(ids), r + i, dtype=np.int64))
                    cols.append(ids)
            r += n
        if rows:
            at = torch.as_tensor(np.concatenate(rows), device=logprobs.device)
            to = torch.as_tensor(np.concatenate(cols), device=logprobs.device)
            logprobs[at, to] = float("-inf")

    def _apply(self, run: BeamRun, choice: BeamChoice) -> None:
        """The new beams: a parent's first child continues the parent's own request, each further child takes a
        dropped beam's request (a fork only where none is left: the first step), the rest of the dropped beams are
        released; then each beam's token is appended."""
        children: dict[int, list[int]] = {}
        for j, p in enumerate(choice.parents.tolist()):
            children.setdefault(p, []).append(j)
        dropped = [beam for p, beam in enumerate(run.beams) if p not in children]
        new: list[Req | None] = [None] * len(choice.parents)
        for p, js in children.items():
            parent = run.beams[p]
            for j in js[1:]:  # a dropped beam's request becomes the child where there is one
                new[j] = self._refork(run.root, dropped.pop(), parent) if dropped else self._fork(run.root, parent)
            new[js[0]] = parent
        for beam in dropped:
            self.scheduler.release_beam(beam)
        beams = [b for b in new if b is not None]
        for beam, token in zip(beams, choice.tokens.tolist()):
            beam.output_ids.append(token)
            if token in run.group.eos_ids:
                continue  # a stopping token kept running (too few others): the grammar does not see it
            if beam.matcher is not None and not beam.matcher.advance(token):
                raise RuntimeError(f"beam of {run.root.rid}: its grammar refused token {token}")
        run.beams = beams
