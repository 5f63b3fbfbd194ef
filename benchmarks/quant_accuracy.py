"""Accuracy of each quantization scheme against the unquantized model: perplexity on a fixed public-domain text
(tests/fixtures/text/public_domain.txt), logit deviation on the same tokens, and greedy agreement over a prompt
set drawn from the text.

    perplexity   exp(mean next-token NLL) over non-overlapping windows of --window tokens
    logit dev    ||logits_q - logits_ref|| / ||logits_ref|| over every position (Frobenius), and the mean
                 KL(ref || q) of the next-token distributions
    greedy       per prompt, the tokens generated before the first one that differs from the reference's
                 continuation (of --new-tokens), averaged; and the share of prompts that agree fully

Every scheme quantizes the same loaded weights at load time, without calibration data (round-to-nearest; GPTQ and
AWQ would calibrate on text, typically 128 sequences of 2048 tokens of C4 or WikiText, which this does not do).

    python benchmarks/quant_accuracy.py                            # the default model, CPU fp32
    python benchmarks/quant_accuracy.py --device cuda --schemes int4 fp8 gguf-q8_0
    python benchmarks/quant_accuracy.py --model path/to/model --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
TEXT = REPO / "tests" / "fixtures" / "text" / "public_domain.txt"
SCHEMES = ("int4", "int4-g64", "int4-g32", "fp8", "gguf-q8_0", "gguf-q6_k", "gguf-q5_k", "gguf-q4_k")


@dataclass(frozen=True)
class Accuracy:
    scheme: str
    perplexity: float
    logit_rel_dev: float
    mean_kl: float
    greedy_prefix: float  # mean tokens before the first difference
    greedy_full: float  # share of prompts whose whole continuation agrees
    weight_bytes: int


class Harness:
    """Forward passes of one model through its own KV pool (prefill and batched greedy decode)."""

    def __init__(self, model, config, max_tokens: int, max_requests: int) -> None:
        from radixgen.runtime.attention import attention_backend_for
        from radixgen.runtime.kv_pool import KVPool, ReqToTokenPool, SlotAllocator

        self.model, self.config = model, config
        self.slots = max_tokens * max_requests + 8
        self.pool = KVPool.for_model(config, self.slots, model.dtype, model.device)
        self.attention = attention_backend_for(config, self.pool.device, model.dtype)
        self.table = ReqToTokenPool(max_requests, max_tokens, model.device)
        self.allocator = SlotAllocator(self.slots)
        self.SlotAllocator = SlotAllocator

    @torch.inference_mode()
    def run(self, chunks: list[tuple[int, list[int], int]], all_logits: bool) -> torch.Tensor:
        from radixgen.runtime.forward_batch import forward_batch_from_lists

        locs = []
        for row, ids, cached in chunks:
            slots = self.allocator.alloc(len(ids))
            self.table.write(row, cached, slots)
            locs.append(torch.from_numpy(slots))
        total = sum(len(ids) for _, ids, _ in chunks)
        device = self.model.device
        batch = forward_batch_from_lists([ids for _, ids, _ in chunks], [c for *_, c in chunks],
                                         [r for r, *_ in chunks], self.table.req_to_token,
                                         torch.cat(locs).to(device),
                                         logits_indices=torch.arange(total, device=device) if all_logits else None)
        return self.model(batch, self.pool, self.attention, self.attention.plan(batch)).float().cpu()

    def window_logits(self, ids: list[int]) -> torch.Tensor:
        self.allocator = self.SlotAllocator(self.slots)
        row = self.table.alloc()
        try:
            return self.run([(row, ids, 0)], all_logits=True)
        finally:
            self.table.free(row)

    def greedy(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        self.allocator = self.SlotAllocator(self.slots)
        rows = [self.table.alloc() for _ in prompts]
        try:
            last = self.run([(r, p, 0) for r, p in zip(rows, prompts)], all_logits=False)
            outs = [[int(t)] for t in last.argmax(-1)]
            for step in range(1, new_tokens):
                chunks = [(r, [o[-1]], len(p) + step - 1) for r, p, o in zip(rows, prompts, outs)]
                for o, t in zip(outs, self.run(chunks, all_logits=False).argmax(-1)):
                    o.append(int(t))
            return outs
        finally:
            for r in rows:
                self.table.free(r)


def corpus_ids(tokenizer, max_tokens: int | None = None) -> list[int]:
    ids = tokenizer.encode(TEXT.read_text(encoding="utf-8"))
    return ids[:max_tokens] if max_tokens else ids


def windows(ids: list[int], length: int) -> list[list[int]]:
    return [ids[i : i + length] for i in range(0, len(ids) - 1, length) if len(ids[i : i + length]) > 1]


def prompt_set(ids: list[int], count: int, length: int) -> list[list[int]]:
    step = max(1, (len(ids) - length) // count)
    return [ids[i * step : i * step + length] for i in range(count)]


def evaluate(ref: Harness, quant: Harness, ids: list[int], window: int, prompts: list[list[int]],
             new_tokens: int, scheme: str, weight_bytes: int,
             ref_cache: dict | None = None) -> Accuracy:
    """`quant` against `ref` on the windows of `ids` and the prompts; `ref_cache` keeps the reference's results."""
    cache = ref_cache if ref_cache is not None else {}
    nll, count, diff2, ref2, kl = 0.0, 0, 0.0, 0.0, 0.0
    for i, w in enumerate(windows(ids, window)):
        r = cache.get(("w", i))
        if r is None:
            r = cache[("w", i)] = ref.window_logits(w)
        q = quant.window_logits(w)
        targets = torch.tensor(w[1:])
        logp = torch.log_softmax(q[:-1].double(), dim=-1)
        nll -= float(logp.gather(1, targets[:, None]).sum())
        count += len(w) - 1
        diff2 += float((q.double() - r.double()).pow(2).sum())
        ref2 += float(r.double().pow(2).sum())
        ref_logp = torch.log_softmax(r.double(), dim=-1)
        kl += float((ref_logp.exp() * (ref_logp - torch.log_softmax(q.double(), dim=-1))).sum())
    positions = sum(len(w) for w in windows(ids, window))
    ref_out = cache.get("greedy")
    if ref_out is None:
        ref_out = cache["greedy"] = ref.greedy(prompts, new_tokens)
    q_out = quant.greedy(prompts, new_tokens)
    prefix = [next((j for j in range(new_tokens) if a[j] != b[j]), new_tokens) for a, b in zip(ref_out, q_out)]
    return Accuracy(scheme, math.exp(nll / count), math.sqrt(diff2 / ref2), kl / positions,
                    sum(prefix) / len(prefix), sum(p == new_tokens for p in prefix) / len(prefix), weight_bytes)


