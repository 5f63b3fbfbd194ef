"""The sampler on CUDA: the counter hash is bit-identical to the CPU's, seeded rows are batch-independent,
the Triton grammar mask is honoured, and greedy / seeded draws agree with the CPU on the same logits."""

from __future__ import annotations

import pytest
import torch

from radixgen.runtime.counter_rng import row_keys, token_keys, uniform
from radixgen.runtime.sampler import Sampler
from radixgen.runtime.sampling_batch import SamplingBatch
from radixgen.runtime.sampling_params import SamplingParams as SP

pytestmark = pytest.mark.gpu
V = 1000


def test_counter_noise_is_identical_on_cpu_and_cuda():
    lo = torch.arange(-5, 11, dtype=torch.int32)
    hi = torch.arange(16, dtype=torch.int32) * 7919
    step = torch.arange(16, dtype=torch.int64) * 3
    cpu = uniform(row_keys(lo, hi, step), token_keys(V, "cpu"))
    gpu = uniform(row_keys(lo.cuda(), hi.cuda(), step.cuda()), token_keys(V, "cuda"))
    assert torch.equal(cpu, gpu.cpu())


def _draw(params, logits, device, steps, grammar=None, seed=0):
    sampler = Sampler(V, device, seed=seed)
    batch = SamplingBatch.build(params, V, device, eos_token_ids=[2])
    out = []
    for _ in range(steps):
        mask = None if grammar is None else grammar.to(device)
        ids = sampler.sample(batch, logits.to(device), mask).next_token_ids
        batch.append(ids)
        out.append(ids.cpu())
    return torch.stack(out)


def test_seeded_and_greedy_rows_match_the_cpu_and_ignore_the_batch():
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(0)) * 4
    params = [SP(temperature=0), SP(seed=5, top_p=0.9), SP(seed=6, top_k=20, min_p=0.02), SP(seed=7)]
    cpu = _draw(params, logits, "cpu", 10)
    gpu = _draw(params, logits, "cuda", 10, seed=3)
    assert torch.equal(cpu, gpu)
    alone = _draw(params[2:3], logits[2:3], "cuda", 10, seed=9)
    assert torch.equal(alone[:, 0], gpu[:, 2])


def test_grammar_mask_on_cuda():
    g = torch.Generator().manual_seed(1)
    allowed = torch.rand(3, V, generator=g) < 0.05
    allowed[:, 0] = True
    words = (V + 31) // 32
    padded = torch.zeros(3, words * 32, dtype=torch.int64)
    padded[:, :V] = allowed.long()
    packed = (padded.view(3, words, 32) << torch.arange(32)).sum(-1)
    bitmask = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    logits = torch.randn(3, V, generator=g) * 4
    got = _draw([SP(temperature=0), SP(top_p=0.95), SP(seed=2)], logits, "cuda", 20, grammar=bitmask)
    for r in range(3):
        assert allowed[r, got[:, r]].all()


def test_building_a_batch_never_waits_for_the_device():
    # the engine rebuilds the sampling batch after a synchronous (jump-forward) step with the forward still
    # queued: a pageable host-to-device copy there waited for that forward, an idle bubble per such step
    params = [SP(temperature=0.7, top_k=40, top_p=0.9, seed=3), SP(logit_bias={5: 2.0}, min_new_tokens=2),
              SP(temperature=0.0, repetition_penalty=1.2, frequency_penalty=0.5)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        batch = SamplingBatch.build(params, V, "cuda", eos_token_ids=[2], prompt_ids=[[1, 2], [3], [4, 5, 6]],
                                    output_ids=[[7], [], [8, 9]])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert batch.temperatures.device.type == "cuda"
    assert batch.top_ks.tolist() == [40, V, V] and batch.output_lens.tolist() == [1, 0, 2]
    assert batch.logit_bias is not None and batch.logit_bias[1, 5].item() == 2.0
