"""Correctness checks: each Triton kernel against its torch reference twin on fresh random inputs.

One table of cases per size ("small" runs in seconds under TRITON_INTERPRET=1 on a CPU; "real" is for the GPU),
one runner per op. A runner builds random inputs (never zeros), runs the kernel, and compares it with the
reference evaluated on fp32 copies of the same inputs: attention, norms, rotary and the activation by relative
error ||out - ref|| / ||ref|| (NaN never passes), the KV store and the bitmask exactly. On CUDA the allocator's
free memory is poisoned with NaN first, so an output element the kernel never writes cannot pass.

    python -m radixgen.kernels.verify --size real            # on a GPU
    TRITON_INTERPRET=1 python -m radixgen.kernels.verify     # on a CPU, small shapes
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

import torch

from radixgen.kernels import attention_ref, elementwise_ref
from radixgen.kernels.rotary_cache import rope_cos_sin_cache
from radixgen.kernels.verify_cases import Case, cases

# Relative-error tolerances by dtype (the device METHOD: bf16 1e-3..1e-2; fp32 dots run as tf32 on the GPU).
TOLERANCE = {torch.float32: 2e-3, torch.float16: 5e-3, torch.bfloat16: 1e-2}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Result:
    case_id: str
    error: float  # relative error, or the count of mismatching elements for exact checks
    tolerance: float
    seconds: float

    @property
    def ok(self) -> bool:
        return math.isfinite(self.error) and self.error <= self.tolerance


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (out.double() - ref.double()).norm().item()
    scale = ref.double().norm().item()
    err = diff / scale if scale > 0 else diff
    return err if out.isfinite().all().item() or not ref.isfinite().all().item() else math.inf


def _poison(device: torch.device, nbytes: int) -> None:
    """Fill the CUDA caching allocator's next blocks with NaN, so unwritten outputs show up."""
    if device.type == "cuda":
        junk = torch.full((nbytes // 4 + 1024,), float("nan"), dtype=torch.float32, device=device)
        del junk


def _randn(shape, dtype, device, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Standard normal * scale, drawn on `device` (large pools are slow to draw on the host)."""
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    dev_gen = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(shape, generator=dev_gen, device=device, dtype=torch.float32) * scale).to(dtype)


# ---- slot pool ---------------------------------------------------------------------------------------------

def make_pool(seq_lens: list[int], gen: torch.Generator, device: torch.device, extra_rows: int = 2):
    """A token-granular pool: each request's positions map to a random set of distinct slots.

    Returns (req_to_token [R, max_ctx] int32, req_pool_indices [B] int64, num_slots). The requests use a
    shuffled subset of the table rows; unused entries hold valid but unrelated slots, so reading past a
    request's length reads wrong data rather than faulting.
    """
    num_slots = sum(seq_lens) + 16
    max_ctx = max(seq_lens) + 7
    rows = len(seq_lens) + extra_rows
    perm = torch.randperm(num_slots, generator=gen)
    table = torch.randint(0, num_slots, (rows, max_ctx), generator=gen, dtype=torch.int32)
    row_of = torch.randperm(rows, generator=gen)[: len(seq_lens)]
    taken = 0
    for b, length in enumerate(seq_lens):
        table[row_of[b], :length] = perm[taken : taken + length].to(torch.int32)
        taken += length
    return table.to(device), row_of.to(device=device, dtype=torch.int64), num_slots


# ---- runners -----------------------------------------------------------------------------------------------

def _pool_with_kv(seq_lens: list[int], head_shape: tuple[int, int], dtype: torch.dtype, device: torch.device,
                  gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`make_pool`'s table and rows, with random K and V caches [num_slots, Hkv, D] over its slots."""
    table, req_idx, num_slots = make_pool(seq_lens, gen, device)
    k_cache = _randn((num_slots, *head_shape), dtype, device, gen)
    v_cache = _randn((num_slots, *head_shape), dtype, device, gen)
    return table, req_idx, k_cache, v_cache


def _check_extend(case: Case, impl: Callable, device: torch.device, gen: torch.Generator) -> float:
    p, dtype = case.params, DTYPES[case.dtype]
    prefix, extend = p["prefix"], p["extend"]
    hq, hkv, d = p["heads"][0], p["heads"][1], p["head_dim"]
    seq = [a + b for a, b in zip(prefix, extend)]
    table, req_idx, k_cache, v_cache = _pool_with_kv(seq, (hkv, d), dtype, device, gen)
    q = _randn((sum(extend), hq, d), dtype, device, gen)
    prefix_t = torch.tensor(prefix, dtype=torch.int32, device=device)
    extend_t = torch.tensor(extend, dtype=torch.int32, device=device)
    start_t = torch.cumsum(extend_t, 0, dtype=torch.int32) - extend_t
    scale, window = d ** -0.5, p.get("window")
    _poison(device, q.numel() * q.element_size())
    out = impl(q, k_cache, v_cache, table, req_idx, prefix_t, extend_t, start_t, scale, window, max(extend))
    ref = attention_ref.extend_attention_reference(q.float(), k_cache.float(), v_cache.float(), table, req_idx,
                                                   prefix_t, extend_t, start_t, scale, window)
    return rel_error(out, ref)


def _check_decode(case: Case, impl: Callable, device: torch.device, gen: torch.Generator) -> float:
    p, dtype = case.params, DTYPES[case.dtype]
    seq = p["seq_lens"]
    hq, hkv, d = p["heads"][0], p["heads"][1], p["head_dim"]
    table, req_idx, k_cache, v_cache = _pool_with_kv(seq, (hkv, d), dtype, device, gen)
    q = _randn((len(seq), hq, d), dtype, device, gen)
    seq_t = torch.tensor(seq, dtype=torch.int32, device=device)
    scale, window = d ** -0.5, p.get("window")
    extra = {"num_splits": p["splits"]} if p.get("splits") is not None else {}
    _poison(device, q.numel() * 4 * 64)
    out = impl(q, k_cache, v_cache, table, req_idx, seq_t, scale, window, max(seq), **extra)
    ref = attention_ref.decode_attention_reference(q.float(), k_cache.float(), v_cache.float(), table, req_idx,
                                                   seq_t, scale, window)
    return rel_error(out, ref)


def _check_multi_query_decode(case: Case, impl: Callable, device: torch.device, gen: torch.Generator) -> float:
    """Rows of a few new tokens packed at the front of q (rows of 0 tokens: graph padding, their start 0), then
    `pad_tokens` rows no request owns; only the owned rows are compared. With `fp8` the cache holds e4m3 codes
    and per-head scales (some K saturate)."""
    p, dtype = case.params, DTYPES[case.dtype]
    prefix, extend = p["prefix"], p["extend"]
    hq, hkv, d = p["heads"][0], p["heads"][1], p["head_dim"]
    seq = [a + b for a, b in zip(prefix, extend)]
    table, req_idx, k_cache, v_cache = _pool_with_kv(seq, (hkv, d), dtype, device, gen)
    k_scale = v_scale = None
    if p.get("fp8"):
        from radixgen.kernels.kv_quant import FP8_KV_DTYPE, FP8_KV_MAX, quantize_kv

        assert FP8_KV_DTYPE is not None, "this torch has no float8 dtypes"
        k_full, v_full = k_cache.float() * 3.0, v_cache.float()
        spread = torch.linspace(0.5, 2.0, hkv, device=device)  # the small scales saturate their largest K
        k_scale = k_full.abs().amax(dim=(0, 2)) / FP8_KV_MAX * spread
        v_scale = v_full.abs().amax(dim=(0, 2)) / FP8_KV_MAX
        k_cache, v_cache = quantize_kv(k_full, k_scale, FP8_KV_DTYPE), quantize_kv(v_full, v_scale, FP8_KV_DTYPE)
    owned = sum(extend)
    q = _randn((owned + p.get("pad_tokens", 0), hq, d), dtype, device, gen)
    prefix_t = torch.tensor(prefix, dtype=torch.int32, device=device)
    extend_t = torch.tensor(extend, dtype=torch.int32, device=device)
    start_t = torch.where(extend_t > 0, torch.cumsum(extend_t, 0, dtype=torch.int32) - extend_t, 0)
    scale, window = d ** -0.5, p.get("window")
    extra = {"num_splits": p["splits"]} if p.get("splits") is not None else {}
    _poison(device, q.numel() * 4 * 64)
    out = impl(q, k_cache, v_cache, table, req_idx, prefix_t, extend_t, start_t, scale, window, max(extend),
               max(seq), k_scale=k_scale, v_scale=v_scale, **extra)
    k_ref, v_ref = (k_cache, v_cache) if k_scale is not None else (k_cache.float(), v_cache.float())
    ref = attention_ref.multi_query_decode_attention_reference(q.float(), k_ref, v_ref, table, req_idx, prefix_t,
                                                               extend_t, start_t, scale, window, k_scale=k_scale,
                                                               v_scale=v_scale)
    return rel_error(out[:owned], ref[:owned])


def _check_store_kv(case: Case, impl: Callable, device: torch.device, gen: torch.Generator) -> float:
    p, dtype = case.params, DTYPES[case.dtype]
    slots, tokens, hkv, d = p["slots"], p["tokens"], p["kv_heads"], p["head_dim"]
    k_cache = _randn((slots, hkv, d), dtype, device, gen)
    v_cache = _randn((slots, hkv, d), dtype, device, gen)
    loc = torch.randperm(slots, generator=gen)[:tokens].to(device)
    # k and v as strided views of a fused projection output, as a model produces them
    qkv = _randn((tokens, (2 + 2) * hkv * d), dtype, device, gen).view(tokens, 4 * hkv, d)
    k, v = qkv[:, 2 * hkv : 3 * hkv], qkv[:, 3 * hkv :]
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    impl(k_cache, v_cache, loc, k, v)
    attention_ref.store_kv_reference(k_ref, v_ref, loc, k, v)
    return float((k_cache != k_ref).sum().item() + (v_cache != v_ref).sum().item())


def _check_rmsnorm(case: Case, impl: Callable, device: torch.device, gen: torch.Generator) -> float:
    p, dtype = case.params, DTYPES[case.dtype]
    x = _randn(p["shape"], dtype, device, gen, scale=3.0)
    w = _randn(p["shape"][-1:], dtype, device, gen)
    _poison(device, x.numel() * x.element_size())
    out = impl(x, w, 1e-6)
    return rel_error(out, elementwise_ref.rmsnorm_reference(x.float(), w.float(), 1e-6))


def _check_fused_add_rmsnorm(case: Case, impl: Callable, device: torch.device, gen: torch.Generator) -> float:
    p, dtype = case.params, DTYPES[case.dtype]
    x = _randn(p["shape"], dtype, device, gen)
    residual = _randn(p["shape"], dtype, device, gen, scale=4.0)
    w = _randn(p["shape"][-1:], dtype, device, gen)
    _poison(device, 2 * x.numel() * x.element_size())
    out, new_res = impl(x, residual, w, 1e-5)
    ref_out, ref_res = elementwise_ref.fused_add_rmsnorm_reference(x, residual, w, 1e-5)
    # the residual is rounded to x.dtype in both; the normalised output is compared with fp32 math on it
    ref_out = elementwise_ref.rmsnorm_reference(ref_res.float(), w.float(), 1e-5)
    return max(rel_error(out, ref_out), rel_error(new_res, ref_res))


def _check_silu_and_mul(case: Case, impl: Callable, device: torch.device, gen: torch.Generator) -> float:
    p, dtype = case.params, DTYPES[case.dtype]
    x = _randn(p["shape"], dtype, device, gen, scale=2.0)
    _poison(device, x.numel() * x.element_size())
    return rel_error(impl(x), elementwise_ref.silu_and_mul_reference(x.float()))


def _check_rotary(case: Case, impl: Callable, device: torch.device, gen: torch.Generator) -> float:
    p, dtype = case.params, DTYPES[case.dtype]
    tokens, hq, hkv, d = p["tokens"], p["heads"][0], p["heads"][1], p["head_dim"]
    rot = p.get("rotary_dim", d)
    cache = rope_cos_sin_cache(rot, p["max_pos"], p.get("base", 10000.0), p.get("scaling"), device=device)
    positions = torch.randint(0, p["max_pos"], (tokens,), generator=gen).to(device)
    # q and k as strided views of a fused qkv tensor, as the model hands them over
    qkv = _randn((tokens, (hq + 2 * hkv) * d), dtype, device, gen).view(tokens, hq + 2 * hkv, d)
    q, k = qkv[:, :hq], qkv[:, hq : hq + hkv]
    q_ref, k_ref = q.float().clone(), k.float().clone()
    impl(q, k, positions, cache, p["neox"])
    elementwise_ref.apply_rotary_reference(q_ref, k_ref, positions, cache, p["neox"])
    return max(rel_error(q, q_ref), rel_error(k, k_ref))


def _check_bitmask(case: Case, impl: Callable, device: torch.device, gen: torch.Generator) -> float:
    p, dtype = case.params, DTYPES[case.dtype]
    rows, vocab, words = p["rows"], p["vocab"], p["words"]
    logits = _randn((rows, vocab), dtype, device, gen)
    indices = None
    if p.get("masked_rows") is not None:
        indices = torch.randperm(rows, generator=gen)[: p["masked_rows"]].to(device=device, dtype=torch.int32)
    n = rows if indices is None else indices.shape[0]
    bitmask = torch.randint(-(2**31), 2**31 - 1, (n, words), generator=gen, dtype=torch.int32).to(device)
    if p.get("staged") and indices is not None:  # the engine's staging: each row's index in the word after its mask
        staged = torch.zeros((n, words + 4), dtype=torch.int32, device=device)
        staged[:, :words], staged[:, words] = bitmask, indices
        bitmask, indices = staged[:, :words], staged[:, words]
    expected = logits.clone()
    elementwise_ref.apply_token_bitmask_reference(expected, bitmask, indices)
    impl(logits, bitmask, indices)
    same = (logits == expected) | (logits.isnan() & expected.isnan())
    return float((~same).sum().item())


RUNNERS: dict[str, Callable] = {
    "extend_attention": _check_extend,
    "decode_attention": _check_decode,
    "multi_query_decode_attention": _check_multi_query_decode,
    "store_kv": _check_store_kv,
    "rmsnorm": _check_rmsnorm,
    "fused_add_rmsnorm": _check_fused_add_rmsnorm,
    "silu_and_mul": _check_silu_and_mul,
    "apply_rotary": _check_rotary,
    "apply_token_bitmask": _check_bitmask,
}
EXACT_OPS = {"store_kv", "apply_token_bitmask"}


# ---- running -----------------------------------------------------------------------------------------------

def triton_impl(op: str) -> Callable:
    """The Triton implementation of `op` (imports Triton)."""
    from radixgen.kernels.dispatch import triton_ops

    ops = triton_ops()
    if ops is None:
        raise RuntimeError("triton is not importable")
    return getattr(ops, op)


def run_case(case: Case, impl: Callable, device: torch.device | str, seed: int) -> Result:
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    error = RUNNERS[case.op](case, impl, device, gen)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    tolerance = 0.0 if case.op in EXACT_OPS else TOLERANCE[DTYPES[case.dtype]]
    return Result(case.id, error, tolerance, time.perf_counter() - start)


class _Outcome(TypedDict):
    error: float
    tolerance: float
    ok: bool
    seconds: float


class CaseOutcome(_Outcome, total=False):
    """One case's line of the report (`--json` prints them by case id)."""

    exception: str  # what the case raised, when it did


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=("small", "real"), default="small")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=None, help="default: fresh from os.urandom")
    parser.add_argument("--only", default=None, help="run cases whose id contains this")
    parser.add_argument("--json", action="store_true", help="print one JSON object (case id -> result)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    results: dict[str, CaseOutcome] = {}
    for case in cases(args.size):
        if args.only and args.only not in case.id:
            continue
        try:
            res = run_case(case, triton_impl(case.op), args.device, seed)
            results[case.id] = {"error": res.error, "tolerance": res.tolerance, "ok": res.ok, "seconds": res.seconds}
        except Exception as exc:
            results[case.id] = {"error": math.inf, "tolerance": 0.0, "ok": False, "seconds": 0.0,
                                    "exception": f"{type(exc).__name__}: {exc}"}
        if not args.json:
            r = results[case.id]
            print(f"{'ok  ' if r['ok'] else 'FAIL'} {case.id:55s} err={r['error']:.2e} tol={r['tolerance']:.0e} "
                  f"{r['seconds']:6.2f}s {r.get('exception', '')}", flush=True)
    if not results:
        print(f"no case id contains {args.only!r}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"seed": seed, "results": results}))
    else:
        print(f"seed={seed}: {sum(r['ok'] for r in results.values())}/{len(results)} passed")
    return 0 if all(r["ok"] for r in results.values()) else 1


__all__ = ["EXACT_OPS", "RUNNERS", "TOLERANCE", "Case", "Result", "cases", "main", "make_pool", "rel_error",
           "run_case", "triton_impl"]

if __name__ == "__main__":
    sys.exit(main())
