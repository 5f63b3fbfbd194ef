"""Contrastive search (Su et al., 2022; transformers' `penalty_alpha` / `top_k`): each step picks, among the top_k
next tokens, the one maximising (1 - alpha) * p(token) - alpha * max cos(h(token), h(earlier position)), with h
the model's final (normed) hidden state.

The k candidates of a request are verified in one forward step as requests of their own, forked from the
sequence so far exactly as beams are (`Scheduler.fork` / `refork`: the sequence's KV slots shared, one slot per
candidate): each computes its token and gives its hidden state and next-token logits. The request that asked
holds the chosen sequence (`ReqState.BEAMS`, no row), takes the winner's token through the engine's ordinary
append (stop strings, EOS, max_new_tokens, streaming), and the winner's logits give the next candidates: the
winner continues with the first, the other candidates are re-forked from it. The hidden states of the prompt
(every position is computed: none is served from the cache) and of each chosen token are kept per request,
normalised, on the device: at most the request's context.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from radixgen.runtime.request import Req, ReqState
from radixgen.runtime.sampler import apply_grammar
from radixgen.runtime.scheduler import Scheduler

# the packed masks of the constrained requests among `reqs` and the logits row of each (the engine's mask filler)
MaskFiller = Callable[[list[Req]], tuple[torch.Tensor | None, torch.Tensor | None]]


@dataclass
class ContrastiveRun:
    """One search in flight: the request that asked, its candidates (one per candidate token, their last output
    token), the candidates' probabilities, and the normalised hidden states of the sequence so far [L, d]."""

    root: Req
    candidates: list[Req]
    probs: torch.Tensor
    history: torch.Tensor


@dataclass(frozen=True)
class Choice:
    """A step's winner for one search: its token (to append to the request) and where its logits are."""

    run: ContrastiveRun
    token: int
    winner: int  # index into run.candidates
    row: int  # the winner's row of the step's logits


class ContrastiveSearches:
    """Every contrastive search of one engine loop."""

    def __init__(self, scheduler: Scheduler, masks: MaskFiller, token_count: int) -> None:
        self.scheduler = scheduler
        self.masks = masks
        self.token_count = token_count
        self.runs: dict[str, ContrastiveRun] = {}
        self._prompts: dict[str, torch.Tensor] = {}  # prompt hidden states [prompt_len, d] of requests prefilling
        self._ids = itertools.count()

    def add_prompt_hidden(self, req: Req, first_pos: int, hidden: torch.Tensor) -> None:
        """Hidden states [n, d] of prompt positions first_pos .. first_pos + n - 1 of `req` (a prefill chunk's;
        a chunk computed again after a preemption overwrites its positions)."""
        held = self._prompts.get(req.rid)
        if held is None:
            held = self._prompts[req.rid] = torch.empty(req.prompt_len, hidden.shape[1], dtype=torch.float32,
                                                        device=hidden.device)
        held[first_pos : first_pos + len(hidden)] = _normalised(hidden)

    def start(self, root: Req, logits: torch.Tensor) -> None:
        """The prompt is computed: its last row's logits (`logits` [V]) give the first candidates."""
        history = self._prompts.pop(root.rid)
        root.beam_group = root.rid
        first = self._fork(root, root)
        self.scheduler.start_beams(root)
        self.scheduler.release_beam(root, ReqState.BEAMS)
        run = ContrastiveRun(root, [first], torch.ones(1), history)
        self.runs[root.rid] = run
        self._candidates(run, 0, logits)

    def choose(self, reqs: Sequence[Req], logits: torch.Tensor, hidden: torch.Tensor,
               rows: np.ndarray) -> list[Choice]:
        """The winner of each search whose candidates are among `reqs` (their logits and hidden states in rows
        `rows` of `logits` and `hidden`); each winner's hidden state joins its search's history."""
        row_of = {r.rid: int(row) for r, row in zip(reqs, rows)}
        out = []
        for run in {id(self.runs[r.beam_group]): self.runs[r.beam_group] for r in reqs
                    if r.beam_group is not None}.values():
            cand_rows = [row_of[c.rid] for c in run.candidates]
            h = _normalised(hidden[torch.as_tensor(cand_rows, device=hidden.device)].float())  # [k, d]
            penalty = (h @ run.history.T).max(dim=1).values  # each candidate's largest cosine similarity
            alpha = run.root.params.penalty_alpha
            score = (1.0 - alpha) * run.probs.to(h.device) - alpha * penalty
            winner = int(score.argmax())
            run.history = torch.cat([run.history, h[winner : winner + 1]])
            out.append(Choice(run, run.candidates[winner].output_ids[-1], winner, cand_rows[winner]))
        return out

    def proceed(self, choice: Choice, logits: torch.Tensor) -> None:
        """The next candidates of a search that goes on, from its winner's logits [V] (the request's grammar has
        taken the chosen token)."""
        self._candidates(choice.run, choice.winner, logits)

    def end(self, root: Req) -> None:
        """Release every candidate of the search `root` asked for."""
        run = self.runs.pop(root.rid, None)
        self._prompts.pop(root.rid, None)
        if run is None:
            return
        for cand in run.candidates:
            if cand.state is ReqState.RUNNING:
                self.scheduler.release_beam(cand)

    # ------------------------------------------------------------------ internals
    def _candidates(self, run: ContrastiveRun, winner: int, logits: torch.Tensor) -> None:
        """The top_k next tokens after the winner's sequence: the winner takes the first, the other candidates
        are re-forked from it (forked where there are fewer, at the start), each with its token appended."""
        x = logits.float().clone()[None]
        if self.token_count < x.shape[1]:
            x[:, self.token_count:] = float("-inf")
        mask, mask_rows = self.masks([run.root])  # the grammar as it stands after the chosen tokens
        if mask is not None:
            apply_grammar(x, mask, mask_rows)
        probs, ids = torch.softmax(x, dim=-1)[0].topk(run.root.params.top_k)
        tokens = ids.tolist()
        keep = probs > 0  # a grammar may leave fewer than top_k tokens possible
        if not bool(keep.all()):
            probs, tokens = probs[keep], [t for t, k in zip(tokens, keep.tolist()) if k]
        lead = run.candidates[winner]
        others = [c for i, c in enumerate(run.candidates) if i != winner]
        new = [lead]
        for _ in tokens[1:]:
            new.append(self._refork(others.pop(), lead) if others else self._fork(run.root, lead))
        for cand in others:
            self.scheduler.release_beam(cand)
        for cand, token in zip(new, tokens):
            cand.output_ids.append(token)
        run.candidates, run.probs = new, probs

    def _fork(self, root: Req, parent: Req) -> Req:
        child = Req(rid=f"{root.rid}#cand{next(self._ids)}", origin_ids=root.origin_ids, params=root.params,
                    namespace=root.namespace, output_ids=list(parent.output_ids), beam_group=root.rid)
        self.scheduler.fork(parent, child)
        return child

    def _refork(self, cand: Req, parent: Req) -> Req:
        cand.output_ids = list(parent.output_ids)
        self.scheduler.refork(cand, parent)
        return cand


def _normalised(h: torch.Tensor) -> torch.Tensor:
    """Rows of `h` scaled to unit length, in fp32 (cosine similarities are their dot products)."""
    h = h.float()
    return h / h.norm(dim=-1, keepdim=True)
