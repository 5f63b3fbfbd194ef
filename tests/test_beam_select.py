"""The batched beam-search step equals its per-search definitions: `choose` (every search of a shape in one pass)
against transformers' own step functions run one search at a time, over random candidates of searches with
mixed options; `beam_candidates` against a top-k per search; `beam_moves` and `eos_bans` against the
per-search loops they replace."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixgen.runtime.beam_search import BeamChoices, BeamGroup, BeamHypothesis, beam_candidates, choose
from radixgen.runtime.beam_steps import beam_moves, eos_bans
from radixgen.runtime.sampling_params import SamplingParams

VOCAB = 24  # small, so stopping tokens come up often among the candidates


def _group(rng: np.random.Generator) -> BeamGroup:
    """A search with random options: width, stopping tokens (none to three), length penalty, early stopping,
    length limit, returned beams."""
    nb = int(rng.integers(2, 5))
    eos = frozenset(rng.choice(VOCAB, size=int(rng.integers(0, 4)), replace=False).tolist())
    params = SamplingParams(temperature=0, num_beams=nb, length_penalty=float(rng.choice([1.0, 0.5, -1.0, 2.0, 0.0])),
                            early_stopping=[True, False, "never"][int(rng.integers(3))],
                            num_return_sequences=int(rng.integers(1, nb + 1)), max_new_tokens=16)
    return BeamGroup(params, int(rng.integers(2, 16)), eos)


class _Transformers:
    """One search stepped by transformers' own functions (a batch of one), on the candidates it is given;
    sequences hold token + 1 (0: no token yet)."""

    def __init__(self, group: BeamGroup) -> None:
        from transformers.generation.utils import GenerationMixin

        self.gm = GenerationMixin
        self.nb, self.limit, self.p = group.num_beams, group.max_new_tokens, group.params
        self.eos = np.array(sorted(group.eos_ids), dtype=np.int64)
        self.running = torch.zeros((1, self.nb, self.limit), dtype=torch.long)
        self.sequences = self.running.clone()
        self.scores = torch.full((1, self.nb), -1e9)
        self.finished = torch.zeros((1, self.nb), dtype=torch.bool)
        self.unsatisfied = torch.ones((1, 1), dtype=torch.bool)
        self.cur = 0

    def step(self, scores: np.ndarray, beams: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
        """The candidates each new running beam is, their running scores, whether the search ended."""
        gm, nb, k = self.gm, self.nb, len(scores)
        top_lp = torch.from_numpy(scores.copy())[None]
        top_seq = self.running[:, torch.from_numpy(beams)].clone()
        top_seq[0, :, self.cur] = torch.from_numpy(tokens) + 1
        ids = torch.arange(k)[None, :, None]
        hits = torch.from_numpy(np.isin(tokens, self.eos) | (self.cur + 1 >= self.limit))[None]
        mask = torch.cat([torch.ones(nb, dtype=torch.bool), torch.zeros(k - nb, dtype=torch.bool)])
        self.running, running_scores, picked = gm._get_running_beams_for_next_iteration(gm, top_lp, top_seq, ids, hits,
                                                                                         nb)
        self.sequences, self.scores, _, self.finished = gm._update_finished_beams(
            gm, self.sequences, top_seq, self.scores, top_lp, torch.zeros((1, nb, 1), dtype=torch.long), ids,
            self.unsatisfied, self.finished, hits, mask, nb, self.cur, 0, self.p.length_penalty, self.p.early_stopping)
        self.cur += 1
        self.unsatisfied = gm._check_early_stop_heuristic(self.unsatisfied, running_scores, self.scores, self.finished,
                                                          self.cur, self.limit, 0, self.p.early_stopping,
                                                          self.p.length_penalty)
        going = gm._beam_search_has_unfinished_sequences(self.unsatisfied, self.finished, hits, self.p.early_stopping)
        return picked[0, :, 0].numpy(), running_scores[0].numpy(), not bool(going)

    def hypothesis(self, slot: int) -> tuple[int, ...]:
        row = self.sequences[0, slot].numpy()
        return tuple((row[row > 0] - 1).tolist())


def _check_finished(group: BeamGroup, ref: _Transformers) -> None:
    np.testing.assert_array_equal(group.finished_flags, ref.finished[0].numpy())
    np.testing.assert_allclose(group.finished_scores, ref.scores[0].numpy(), rtol=1e-6)
    for slot in np.flatnonzero(group.finished_flags):
        hyp = group.hypotheses[group.finished_refs[slot]]
        assert hyp.output_ids == ref.hypothesis(slot)
        if hyp.score > -1e8:  # no "never" penalty: score = sum logprob / length ** length_penalty
            want = hyp.cumulative_logprob / len(hyp.output_ids) ** group.params.length_penalty
            assert hyp.score == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("seed", range(6))
def test_batched_choice_equals_transformers_one_search_at_a_time(seed):
    pytest.importorskip("transformers")
    rng = np.random.default_rng(seed)
    live: list[tuple[BeamGroup, _Transformers, list[tuple[int, ...]]]] = []
    waiting = [_group(rng) for _ in range(14)]
    ended = 0
    for _ in range(60):
        while waiting and (not live or rng.random() < 0.4):  # searches join at different steps
            g = waiting.pop()
            live.append((g, _Transformers(g), [()]))
        if not live:
            break
        order = rng.permutation(len(live))  # the step's order of searches is any
        step = [live[i] for i in order]
        groups = [g for g, _, _ in step]
        sizes = np.array([len(g.running_scores) for g in groups], dtype=np.int64)
        starts = np.cumsum(sizes) - sizes
        logprobs = torch.log_softmax(torch.from_numpy(rng.standard_normal((int(sizes.sum()), VOCAB)) * 2.5).float(),
                                     dim=-1)
        blocks = beam_candidates(logprobs, starts, sizes, groups)
        assert sorted(int(r) for b in blocks for r in b.rows) == list(range(len(step)))
        kept = []
        for block in blocks:
            before = [step[i][2] for i in block.rows.tolist()]
            choices = choose(groups, block, lambda g, b, step=step: step[g][2][b])
            for i, s in enumerate(block.rows.tolist()):
                group, ref, _ = step[s]
                picked, running, done = ref.step(block.scores[i], block.beams[i], block.tokens[i])
                assert bool(choices.done[i]) == done
                _check_finished(group, ref)
                if done:
                    ended += 1
                    want = [(ref.hypothesis(j), float(ref.scores[0, j]))
                            for j in range(group.params.beams_returned) if ref.finished[0, j]]
                    got = [(h.output_ids, h.score) for h in group.results()]
                    assert [ids for ids, _ in got] == [ids for ids, _ in want]
                    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)
                    continue
                np.testing.assert_array_equal(choices.parents[i], block.beams[i][picked])
                np.testing.assert_array_equal(choices.tokens[i], block.tokens[i][picked])
                np.testing.assert_array_equal(choices.scores[i], running)
                outs = [(*before[i][p], t) for p, t in zip(choices.parents[i].tolist(), choices.tokens[i].tolist())]
                kept.append((group, ref, outs))
        live = kept
    assert ended >= 10, "most searches ran to their end"


def test_candidates_of_mixed_shapes_equal_a_top_k_per_search():
    rng = np.random.default_rng(1)
    groups = [_group(rng) for _ in range(9)]
    for g in groups[::2]:  # some searches past their first step (num_beams running beams), some at it (one)
        g.running_scores = -np.sort(rng.random(g.num_beams).astype(np.float32) * 5)
    sizes = np.array([len(g.running_scores) for g in groups], dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    logprobs = torch.log_softmax(torch.randn(int(sizes.sum()), VOCAB, generator=torch.Generator().manual_seed(0)), -1)
    blocks = beam_candidates(logprobs, starts, sizes, groups)
    assert len(blocks) < len(groups), "searches of one shape share a block"
    seen = set()
    for block in blocks:
        for i, s in enumerate(block.rows.tolist()):
            g = groups[s]
            acc = logprobs[starts[s]: starts[s] + sizes[s]] + torch.from_numpy(g.running_scores)[:, None]
            values, indices = torch.topk(acc.reshape(-1), g.num_candidates)
            np.testing.assert_array_equal(block.scores[i], values.numpy())
            np.testing.assert_array_equal(block.beams[i], indices.numpy() // VOCAB)
            np.testing.assert_array_equal(block.tokens[i], indices.numpy() % VOCAB)
            assert block.scores.shape[1] == g.num_candidates
            seen.add(s)
    assert seen == set(range(len(groups)))


def _moves_one_by_one(parents: list[int], size: int) -> tuple[list[tuple[str, int]], list[int]]:
    """The per-search loop `beam_moves` replaces: each new beam as ("parent", p) / ("refork", dropped beam) /
    ("fork", k-th fork), and the released beams; a parent's first child is the parent, each further child (parent
    by parent, in order of their first child) takes the last dropped beam left, else is a fork."""
    children: dict[int, list[int]] = {}
    for j, p in enumerate(parents):
        children.setdefault(p, []).append(j)
    dropped = [b for b in range(size) if b not in children]
    new: list[tuple[str, int]] = [("", 0)] * len(parents)
    forks = 0
    for p, js in children.items():
        for j in js[1:]:
            if dropped:
                new[j] = ("refork", dropped.pop())
            else:
                new[j], forks = ("fork", forks), forks + 1
        new[js[0]] = ("parent", p)
    return new, dropped


def test_beam_moves_equal_the_per_search_loop():
    rng = np.random.default_rng(2)
    for _ in range(300):
        nb = int(rng.integers(1, 7))
        count = int(rng.integers(1, 6))
        sizes = np.where(rng.random(count) < 0.3, 1, nb).astype(np.int64)  # first steps hold one beam
        parents = np.stack([rng.integers(0, s, size=nb) for s in sizes.tolist()]).astype(np.int64)
        tokens = rng.integers(0, 100, size=(count, nb)).astype(np.int64)
        moves = beam_moves(BeamChoices(np.arange(count), parents, tokens, np.zeros((count, nb), np.float32),
                                       np.zeros(count, dtype=np.bool_)), sizes)
        for i in range(count):
            size = int(sizes[i])
            want, released = _moves_one_by_one(parents[i].tolist(), size)
            ops, dropped = moves.ops[i], moves.dropped[i]
            assert dropped[len(ops):] == released
            got: list[tuple[str, int]] = []
            for j, src in enumerate(moves.sources[i]):
                if j not in ops:
                    assert src == parents[i, j]
                    got.append(("parent", src))
                else:
                    k = ops.index(j)
                    assert src == (dropped[k] if k < len(dropped) else size + k - len(dropped))
                    got.append(("refork", dropped[k]) if k < len(dropped) else ("fork", k - len(dropped)))
            assert got == want
            assert moves.tokens[i] == tokens[i].tolist() and moves.parents[i] == parents[i].tolist()


def test_eos_bans_equal_the_per_search_loop():
    rng = np.random.default_rng(3)
    for _ in range(100):
        groups = []
        for _ in range(int(rng.integers(1, 8))):
            eos = frozenset(rng.choice(50, size=int(rng.integers(0, 4)), replace=False).tolist())
            g = BeamGroup(SamplingParams(temperature=0, num_beams=3, min_new_tokens=int(rng.integers(0, 4)),
                                         max_new_tokens=8), 8, eos)
            g.generated = int(rng.integers(0, 4))
            groups.append(g)
        sizes = rng.integers(1, 4, size=len(groups)).astype(np.int64)
        starts = np.cumsum(sizes) - sizes
        want = set()
        for g, start, size in zip(groups, starts.tolist(), sizes.tolist()):
            if g.generated < g.params.min_new_tokens:
                want |= {(start + b, t) for b in range(size) for t in g.eos_ids}
        rows, cols = eos_bans(groups, starts, sizes)
        assert len(rows) == len(want) and set(zip(rows.tolist(), cols.tolist())) == want


def test_results_are_the_flagged_slots_best_first():
    g = BeamGroup(SamplingParams(temperature=0, num_beams=3, num_return_sequences=3, max_new_tokens=4), 4,
                  frozenset())
    g.hypotheses = [BeamHypothesis((1,), -1.0, -1.0), BeamHypothesis((2,), -2.0, -2.0)]
    g.finished_refs = np.array([1, 0, 0], dtype=np.int64)
    g.finished_flags = np.array([True, True, False])
    assert [h.output_ids for h in g.results()] == [(2,), (1,)]
