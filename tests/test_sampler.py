"""Sampler and SamplingBatch on random logits over a fake vocabulary (CPU, no model).

Each parameter's effect is checked against a naive per-row oracle; seeded rows are checked for independence
from the batch around them; the draw distribution is checked with a chi-square test at fixed seeds.
"""

from __future__ import annotations

import pytest
import torch

import radixgen.runtime.sampler as sampler_mod
from radixgen.runtime.counter_rng import bits_to_unit, mix32, row_keys, split_seed, token_keys, uniform
from radixgen.runtime.logprobs import token_logprobs
from radixgen.runtime.sampler import Sampler
from radixgen.runtime.sampling_batch import SamplingBatch
from radixgen.runtime.sampling_params import SamplingParams as SP

V = 97  # not a multiple of 32: exercises the partial last bitmask word
EOS = 2


def rand_logits(b: int, seed: int = 0, v: int = V) -> torch.Tensor:
    return torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * 3


def build(params, **kw) -> SamplingBatch:
    return SamplingBatch.build(params, V, eos_token_ids=[EOS], **kw)


def draw(params, logits, steps=1, sampler=None, **kw):
    """Tokens of `steps` consecutive draws (appending each), [steps, B]."""
    sampler = sampler or Sampler(V, seed=1)
    batch = build(params, **kw)
    out = []
    for _ in range(steps):
        ids = sampler.sample(batch, logits).next_token_ids
        batch.append(ids)
        out.append(ids)
    return torch.stack(out)


# ---------------------------------------------------------------- each parameter's effect


@pytest.mark.parametrize("params", [
    SP(temperature=0.0),
    SP(temperature=0.0, seed=4),
    SP(temperature=1e-30),
    SP(top_k=1, temperature=1.5),
    SP(top_p=1e-6, temperature=1.0),
    SP(min_p=1.0, temperature=2.0),
    SP(top_k=1, top_p=0.5, min_p=0.2, temperature=0.3),
], ids=["temp0", "temp0-seeded", "temp-tiny", "topk1", "topp-tiny", "minp1", "combined"])
def test_degenerate_settings_are_greedy(params):
    logits = rand_logits(8)
    got = draw([params] * 8, logits, steps=3)
    assert torch.equal(got, logits.argmax(-1).expand(3, -1))


def test_greedy_rows_beside_sampled_rows():
    logits = rand_logits(6, seed=3)
    params = [SP(temperature=0), SP(temperature=1.0), SP(temperature=0), SP(top_p=0.8), SP(top_k=3), SP(temperature=0)]
    got = draw(params, logits, steps=5)
    for row in (0, 2, 5):
        assert (got[:, row] == logits[row].argmax()).all()


def _probs(logits_row: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits_row / temperature, -1)


