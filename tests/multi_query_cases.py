"""The Triton attention backend on rows of a few new tokens (its multi-query decode kernel) against the torch one.

Each case is a batch of requests appending 1..8 tokens after ragged cached prefixes, laid out either as the model
runner builds it (tokens packed, one row per request) or as a multi-token / verify CUDA graph's bucket holds it
(rows of 0 tokens up to the bucket, token padding up to bucket x k, max_seq_len the context length), over one or
more layers with their sliding windows, on a 16-bit or an FP8 pool. Run as a script
(`python tests/multi_query_cases.py --device cpu --size small`) under TRITON_INTERPRET=1 by
tests/test_multi_query_decode.py, with every dispatch op sent to its Triton kernel (CPU tensors included); it
prints one JSON line, case name -> {"error", "path", "kernel_calls"}. Imported by the GPU tests for the real sizes.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import torch

from radixgen.kernels import verify
from radixgen.kernels.kv_quant import FP8_KV_DTYPE, FP8_KV_MAX, quantize_kv
from radixgen.runtime.attention import AttentionShape, TorchAttentionBackend, TritonAttentionBackend
from radixgen.runtime.attention.backend import KVScales
from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode, forward_batch_from_lists


@dataclass(frozen=True)
class BackendCase:
    name: str
    heads: tuple[int, int]  # (query heads, KV heads)
    head_dim: int
    prefix: tuple[int, ...]  # cached tokens per request
    extend: tuple[int, ...]  # new tokens per request
    windows: tuple[int | None, ...] = (None,)  # per layer
    dtype: torch.dtype = torch.float16
    fp8: bool = False
    graph: tuple[int, int] | None = None  # (bucket, k): laid out as that multi-token graph's static batch
    context: int = 1024  # a graph batch's max_seq_len (the model's context length)

    @property
    def multi(self) -> bool:
        """Whether the Triton backend should send the whole batch through the multi-query decode kernel."""
        return max(self.extend) <= 8 and (self.graph is not None or max(self.extend) > 1)


def cases(size: str) -> list[BackendCase]:
    """"small" for the interpreter (fp16: Triton 3.9's interpreter multiplies bf16 dot operands wrongly), "real"
    (Llama-3-8B heads, bf16) for the GPU."""
    if size == "small":
        return [
            BackendCase("verify-gqa4-windows", (8, 2), 64, (0, 5, 63, 130, 600), (8, 1, 3, 2, 5), (None, 16)),
            BackendCase("graph-b4-k8-gqa1", (2, 2), 64, (70, 0, 300), (4, 1, 8), graph=(4, 8)),
            BackendCase("graph-b4-k4-gqa4-fp8", (4, 1), 64, (40, 200), (2, 4), (None, 8), fp8=True, graph=(4, 4)),
            BackendCase("mixed-prefill-chunk", (8, 2), 64, (10, 20, 0, 7), (1, 4, 20, 3)),
        ]
    llama = {"heads": (32, 8), "head_dim": 128, "dtype": torch.bfloat16}
    return [
        BackendCase("llama8b-verify-b8", prefix=(1000, 4095, 17, 0, 2047, 300, 1500, 64),
                    extend=(4, 8, 1, 5, 2, 8, 3, 4), **llama),
        BackendCase("llama8b-graph-b32-k8", prefix=tuple((397 * i) % 4000 for i in range(29)),
                    extend=tuple(1 + (3 * i) % 8 for i in range(29)), graph=(32, 8), context=8192, **llama),
        BackendCase("llama8b-graph-b4-k4-fp8", prefix=(4000, 1, 900), extend=(4, 2, 3), fp8=True, graph=(4, 4),
                    context=8192, **llama),
        BackendCase("llama8b-window512", prefix=(1500, 0, 700, 3000), extend=(8, 5, 2, 1), windows=(None, 512),
                    **llama),
        BackendCase("llama8b-mixed-prefill", prefix=(1000, 2000, 0), extend=(1, 4, 300), **llama),
    ]


@dataclass(frozen=True)
class Inputs:
    batch: ForwardBatch
    q: torch.Tensor  # [T, Hq, D]; the first `owned` rows belong to requests
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    kv_scales: KVScales | None
    owned: int


def graph_batch(table: torch.Tensor, req_pool_indices: torch.Tensor, prefix: torch.Tensor, extend: torch.Tensor,
                bucket: int, k: int, context: int) -> ForwardBatch:
    """The ForwardBatch a multi-token graph of (bucket, k) replays for these requests: rows past them have 0
    tokens (start 0, table row 0), tokens packed at the front of bucket x k."""
    dev, n = table.device, len(extend)

    def padded(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        out = torch.zeros(bucket, dtype=dtype, device=dev)
        out[:n] = x.to(dtype)
        return out

    lens = padded(extend, torch.int32)
    starts = torch.where(lens > 0, torch.cumsum(lens, 0, dtype=torch.int32) - lens, 0).to(torch.int32)
    tokens = torch.zeros(bucket * k, dtype=torch.int64, device=dev)
    return ForwardBatch(
        mode=ForwardMode.EXTEND, input_ids=tokens, positions=tokens.clone(), out_cache_loc=tokens.clone(),
        req_pool_indices=padded(req_pool_indices, torch.int64), req_to_token=table,
        prefix_lens=padded(prefix, torch.int32), extend_lens=lens, seq_lens=padded(prefix + extend, torch.int32),
        extend_start_loc=starts, logits_indices=None, max_extend_len=k, max_seq_len=context, num_decode_rows=0)


def make_inputs(case: BackendCase, device: torch.device, gen: torch.Generator) -> Inputs:
    hq, hkv, d = case.heads[0], case.heads[1], case.head_dim
    seq = [p + e for p, e in zip(case.prefix, case.extend)]
    table, req_idx, num_slots = verify.make_pool(seq, gen, device)
    k_cache = torch.randn(num_slots, hkv, d, generator=gen).to(device)
    v_cache = torch.randn(num_slots, hkv, d, generator=gen).to(device)
    scales = None
    if case.fp8:
        assert FP8_KV_DTYPE is not None, "this torch has no float8 dtypes"
        k_cache = k_cache * 3.0
        spread = torch.linspace(0.5, 2.0, hkv, device=device)  # the small scales saturate their largest K
        scales = (k_cache.abs().amax(dim=(0, 2)) / FP8_KV_MAX * spread, v_cache.abs().amax(dim=(0, 2)) / FP8_KV_MAX)
        k_cache, v_cache = quantize_kv(k_cache, scales[0], FP8_KV_DTYPE), quantize_kv(v_cache, scales[1], FP8_KV_DTYPE)
    else:
        k_cache, v_cache = k_cache.to(case.dtype), v_cache.to(case.dtype)
    owned = sum(case.extend)
    prefix = torch.tensor(case.prefix, dtype=torch.int32, device=device)
    extend = torch.tensor(case.extend, dtype=torch.int32, device=device)
    if case.graph is not None:
        bucket, k = case.graph
        batch = graph_batch(table, req_idx, prefix, extend, bucket, k, case.context)
    else:
        rows = req_idx.tolist()
        loc = torch.cat([table[r, p : p + e].long() for r, p, e in zip(rows, case.prefix, case.extend)])
        batch = forward_batch_from_lists([[0] * e for e in case.extend], list(case.prefix), rows, table, loc)
    q = torch.randn(batch.num_tokens, hq, d, generator=gen).to(device=device, dtype=case.dtype)
    return Inputs(batch, q, k_cache, v_cache, scales, owned)


def shape_of(case: BackendCase) -> AttentionShape:
    return AttentionShape(case.heads[0], case.heads[1], case.head_dim, case.windows)


def reference(case: BackendCase, x: Inputs) -> list[torch.Tensor]:
    """Every layer's output of the torch backend on fp32 copies of the inputs (an FP8 pool's codes as they are)."""
    backend = TorchAttentionBackend(shape_of(case), torch.float32)
    plan = backend.plan(x.batch)
    k, v = (x.k_cache, x.v_cache) if case.fp8 else (x.k_cache.float(), x.v_cache.float())
    return [backend.forward(x.q.float(), k, v, layer, plan, x.kv_scales) for layer in range(len(case.windows))]


def run_case(case: BackendCase, device: torch.device | str, seed: int) -> tuple[float, str]:
    """(the largest relative error of the Triton backend's owned rows over the layers, the path its plan took:
    "multi" or "split")."""
    device = torch.device(device)
    x = make_inputs(case, device, torch.Generator().manual_seed(seed))
    backend = TritonAttentionBackend(shape_of(case))
    plan = backend.plan(x.batch)
    errors = []
    for layer, ref in enumerate(reference(case, x)):
        out = backend.forward(x.q, x.k_cache, x.v_cache, layer, plan, x.kv_scales)
        errors.append(verify.rel_error(out[: x.owned], ref[: x.owned]))
    return max(errors), "multi" if plan.multi is not None else "split"


def send_every_op_to_triton() -> dict[str, int]:
    """Dispatch runs each op's Triton kernel whatever the tensors' device (the interpreter runs CPU tensors);
    returns the attention kernels' call counts, kept up to date."""
    from types import SimpleNamespace

    from radixgen.kernels import dispatch

    ops = dispatch.triton_ops()
    assert ops is not None, "triton is not importable"
    calls = dict.fromkeys(("decode_attention", "extend_attention", "multi_query_decode_attention"), 0)

    def counted(name: str):
        fn = getattr(ops, name)

        def run(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return run

    routed = SimpleNamespace(**{**vars(ops), **{name: counted(name) for name in calls}})
    dispatch._triton_for = lambda t: routed  # type: ignore[assignment]
    return calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", choices=("small", "real"), default="small")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    calls = send_every_op_to_triton() if args.device == "cpu" else None
    results = {}
    for case in cases(args.size):
        before = dict(calls) if calls is not None else {}
        error, path = run_case(case, args.device, args.seed)
        results[case.name] = {"error": error, "path": path}
        if calls is not None:
            results[case.name]["kernel_calls"] = {op: n - before[op] for op, n in calls.items()}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
