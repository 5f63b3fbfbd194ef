"""The batched torch attention (the engine's CPU path) equals the per-request reference loops."""

from __future__ import annotations

import pytest
import torch

from radixgen.kernels import attention_torch, cpu_features, decode_copy_torch
from radixgen.kernels.attention_ref import decode_attention_reference, extend_attention_reference
from radixgen.kernels.attention_torch import decode_attention_torch, extend_attention_torch, plan_extend

CASES = [
    # (prefix_lens, extend_lens, q heads, kv heads, head dim, sliding window)
    ([0, 5, 17, 3, 30], [7, 1, 4, 1, 20], 9, 3, 64, None),
    ([0, 5, 17, 3, 30], [7, 1, 4, 1, 20], 9, 3, 64, 4),
    ([12], [1], 8, 8, 32, None),
    ([0, 0], [33, 2], 4, 1, 16, None),
    ([40, 0, 9], [0, 6, 1], 6, 2, 32, 8),  # a zero-length extend row
]


def _setup(prefix, ext, hq, hkv, d, seed):
    g = torch.Generator().manual_seed(seed)
    slots_total = sum(p + e for p, e in zip(prefix, ext)) + 8
    kc, vc = torch.randn(slots_total, hkv, d, generator=g), torch.randn(slots_total, hkv, d, generator=g)
    b = len(prefix)
    r2t = torch.zeros(b + 3, 128, dtype=torch.int32)
    perm = torch.randperm(slots_total - 1, generator=g) + 1
    k = 0
    for i in range(b):
        n = prefix[i] + ext[i]
        r2t[i + 2, :n] = perm[k : k + n]
        k += n
    pre, ex = torch.tensor(prefix, dtype=torch.int32), torch.tensor(ext, dtype=torch.int32)
    start = torch.zeros(b, dtype=torch.int32)
    start[1:] = torch.cumsum(ex, 0)[:-1]
    return kc, vc, r2t, torch.arange(2, b + 2), pre, ex, start, g