@pytest.mark.parametrize("top_k, top_p, min_p, temperature", [
    (5, 1.0, 0.0, 1.0), (1 + V // 2, 1.0, 0.0, 3.0), (-1, 0.5, 0.0, 2.0), (0, 0.9, 0.0, 4.0),
    (-1, 1.0, 0.05, 2.0), (10, 0.7, 0.0, 3.0), (20, 0.95, 0.1, 5.0),
])
def test_truncation_keeps_draws_inside_the_oracle_set(top_k, top_p, min_p, temperature):
    logits = rand_logits(4, seed=11)
    params = [SP(top_k=top_k, top_p=top_p, min_p=min_p, temperature=temperature, seed=s) for s in range(4)]
    got = draw(params, logits, steps=60)
    for row in range(4):
        p = _probs(logits[row], temperature)
        order = p.argsort(descending=True)
        k = top_k if top_k > 0 else V
        keep = torch.zeros(V, dtype=torch.bool)
        kept_p = p[order[:k]] / p[order[:k]].sum()
        before = kept_p.cumsum(0) - kept_p  # oracle nucleus: mass before the token is below top_p
        keep[order[:k][before < top_p]] = True
        keep &= p >= min_p * p.max()
        assert keep[got[:, row]].all(), f"row {row} drew outside the allowed set"
        if keep.sum() > 2:
            assert got[:, row].unique().numel() > 1  # it does sample, not collapse to greedy


@pytest.mark.parametrize("candidates", [1, 4, 16, 64, 256])
def test_candidate_top_p_equals_the_full_sort(candidates):
    """The partial top-k shortcut keeps exactly what the full sort keeps, whether it covers or falls back."""
    g = torch.Generator().manual_seed(7)
    scales = torch.tensor([0.1, 0.5, 1.0, 3.0, 8.0, 20.0] * 4)[:, None]
    probs = torch.softmax(torch.randn(24, V, generator=g) * scales, -1)
    top_ks = torch.tensor([V, 5, 50, V, 96, 1] * 4)
    top_ps = torch.tensor([0.5] * 6 + [0.9] * 6 + [0.99] * 6 + [1.0] * 6)
    greedy = torch.zeros(24, dtype=torch.bool)
    expected = sampler_mod._top_k_top_p_sorted(probs, top_ks, top_ps)
    assert torch.equal(sampler_mod._top_k_top_p(probs, top_ks, top_ps, greedy, candidates), expected)


def _naive_process(params, logits, prompts, outputs):
    """Per-row, per-token loop oracle for logit bias and penalties."""
    out = logits.clone()
    for b, p in enumerate(params):
        for tok, bias in p.logit_bias.items():
            out[b, tok] += bias
        if p.repetition_penalty != 1.0:
            for tok in set(prompts[b]) | set(outputs[b]):
                x = out[b, tok]
                out[b, tok] = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
        for tok in set(outputs[b]):
            c = outputs[b].count(tok)
            out[b, tok] -= p.frequency_penalty * c + p.presence_penalty
    return out


def test_bias_and_penalties_match_a_naive_loop():
    params = [
        SP(frequency_penalty=0.5),
        SP(presence_penalty=-1.25),
        SP(repetition_penalty=1.3),
        SP(repetition_penalty=0.7, frequency_penalty=1.0, presence_penalty=0.5, logit_bias={3: 2.0, 40: -1.5}),
        SP(),
        SP(logit_bias={0: 10.0, 96: float("-inf")}),
    ]
    prompts = [[1, 5, 5, 9], [7], [3, 3, 60, 61], [8, 9], [10], []]
    outputs = [[5, 5, 5, 12], [7, 7, 8], [60, 4], [3, 40, 40, 11, 11, 11], [1], [2, 2]]
    logits = rand_logits(len(params), seed=5)
    # Incremental state (built from the prompt, then appending step by step) equals the rebuilt state.
    batch = build(params, prompt_ids=prompts)
    width = max(len(o) for o in outputs)
    for step in range(width):
        # Rows with shorter outputs repeat their last token; the oracle sees the same padded lists.
        batch.append(torch.tensor([o[min(step, len(o) - 1)] for o in outputs]))
    padded = [o + [o[-1]] * (width - len(o)) for o in outputs]
    rebuilt = build(params, prompt_ids=prompts, output_ids=padded)
    expected = _naive_process(params, logits, prompts, padded)
    for b in (batch, rebuilt):
        got = Sampler.process_logits(b, logits.clone())
        torch.testing.assert_close(got, expected)
        assert b.output_lens.tolist() == [width] * len(params)
    assert torch.equal(batch.output_counts, rebuilt.output_counts) and torch.equal(batch.seen, rebuilt.seen)


def test_logit_bias_steers_the_draw():
    logits = rand_logits(3, seed=8)
    params = [SP(logit_bias={17: 100.0}), SP(temperature=0, logit_bias={17: 100.0}),
              SP(temperature=0, logit_bias={int(logits[2].argmax()): float("-inf")})]
    got = draw(params, logits, steps=4)
    assert (got[:, :2] == 17).all()
    assert (got[:, 2] == logits[2].topk(2).indices[1]).all()  # the banned argmax gives way to the runner-up


def test_state_exists_only_when_needed():
    plain = build([SP(), SP(temperature=0)])
    assert plain.logit_bias is None and plain.output_counts is None and plain.seen is None
    assert plain.block_ids is None
    assert plain.all_greedy is False and not plain.needs_top_p and not plain.needs_top_k


# ---------------------------------------------------------------- grammar mask and min_new_tokens


def _bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """[B, V] bool -> [B, ceil(V/32)] int32 packed (bit v % 32 of word v // 32)."""
    B, Vv = allowed.shape
    words = (Vv + 31) // 32
    padded = torch.zeros(B, words * 32, dtype=torch.int64)
    padded[:, :Vv] = allowed.long()
    packed = (padded.view(B, words, 32) << torch.arange(32)).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


@pytest.mark.parametrize("rows", [None, [0, 2, 3]])
def test_grammar_mask_is_never_violated(rows):
    g = torch.Generator().manual_seed(0)
    allowed = torch.rand(4, V, generator=g) < 0.1
    allowed[:, 50] = True
    logits = rand_logits(4, seed=9)
    logits[:, 1] = 50.0  # the unconstrained favourite is disallowed everywhere
    allowed[:, 1] = False
    params = [SP(temperature=0), SP(temperature=1.0), SP(top_p=0.9, temperature=2.0), SP(top_k=3, seed=1)]
    sampler, batch = Sampler(V), build(params)
    constrained = list(range(4)) if rows is None else rows
    for _ in range(40):
        mask = _bitmask(allowed) if rows is None else _bitmask(allowed[rows])  # one mask row per grammar row
        ids = sampler.sample(batch, logits, mask, rows).next_token_ids
        batch.append(ids)
        for r in constrained:
            assert allowed[r, ids[r]], f"row {r} drew disallowed token {int(ids[r])}"
        if rows is not None:
            assert ids[1] == 1  # the unconstrained row keeps its favourite
    with pytest.raises(ValueError, match="bitmask_rows"):
        sampler.sample(batch, logits, _bitmask(allowed), [0, 2])
    masked_greedy = logits[0].masked_fill(~allowed[0], float("-inf")).argmax()
    greedy = sampler.sample(build([SP(temperature=0)]), logits[:1], _bitmask(allowed[:1]))
    assert greedy.next_token_ids[0] == masked_greedy


@pytest.mark.parametrize("params", [SP(temperature=0, min_new_tokens=3), SP(min_new_tokens=3, seed=2),
                                    SP(temperature=0, min_new_tokens=3, stop_token_ids=[7])])
def test_min_new_tokens_blocks_eos_and_stop_ids(params):
    logits = rand_logits(1, seed=4)
    logits[0, EOS] = 40.0
    logits[0, 7] = 39.0
    got = draw([params], logits, steps=5)[:, 0].tolist()
    blocked = {EOS, *params.stop_token_ids}
    assert not blocked & set(got[:3])
    assert got[3] == EOS  # from step 3 on EOS is allowed again


def test_min_new_tokens_respects_ignore_eos_and_yields_to_a_finished_grammar():
    logits = rand_logits(2, seed=4)
    logits[:, EOS] = 40.0
    # ignore_eos: EOS is not a stop token, so min_new_tokens does not block it.
    assert draw([SP(temperature=0, min_new_tokens=3, ignore_eos=True)], logits[:1])[0, 0] == EOS
    # A grammar that only allows EOS wins over min_new_tokens (otherwise no token would be possible).
    only_eos = torch.zeros(2, V, dtype=torch.bool)
    only_eos[:, EOS] = True
    only_eos[1, 30] = True
    batch = build([SP(temperature=0, min_new_tokens=5), SP(temperature=0, min_new_tokens=5)])
    ids = Sampler(V).sample(batch, logits, _bitmask(only_eos)).next_token_ids
    assert ids.tolist() == [EOS, 30]


# ---------------------------------------------------------------- seeds


@pytest.mark.parametrize("candidates", [256, 8])  # 8: the flat companions take the full-sort path
def test_seeded_rows_do_not_depend_on_the_batch(candidates):
    target = rand_logits(1, seed=21) * 2  # peaked: its nucleus lies within 8 candidates
    others = rand_logits(6, seed=22) / 20  # flat: their nucleus is wide
    seeded = SP(temperature=1.3, top_p=0.95, seed=1234)
    layouts = [
        ([seeded], target, 0),
        ([SP(temperature=0), seeded, SP(top_k=5)], torch.cat([others[:1], target, others[1:2]]), 1),
        ([SP(seed=7, top_p=0.9), SP(), SP(), SP(min_p=0.1), seeded], torch.cat([others[2:6], target]), 4),
    ]
    runs = []
    for i, (params, logits, pos) in enumerate(layouts):
        sampler = Sampler(V, seed=100 + i, top_p_candidates=candidates)
        runs.append(draw(params, logits, steps=12, sampler=sampler)[:, pos])
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])
    assert runs[0].unique().numel() > 1
    other_seed = draw([SP(temperature=1.3, top_p=0.95, seed=1235)], target, steps=12)[:, 0]
    assert not torch.equal(other_seed, runs[0])