def reference_accuracy(ref: Harness, ids: list[int], window: int, weight_bytes: int) -> Accuracy:
    nll, count = 0.0, 0
    for w in windows(ids, window):
        logp = torch.log_softmax(ref.window_logits(w)[:-1].double(), dim=-1)
        nll -= float(logp.gather(1, torch.tensor(w[1:])[:, None]).sum())
        count += len(w) - 1
    return Accuracy("none", math.exp(nll / count), 0.0, 0.0, float("nan"), 1.0, weight_bytes)


def quantized_copy(model, scheme: str):
    """A copy of `model` with its layer linears quantized as `load_model(..., quantization=scheme)` would."""
    import copy

    from radixgen.runtime.quant.apply import quantize_linears
    from radixgen.runtime.quant.scheme import rtn_target

    target = rtn_target(scheme)
    assert target is not None, f"{scheme} quantizes nothing"
    quant = copy.deepcopy(model)
    quantize_linears(quant, target)
    return quant


def linear_bytes(model) -> int:
    from radixgen.kernels import weight_nbytes

    return sum(weight_nbytes(slot.weight) for slot in model.linear_slots())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model folder or .gguf (default: the default model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--schemes", nargs="+", default=list(SCHEMES))
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=None, help="score only the text's first N tokens")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    from radixgen.runtime.download import cache_dir, default_model_path
    from radixgen.runtime.loader import load_model
    from radixgen.tokenizer import Tokenizer

    path = Path(args.model) if args.model else default_model_path(download=True)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tokenizer = Tokenizer.from_file(str(path))
    ids = corpus_ids(tokenizer, args.max_tokens)
    prompts = prompt_set(ids, args.prompts, args.prompt_len)
    max_tokens = max(args.window, args.prompt_len + args.new_tokens) + 8
    model, config = load_model(path, device=device, dtype=dtype, quantization="none", weight_cache_dir=cache_dir())
    ref = Harness(model, config, max_tokens, args.prompts)
    rows = [reference_accuracy(ref, ids, args.window, linear_bytes(model))]
    cache: dict = {}
    for scheme in args.schemes:
        qmodel = quantized_copy(model, scheme)
        quant = Harness(qmodel, config, max_tokens, args.prompts)
        rows.append(evaluate(ref, quant, ids, args.window, prompts, args.new_tokens, scheme, linear_bytes(qmodel),
                             cache))
        print(json.dumps(asdict(rows[-1])), flush=True)
        del qmodel, quant
    print(f"\n{path.name}, {device.type} {dtype}; {len(ids)} tokens of {TEXT.name} in windows of {args.window}; "
          f"{args.prompts} prompts of {args.prompt_len} tokens, {args.new_tokens} greedy tokens each")
    print("| scheme | layer linears MiB | perplexity | vs none | logit rel. dev. | mean KL | greedy tokens agreeing "
          "| prompts fully agreeing |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    base = rows[0].perplexity
    for r in rows:
        greedy = "-" if r.scheme == "none" else f"{r.greedy_prefix:.1f} of {args.new_tokens}"
        print(f"| {r.scheme} | {r.weight_bytes / 2**20:,.1f} | {r.perplexity:.3f} "
              f"| {100 * (r.perplexity / base - 1):+.2f}% | {r.logit_rel_dev:.4f} | {r.mean_kl:.5f} | {greedy} "
              f"| {100 * r.greedy_full:.0f}% |")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
