"""The Triton store/decode/extend kernels on an FP8 KV cache against the torch reference on the same cache.

Run as a script (`python tests/kv_fp8_cases.py --device cpu --size small`) under TRITON_INTERPRET=1 by
tests/test_kv_fp8.py, which must set the variable before Triton is imported; it prints one JSON line, case name ->
error (store: mismatching codes; attention: relative error). Imported by the GPU tests for the real sizes.
"""

from __future__ import annotations

import argparse
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class AttentionCase:
    name: str
    dtype: torch.dtype
    heads: tuple[int, int]  # (query heads, KV heads)
    head_dim: int
    prefix: tuple[int, ...]  # cached tokens per request (decode: seq_len - 1)
    extend: tuple[int, ...]  # new tokens per request (decode: all 1)
    window: int | None = None
    splits: int | None = None  # decode only: a fixed split count


def cases(size: str) -> list[AttentionCase]:
    """"small" for the interpreter (fp16, not bf16: Triton 3.9's interpreter multiplies bf16 dot operands wrongly),
    "real" for the GPU."""
    if size == "small":
        return [
            AttentionCase("decode-fp32-gqa2", torch.float32, (4, 2), 16, (5, 17, 1), (1, 1, 1)),
            AttentionCase("decode-fp32-splits", torch.float32, (4, 2), 16, (40, 9), (1, 1), splits=3),
            AttentionCase("decode-fp16-window", torch.float16, (2, 1), 32, (30, 12), (1, 1), window=8),
            AttentionCase("extend-fp32-gqa2", torch.float32, (4, 2), 16, (0, 7), (9, 20)),
            AttentionCase("extend-fp16-window", torch.float16, (2, 2), 32, (3, 0), (21, 6), window=5),
        ]
    return [
        AttentionCase("decode-bf16-llama8b", torch.bfloat16, (32, 8), 128, (4095, 1000, 17, 300), (1, 1, 1, 1)),
        AttentionCase("decode-bf16-splits", torch.bfloat16, (32, 8), 128, (8191, 5), (1, 1), splits=16),
        AttentionCase("extend-bf16-llama8b", torch.bfloat16, (32, 8), 128, (0, 600, 64), (1024, 300, 700)),
        AttentionCase("extend-bf16-window", torch.bfloat16, (32, 8), 128, (100, 0), (600, 257), window=256),
    ]