def test_seeded_rows_resume_after_a_rebuild():
    """A preempted request rebuilt from its output ids continues the same token stream."""
    logits = rand_logits(1, seed=3)
    p = SP(seed=99, temperature=2.0)
    full = draw([p], logits, steps=8)[:, 0]
    resumed = draw([p], logits, steps=4, output_ids=[full[:4]])[:, 0]
    assert torch.equal(resumed, full[4:])


def test_unseeded_rows_follow_the_engine_generator():
    logits = rand_logits(4, seed=3) / 10  # flat: draws differ easily
    a = draw([SP()] * 4, logits, steps=6, sampler=Sampler(V, seed=5))
    b = draw([SP()] * 4, logits, steps=6, sampler=Sampler(V, seed=5))
    c = draw([SP()] * 4, logits, steps=6, sampler=Sampler(V, seed=6))
    assert torch.equal(a, b) and not torch.equal(a, c)


# ---------------------------------------------------------------- distribution


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "drew a token of probability 0"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


# 99.9% quantiles of chi-square with df = 7 and 3: 24.32, 16.27.
@pytest.mark.parametrize("kw, seeded", [
    ({}, False), ({}, True), ({"temperature": 0.5}, True), ({"temperature": 2.0}, False),
    ({"top_k": 4}, True), ({"top_p": 0.8}, False),
])
def test_draws_follow_the_distribution(kw, seeded):
    n, v = 20000, 8
    base = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    params = [SP(seed=i if seeded else None, **kw) for i in range(n)]
    batch = SamplingBatch.build(params, v)
    ids = Sampler(v, seed=11).sample(batch, base.expand(n, v)).next_token_ids
    probs = torch.softmax(base / kw.get("temperature", 1.0), -1)
    if "top_k" in kw:
        probs[kw["top_k"]:] = 0
    if "top_p" in kw:
        before = probs.cumsum(0) - probs
        probs[before >= kw["top_p"]] = 0
    probs /= probs.sum()
    df = int((probs > 0).sum()) - 1
    limit = {7: 24.32, 3: 16.27, 2: 13.82, 1: 10.83}[df]
    assert _chi_square(torch.bincount(ids, minlength=v).double(), probs.double()) < limit