@pytest.mark.parametrize("prefix,ext,hq,hkv,d,window", CASES)
def test_batched_torch_attention_equals_reference(prefix, ext, hq, hkv, d, window):
    kc, vc, r2t, rpi, pre, ex, start, g = _setup(prefix, ext, hq, hkv, d, seed=len(prefix) * 7 + d)
    q = torch.randn(int(ex.sum()), hq, d, generator=g)
    scale = d ** -0.5
    want = extend_attention_reference(q, kc, vc, r2t, rpi, pre, ex, start, scale, window)
    got = extend_attention_torch(q, kc, vc, r2t, rpi, pre, ex, start, scale, window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    seq = pre + torch.clamp(ex, min=1)
    qd = torch.randn(len(prefix), hq, d, generator=g)
    want = decode_attention_reference(qd, kc, vc, r2t, rpi, seq, scale, window)
    got = decode_attention_torch(qd, kc, vc, r2t, rpi, seq, scale, window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prefix,ext,hq,hkv,d,window", CASES)
def test_bf16_cache_attends_in_fp32(prefix, ext, hq, hkv, d, window):
    """bf16 q/K/V (the CPU path with dtype="bfloat16") give the fp32 reference's output on the same bf16 values, to
    bf16 precision: scores and softmax accumulate in fp32, as in the Triton kernels."""
    kc, vc, r2t, rpi, pre, ex, start, g = _setup(prefix, ext, hq, hkv, d, seed=len(prefix) * 5 + d)
    kc, vc = kc.bfloat16(), vc.bfloat16()
    q = torch.randn(int(ex.sum()), hq, d, generator=g).bfloat16()
    scale = d ** -0.5
    want = extend_attention_reference(q.float(), kc.float(), vc.float(), r2t, rpi, pre, ex, start, scale, window)
    got = extend_attention_torch(q, kc, vc, r2t, rpi, pre, ex, start, scale, window)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    seq = pre + torch.clamp(ex, min=1)
    qd = torch.randn(len(prefix), hq, d, generator=g).bfloat16()
    want = decode_attention_reference(qd.float(), kc.float(), vc.float(), r2t, rpi, seq, scale, window)
    got = decode_attention_torch(qd, kc, vc, r2t, rpi, seq, scale, window)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype,ext,matmuls", [
    (torch.float32, None, True),  # a decode step in fp32: two batched matmuls
    (torch.bfloat16, None, False),  # bf16 keeps the fused kernel's fp32 scores
    (torch.float32, [1, 1, 1, 1, 1], True),  # an extend of one token per request is a decode step's shape
    (torch.float32, [7, 2, 4, 3, 20], False),  # an extend of several tokens per request: the fused kernel
])
@pytest.mark.parametrize("preferred", [True, False])  # an AMD CPU, or another
def test_decode_rows_take_the_matmul_path_in_fp32(dtype, ext, matmuls, preferred, monkeypatch):
    monkeypatch.setattr(cpu_features, "decode_attention_as_matmuls", lambda: preferred)
    matmuls = matmuls and preferred
    prefix, ext0, hq, hkv, d, window = CASES[1]
    kc, vc, r2t, rpi, pre, ex, start, g = _setup(prefix, ext or ext0, hq, hkv, d, seed=3)
    calls = []
    real = attention_torch._few_rows_attention
    monkeypatch.setattr(attention_torch, "_few_rows_attention", lambda *a: calls.append(1) or real(*a))
    kc, vc = kc.to(dtype), vc.to(dtype)
    scale = d ** -0.5
    if ext is None:
        qd = torch.randn(len(prefix), hq, d, generator=g).to(dtype)
        seq = pre + torch.clamp(ex, min=1)
        got = decode_attention_torch(qd, kc, vc, r2t, rpi, seq, scale, window)
        want = decode_attention_reference(qd.float(), kc.float(), vc.float(), r2t, rpi, seq, scale, window)
    else:
        q = torch.randn(int(ex.sum()), hq, d, generator=g).to(dtype)
        got = extend_attention_torch(q, kc, vc, r2t, rpi, pre, ex, start, scale, window)
        want = extend_attention_reference(q.float(), kc.float(), vc.float(), r2t, rpi, pre, ex, start, scale, window)
    assert bool(calls) == matmuls
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("kv_len", [[5, 0, 9], [0], [1, 12, 3]])
@pytest.mark.parametrize("boolean", [True, False])
def test_few_rows_attention_equals_the_fused_kernel(kv_len, boolean):
    """The matmul decode path gives what torch's fused kernel gives, rows that see no key included (zeros: a
    padding row's output is written back to the reserved slot as K/V, so a NaN there would spread)."""
    g = torch.Generator().manual_seed(len(kv_len))
    b, hkv, rows_per_head, length, d = len(kv_len), 2, 3, 12, 16
    rows = torch.randn(b, hkv, rows_per_head, d, generator=g)
    k, v = torch.randn(b, hkv, length, d, generator=g), torch.randn(b, hkv, length, d, generator=g)
    seen = torch.tensor(kv_len)
    mask = (torch.arange(length)[None, :] < seen[:, None])[:, None, None, :].expand(b, 1, rows_per_head, length)
    mask = mask if boolean else attention_torch._additive(mask, torch.float32)
    want = torch.nn.functional.scaled_dot_product_attention(rows, k, v, attn_mask=mask, scale=0.25)
    got = attention_torch._few_rows_attention(rows, k, v, mask, 0.25, seen)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", [1, 3, 8])