def _pool(case: AttentionCase, device: str, gen: torch.Generator
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """FP8 K/V caches holding every position of every request (slots scattered, slot 0 unused), their scales,
    and the request table."""
    hkv, d = case.heads[1], case.head_dim
    seq = [p + e for p, e in zip(case.prefix, case.extend)]
    num_slots = sum(seq) + 1
    perm = torch.randperm(num_slots - 1, generator=gen) + 1
    table = torch.zeros(len(seq), max(seq), dtype=torch.int32)
    at = 0
    for b, n in enumerate(seq):
        table[b, :n] = perm[at : at + n].to(torch.int32)
        at += n
    k = torch.randn(num_slots, hkv, d, generator=gen) * 3.0
    v = torch.randn(num_slots, hkv, d, generator=gen)
    k_scale = (k.abs().amax(dim=(0, 2)) / 448.0 * torch.linspace(0.5, 2.0, hkv)).to(device)  # some saturate
    v_scale = (v.abs().amax(dim=(0, 2)) / 448.0).to(device)
    k_cache = (k.to(device) / k_scale[:, None]).clamp(-448, 448).to(FP8)
    v_cache = (v.to(device) / v_scale[:, None]).clamp(-448, 448).to(FP8)
    return k_cache, v_cache, k_scale, v_scale, table.to(device), torch.arange(len(seq), device=device)


def _params(fn: Callable[..., object]) -> set[str]:
    return set(inspect.signature(fn).parameters)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


def run_attention(case: AttentionCase, device: str, seed: int, decode: Callable[..., torch.Tensor],
                  extend: Callable[..., torch.Tensor]) -> float:
    """`decode`/`extend` (the Triton op's signature) on the case's FP8 cache against the reference on it."""
    from radixgen.kernels import attention_ref

    gen = torch.Generator().manual_seed(seed)
    k_cache, v_cache, ks, vs, table, req = _pool(case, device, gen)
    hq, d = case.heads[0], case.head_dim
    prefix = torch.tensor(case.prefix, dtype=torch.int32, device=device)
    ext = torch.tensor(case.extend, dtype=torch.int32, device=device)
    q = torch.randn(int(ext.sum()), hq, d, generator=gen).to(device=device, dtype=case.dtype)
    scale = d ** -0.5
    if case.name.startswith("decode"):
        seq = prefix + ext
        extra = {"num_splits": case.splits} if case.splits is not None and "num_splits" in _params(decode) else {}
        out = decode(q, k_cache, v_cache, table, req, seq, scale, case.window, int(seq.max()), k_scale=ks,
                     v_scale=vs, **extra)
        ref = attention_ref.decode_attention_reference(q.float(), k_cache, v_cache, table, req, seq, scale,
                                                       case.window, k_scale=ks, v_scale=vs)
    else:
        start = torch.cumsum(ext, 0, dtype=torch.int32) - ext
        out = extend(q, k_cache, v_cache, table, req, prefix, ext, start, scale, case.window, int(ext.max()),
                     k_scale=ks, v_scale=vs)
        ref = attention_ref.extend_attention_reference(q.float(), k_cache, v_cache, table, req, prefix, ext,
                                                       start, scale, case.window, k_scale=ks, v_scale=vs)
    return rel_error(out, ref)


def run_store(device: str, seed: int, store: Callable[..., None], dtype: torch.dtype, tokens: int, hkv: int,
              d: int) -> tuple[int, int]:
    """`store` (strided K/V views of a fused projection, as the model passes them, a few beyond the e4m3 range)
    against the reference store: (mismatching codes, those of them the interpreter's own fp32 -> e4m3 conversion
    does not explain). That conversion (Triton 3.9) drops the carry of a value rounding up to a power of two (7.9
    -> 4, not 8) and rounds subnormals its own way; the GPU's is exact, where every code must match."""
    from radixgen.kernels import attention_ref

    gen = torch.Generator().manual_seed(seed)
    slots = 2 * tokens + 1
    qkv = (torch.randn(tokens, 4 * hkv, d, generator=gen) * 4.0).to(device=device, dtype=dtype)
    qkv[0, 2 * hkv, :4] = torch.tensor([1e4, -1e4, 600.0, -0.001], dtype=dtype)
    k, v = qkv[:, 2 * hkv : 3 * hkv], qkv[:, 3 * hkv :]
    ks = (torch.rand(hkv, generator=gen) + 0.01).to(device)
    vs = (torch.rand(hkv, generator=gen) + 0.01).to(device)
    loc = (torch.randperm(slots - 1, generator=gen)[:tokens] + 1).to(device)
    caches = [torch.zeros(slots, hkv, d, dtype=FP8, device=device) for _ in range(4)]
    store(caches[0], caches[1], loc, k, v, ks, vs)
    attention_ref.store_kv_reference(caches[2], caches[3], loc, k, v, ks, vs)
    out = torch.cat([caches[0].view(torch.uint8).flatten(), caches[1].view(torch.uint8).flatten()]).cpu().int()
    ref = torch.cat([caches[2].view(torch.uint8).flatten(), caches[3].view(torch.uint8).flatten()]).cpu().int()
    bad = out != ref
    normal_not_power_of_two = ((ref & 0x78) != 0) & ((ref & 0x07) != 0)
    return int(bad.sum()), int((bad & normal_not_power_of_two).sum())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--size", default="small")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    from radixgen.kernels.decode_attention_triton import decode_attention_triton
    from radixgen.kernels.extend_attention_triton import extend_attention_triton
    from radixgen.kernels.store_kv_triton import store_kv_triton

    results: dict[str, object] = {}
    for case in cases(args.size):
        try:
            results[case.name] = run_attention(case, args.device, args.seed, decode_attention_triton,
                                               extend_attention_triton)
        except Exception as e:  # reported per case, the others still run
            results[case.name] = f"{type(e).__name__}: {e}"
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        name = f"store-{str(dtype).removeprefix('torch.')}"
        try:
            results[name] = run_store(args.device, args.seed, store_kv_triton, dtype, 7, 2, 16)
        except Exception as e:
            results[name] = f"{type(e).__name__}: {e}"
    print(json.dumps(results))


if __name__ == "__main__":
    main()