def test_counter_noise_is_uniform_and_bit_exact():
    def lowbias32(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    xs = torch.randint(0, 2**32, (2000,), generator=torch.Generator().manual_seed(0), dtype=torch.int64)
    assert (mix32(xs.to(torch.int32)).long() & 0xFFFFFFFF).tolist() == [lowbias32(x) for x in xs.tolist()]
    assert split_seed(-1) == (-1, -1) and split_seed(2**32 + 5) == (5, 1)
    keys = row_keys(torch.arange(64, dtype=torch.int32), torch.zeros(64, dtype=torch.int32),
                    torch.zeros(64, dtype=torch.int64))
    u = uniform(keys, token_keys(1000, "cpu"))
    assert u.min() > 0 and u.max() < 1
    extremes = torch.tensor([0, -1, 2**31 - 1, -(2**31), 511, -512], dtype=torch.int32)
    unit = bits_to_unit(extremes)
    assert (unit > 0).all() and (unit < 1).all() and (-torch.log(unit) > 0).all()
    hist = torch.histc(u, bins=10, min=0, max=1)
    assert _chi_square(hist.double(), torch.full((10,), 0.1, dtype=torch.float64)) < 27.88  # df 9, 99.9%


# ---------------------------------------------------------------- logprobs


def test_logprobs_are_log_softmax_of_the_processed_logits():
    logits = rand_logits(3, seed=13)
    params = [SP(temperature=0.5, top_k=3), SP(frequency_penalty=1.0, temperature=0), SP(top_p=0.5)]
    batch = build(params, output_ids=[[1], [4, 4], []], return_logprob=[True, True, False],
                  top_logprobs_num=[2, 5, 9])
    allowed = torch.ones(3, V, dtype=torch.bool)
    allowed[:, 0] = False
    out = Sampler(V).sample(batch, logits, _bitmask(allowed))
    expected = torch.log_softmax(Sampler.process_logits(batch, logits.clone()), -1)
    torch.testing.assert_close(out.next_token_logprobs, expected.gather(1, out.next_token_ids[:, None])[:, 0])
    assert out.top_logprobs_values.shape == (3, 5)  # the largest request among the rows that asked
    torch.testing.assert_close(out.top_logprobs_values, expected.topk(5).values)
    assert torch.equal(out.top_logprobs_ids, expected.topk(5).indices)
    assert Sampler(V).sample(build(params), logits).next_token_logprobs is None


@pytest.mark.parametrize("chunk_rows", [1, 7, 256])
def test_prompt_token_logprobs(chunk_rows):
    logits = rand_logits(20, seed=2).to(torch.bfloat16)
    next_ids = torch.randint(0, V, (20,), generator=torch.Generator().manual_seed(1))
    got = token_logprobs(logits, next_ids, top_k=4, chunk_rows=chunk_rows)
    lp = torch.log_softmax(logits.float(), -1)
    torch.testing.assert_close(got.logprobs, lp.gather(1, next_ids[:, None])[:, 0])
    torch.testing.assert_close(got.top_values, lp.topk(4).values)
    assert token_logprobs(logits, next_ids).top_values is None
    with pytest.raises(ValueError):
        token_logprobs(logits, next_ids[:3])


# ---------------------------------------------------------------- batch bookkeeping


def test_filter_and_concat_keep_rows_aligned():
    params_a = [SP(frequency_penalty=1.0, min_new_tokens=2), SP(seed=3), SP(repetition_penalty=1.2)]
    params_b = [SP(logit_bias={5: 1.0}), SP(temperature=0)]
    a = build(params_a, prompt_ids=[[1], [2], [3]], output_ids=[[4, 4], [5], [6]])
    b = build(params_b)
    merged = SamplingBatch.concat([a.filter([2, 0]), b])
    assert [p for p in merged.params] == [params_a[2], params_a[0], *params_b]
    assert merged.output_lens.tolist() == [1, 2, 0, 0]
    assert merged.output_counts[1, 4] == 2 and merged.output_counts[2:].sum() == 0
    assert merged.seen[0, 3] and merged.seen[0, 6] and not merged.seen[2:].any()
    assert merged.logit_bias[2, 5] == 1.0 and merged.logit_bias[:2].abs().sum() == 0
    assert merged.has_block_ids.tolist() == [True, True, False, False]
    assert merged.block_ids.shape == (4, 1) and merged.block_ids[1, 0] == EOS
    logits = rand_logits(4)
    direct = build([params_a[2], params_a[0], *params_b], prompt_ids=[[3], [1], [], []],
                   output_ids=[[6], [4, 4], [], []])
    torch.testing.assert_close(Sampler.process_logits(merged, logits.clone()),
                               Sampler.process_logits(direct, logits.clone()))
    lean = merged.filter([3])
    assert lean.output_counts is None and lean.seen is None and lean.logit_bias is None and lean.block_ids is None


def test_logits_shape_is_checked():
    with pytest.raises(ValueError, match="logits"):
        Sampler(V).sample(build([SP()]), torch.zeros(2, V))


def test_every_feature_at_once_on_a_real_sized_vocab():
    """All stages together at a SmolLM2-sized vocabulary: valid, allowed tokens; seeded rows reproducible."""
    v = 49152
    params = [SP(top_p=0.9, top_k=50, min_p=0.05, frequency_penalty=0.5, repetition_penalty=1.1, seed=i,
                 logit_bias={1: 1.0}, min_new_tokens=120) for i in range(8)]
    outs = [list(range(i, i + 100)) for i in range(8)]
    logits = torch.randn(8, v, generator=torch.Generator().manual_seed(0))
    logits[:, 2] = 30.0  # EOS would win, but min_new_tokens blocks it
    a = Sampler(v, seed=1).sample(SamplingBatch.build(params, v, eos_token_ids=[2], output_ids=outs), logits)
    b = Sampler(v, seed=2).sample(SamplingBatch.build(params, v, eos_token_ids=[2], output_ids=outs), logits)
    assert torch.equal(a.next_token_ids, b.next_token_ids)
    assert ((a.next_token_ids >= 0) & (a.next_token_ids < v) & (a.next_token_ids != 2)).all()