@pytest.mark.parametrize("prefix,ext,hq,hkv,d,window", CASES)
def test_query_blocks_give_the_reference(prefix, ext, hq, hkv, d, window, block, monkeypatch):
    """A long extend attends block by block over the keys each block can see: the same output."""
    monkeypatch.setattr(attention_torch, "QUERY_BLOCK", block)
    kc, vc, r2t, rpi, pre, ex, start, g = _setup(prefix, ext, hq, hkv, d, seed=len(prefix) * 3 + d)
    q = torch.randn(int(ex.sum()), hq, d, generator=g)
    want = extend_attention_reference(q, kc, vc, r2t, rpi, pre, ex, start, d ** -0.5, window)
    got = extend_attention_torch(q, kc, vc, r2t, rpi, pre, ex, start, d ** -0.5, window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.fixture
def cascade_calls(monkeypatch) -> list[int]:
    """The shared-prefix lengths the cascade path is called with (threshold lowered to 4 for small cases)."""
    if not attention_torch._flash_lse_available():
        pytest.skip("torch's CPU flash attention with log-sum-exp is not available")
    monkeypatch.setattr(attention_torch, "SHARED_PREFIX_MIN", 4)
    taken: list[int] = []
    cascade = attention_torch._cascade_attention
    monkeypatch.setattr(attention_torch, "_cascade_attention", lambda *a: taken.append(a[7]) or cascade(*a))
    return taken


def _shared_pool(shared: int, own: list[int], hkv: int, d: int, dtype: torch.dtype, g: torch.Generator):
    """A K/V pool and request rows 1..B whose first `shared` slots are the same and whose next own[i] differ."""
    total = shared + sum(own) + 4
    kc = torch.randn(total, hkv, d, generator=g).to(dtype)
    vc = torch.randn(total, hkv, d, generator=g).to(dtype)
    perm = torch.randperm(total - 1, generator=g) + 1
    r2t = torch.zeros(len(own) + 1, 128, dtype=torch.int32)
    nxt = shared
    for i, n in enumerate(own):
        r2t[i + 1, :shared] = perm[:shared]
        r2t[i + 1, shared : shared + n] = perm[nxt : nxt + n]
        nxt += n
    return kc, vc, r2t, torch.arange(1, len(own) + 1)


SHARED_CASES = [
    # (shared prefix, own lengths after it, q heads, kv heads, head dim, dtype)
    (40, [1, 5, 17, 3], 9, 3, 64, torch.float32),
    (7, [2, 2], 4, 4, 32, torch.float32),
    (70, [1, 30, 9], 8, 2, 16, torch.bfloat16),
]


@pytest.mark.parametrize("shared,own,hq,hkv,d,dtype", SHARED_CASES)
def test_decode_rows_sharing_a_prefix_read_it_once(shared, own, hq, hkv, d, dtype, cascade_calls):
    """Rows whose first slots are the same take the cascade path (shared keys once, own keys, merged by
    log-sum-exp) and give the reference's output; a row whose context is only the shared prefix plus its own
    last token is included."""
    g = torch.Generator().manual_seed(shared + sum(own))
    kc, vc, r2t, rpi = _shared_pool(shared, own, hkv, d, dtype, g)
    seq = torch.tensor([shared + n for n in own], dtype=torch.int32)
    q = torch.randn(len(own), hq, d, generator=g).to(dtype)
    want = decode_attention_reference(q.float(), kc.float(), vc.float(), r2t, rpi, seq, d ** -0.5)
    got = decode_attention_torch(q, kc, vc, r2t, rpi, seq, d ** -0.5, max_seq_len=int(seq.max()) + 3)
    assert cascade_calls == [shared] and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


EXTEND_SHARED_CASES = [
    # (shared cached prefix, own cached tokens after it, extend lengths, q heads, kv heads, head dim, dtype)
    (30, [0, 4, 9], [5, 2, 12], 9, 3, 64, torch.float32),
    (12, [3, 0], [7, 7], 4, 1, 16, torch.float32),
    (40, [0, 2, 1], [6, 3, 2], 8, 2, 32, torch.bfloat16),
]


@pytest.mark.parametrize("shared,cached,ext,hq,hkv,d,dtype", EXTEND_SHARED_CASES)
def test_extends_over_a_shared_cached_prefix_read_it_once(shared, cached, ext, hq, hkv, d, dtype, cascade_calls):
    g = torch.Generator().manual_seed(shared + sum(ext))
    kc, vc, r2t, rpi = _shared_pool(shared, [c + n for c, n in zip(cached, ext)], hkv, d, dtype, g)
    pre = torch.tensor([shared + c for c in cached], dtype=torch.int32)
    ex = torch.tensor(ext, dtype=torch.int32)
    start = torch.zeros(len(ext), dtype=torch.int32)
    start[1:] = torch.cumsum(ex, 0)[:-1]
    q = torch.randn(int(ex.sum()), hq, d, generator=g).to(dtype)
    want = extend_attention_reference(q.float(), kc.float(), vc.float(), r2t, rpi, pre, ex, start, d ** -0.5)
    got = extend_attention_torch(q, kc, vc, r2t, rpi, pre, ex, start, d ** -0.5)
    assert shared in cascade_calls and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    # two layers of one forward: both read one plan and its own-keys mask
    plan = plan_extend(r2t, rpi, pre, ex, start, q.shape[0], hq // hkv, dtype, None)
    for layer in range(2):
        if layer:
            kc, vc = torch.randn(kc.shape, generator=g).to(dtype), torch.randn(vc.shape, generator=g).to(dtype)
            want = extend_attention_reference(q.float(), kc.float(), vc.float(), r2t, rpi, pre, ex, start, d ** -0.5)
        got = extend_attention_torch(q, kc, vc, r2t, rpi, pre, ex, start, d ** -0.5, plan=plan)
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    assert plan.padded is not None and plan.padded.cascade_mask is not None


COPY_CASES = [
    # (context lengths at the first decode step, q heads, kv heads, head dim, sliding window, shared prefix)
    ([6, 17, 3], 9, 3, 64, None, 0),
    ([12], 8, 8, 32, None, 0),
    ([9, 30, 4, 11], 6, 2, 32, 5, 0),
    ([20, 26], 4, 1, 16, None, 8),  # the first 8 slots are the same for both rows (cascade over the copies)
]
# Where the requests' rows sit in the buffers: in batch order, or scattered among rows no request holds (which
# the attention must mask); at step 2 the last request's row is refilled from 3 positions before its newest on
# (its earlier columns kept, as when a newcomer finds its prefix in a left request's row).
LAYOUTS = ["in order", "scattered with holes"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("lens,hq,hkv,d,window,shared", COPY_CASES)
def test_decode_over_carried_copies_equals_the_reference_step_after_step(lens, hq, hkv, d, window, shared, layout):
    """Copies filled at the first step and appended one position per request at each later step (the new key's
    slot anywhere in the pool), one of them refilled midway, give the reference output at every step; a shared
    prefix is read from the pool, not the copies."""
    if shared and not attention_torch._flash_lse_available():
        pytest.skip("torch's CPU flash attention with log-sum-exp is not available")
    steps, b = 4, len(lens)
    g = torch.Generator().manual_seed(sum(lens) + d)
    kc, vc, r2t, rpi = _shared_pool(shared, [n - shared for n in lens], hkv, d, torch.float32, g)
    extra = b * steps
    kc = torch.cat([kc, torch.randn(extra, hkv, d, generator=g)])
    vc = torch.cat([vc, torch.randn(extra, hkv, d, generator=g)])
    free = torch.randperm(extra, generator=g) + (kc.shape[0] - extra)
    rows = torch.arange(b) if layout == "in order" else torch.randperm(2 * b + 1, generator=g)[:b]
    num_rows = int(rows.max()) + 1
    capacity = max(lens) + steps - shared
    bufs = [torch.randn(num_rows, hkv, capacity, d, generator=g) for _ in range(2)]  # stale but finite
    seq = torch.tensor(lens, dtype=torch.int32)
    for step in range(steps):
        if step:  # each request's next token gets a fresh slot
            r2t[rpi, seq.long()] = free[step * b : (step + 1) * b].int()
            seq = seq + 1
        if step == 0:
            fill, start = torch.arange(b), torch.full((b,), shared)
        elif step == 2:
            fill, start = torch.tensor([b - 1]), (seq[-1:] - 3).long().clamp(min=shared)
            for buf in bufs:  # stale columns the fill must replace
                buf[rows[-1], :, int(start) - shared :] = torch.randn(hkv, capacity - int(start) + shared, d)
        else:
            fill, start = torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        placement = decode_copy_torch.CopyPlacement(rows=rows, fill=fill, fill_from=start, num_rows=num_rows,
                                                    shared=shared, in_order=layout == "in order")
        q = torch.randn(b, hq, d, generator=g)
        want = decode_attention_reference(q, kc, vc, r2t, rpi, seq, d ** -0.5, window)
        got = _decode_from_copy(q, kc, vc, r2t, rpi, seq, bufs, placement, window)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _decode_from_copy(q, kc, vc, r2t, rpi, seq, bufs, placement, window):
    """One layer's decode over its copy buffers, planned for this call alone."""
    step = decode_copy_torch.plan_copy_step(r2t, rpi, seq, placement)
    mask = decode_copy_torch.copy_step_mask(step, q.shape[1] // kc.shape[1], q.dtype, window)
    return decode_copy_torch.decode_attention_from_copy(q, kc, vc, *bufs, step, mask, q.shape[2] ** -0.5)


@pytest.mark.parametrize("window", [None, 3])
def test_layers_of_one_forward_share_the_copy_indices(window):
    """The layers of one forward read one CopyStep and mask: the second layer's copy update and attention over
    its own pool and buffers use the index tensors planned once, and both give the reference."""
    g = torch.Generator().manual_seed(5)
    lens, hq, hkv, d = [7, 12, 4], 6, 2, 16
    pools = [_shared_pool(0, lens, hkv, d, torch.float32, g) for _ in range(2)]
    r2t, rpi = pools[0][2], pools[0][3]  # the same table for both layers; each layer its own K/V
    seq = torch.tensor(lens, dtype=torch.int32)
    placement = decode_copy_torch.CopyPlacement(rows=torch.tensor([2, 0, 3]), fill=torch.arange(3),
                                                fill_from=torch.zeros(3).long(), num_rows=4)
    step = decode_copy_torch.plan_copy_step(r2t, rpi, seq, placement)
    mask = decode_copy_torch.copy_step_mask(step, hq // hkv, torch.float32, window)
    for kc, vc, *_ in pools:
        bufs = [torch.zeros(4, hkv, 16, d) for _ in range(2)]
        q = torch.randn(3, hq, d, generator=g)
        want = decode_attention_reference(q, kc, vc, r2t, rpi, seq, d ** -0.5, window)
        got = decode_copy_torch.decode_attention_from_copy(q, kc, vc, *bufs, step, mask, d ** -0.5)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("budget", [attention_torch.MASK_CACHE_BYTES, 0])  # masks kept / made by every layer
@pytest.mark.parametrize("prefix,ext,hq,hkv,d,window", CASES)
def test_layers_of_one_forward_share_the_extend_plan(prefix, ext, hq, hkv, d, window, budget, monkeypatch):
    """One plan of an extend (index tensors and masks) serves every layer of the forward (each its own q and K/V,
    the same table): both give the reference, and none works the plan out again."""
    monkeypatch.setattr(attention_torch, "MASK_CACHE_BYTES", budget)
    kc, vc, r2t, rpi, pre, ex, start, g = _setup(prefix, ext, hq, hkv, d, seed=11)
    plan = plan_extend(r2t, rpi, pre, ex, start, int(ex.sum()), hq // hkv, torch.float32, window)
    plans = []
    monkeypatch.setattr(attention_torch, "plan_extend", lambda *a: plans.append(1) or plan_extend(*a))
    for layer in range(2):
        if layer:
            kc, vc = torch.randn(kc.shape, generator=g), torch.randn(vc.shape, generator=g)
        q = torch.randn(int(ex.sum()), hq, d, generator=g)
        want = extend_attention_reference(q, kc, vc, r2t, rpi, pre, ex, start, d ** -0.5, window)
        got = extend_attention_torch(q, kc, vc, r2t, rpi, pre, ex, start, d ** -0.5, window, plan=plan)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert plans == []
    masks = [block.mask for block in plan.padded.blocks] if plan.padded is not None else []
    assert all(m is None for m in masks) if budget == 0 else all(m is not None for m in masks)
