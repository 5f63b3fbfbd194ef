"""Speculative decoding against plain decoding of the same requests, in the engine, and what a verify step costs.

Part "engine" (default: the default model, real weights): for each drafter (off, n-gram, the draft model, grammar
drafts only), batch size and prompt kind, one greedy generate call of distinct prompts from an empty prefix
cache. Kinds where copying is natural (record extraction, summarizing by quoting, a code edit, JSON extraction
under a schema) and one where it is not (free chat). Greedy outputs with speculation equal those without, so
both runs make the same tokens: "same" checks it, row by row (for the constrained kind against constrained
decoding without jump-forward, the "off-no-jf" rows: jump-forward re-tokenizes forced text, verified drafts do
not). Columns: output tok/s of the call and its ratio to speculation off; drafts kept per verify step
("kept/step", the target's own token not counted) and the share of drafted tokens kept; engine steps and
wall ms per step, with the loop's own split of it ("fwd": launching or running the forward, "smp": sampling and
waiting for the tokens, "drf": proposing drafts); "same": requests whose tokens equal the reference's (bf16 on
CUDA is not batch-invariant: a verify step's rows round differently from a decode step's, so a greedy
continuation may take the other side of a near tie).

Part "verify-cost" (default on CUDA: the Llama-3-8B shape, random weights): GPU time of one verify-graph replay
of rows of 1 + k tokens, every token scored, against one decode-graph replay, at batch 1, 8 and 32 and the
context `--context`; the ratio bounds the speedup any drafter can give ((kept + 1) / cost per step).

    python benchmarks/speculative.py                                   # CUDA: both parts; CPU: the engine part
    python benchmarks/speculative.py --part engine --device cpu --batches 1 --max-new-tokens 64
    python benchmarks/speculative.py --part verify-cost                # CUDA only
    python benchmarks/speculative.py --small --device cpu --batches 2  # a tiny model, a smoke run of the script
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parent))  # throughput.py, structured.py
from structured import LLAMA3_8B_SHAPE, model_options
from throughput import replay_ms

from radixgen.runtime.engine import Engine

NAMES = ["Ada Byron", "John Smith", "Li Wei", "Maria Garcia", "Omar Haddad", "Sofia Rossi", "Kenji Sato", "Eva Novak"]
CITIES = ["Paris", "Lisbon", "Osaka", "Toronto", "Nairobi", "Oslo", "Lima", "Prague"]
RECORD_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 24}, "email": {"type": "string", "maxLength": 40},
                   "city": {"type": "string", "maxLength": 16}, "phone": {"type": "string", "maxLength": 20}},
    "required": ["name", "email", "city", "phone"], "additionalProperties": False,
}
KINDS = ["extraction", "summary", "code_edit", "json_extraction", "chat"]
DRAFTERS = ["off", "ngram", "draft_model", "grammar"]
CONSTRAINED = {"json_extraction"}
NO_JUMP = "off-no-jf"  # constrained decoding without jump-forward: what verified grammar drafts reproduce exactly


def _record(i: int) -> tuple[str, str, str, str]:
    name, city = NAMES[i % len(NAMES)], CITIES[(i // len(NAMES)) % len(CITIES)]
    email = name.lower().replace(" ", ".") + f"{i}@example.com"
    return name, email, city, f"+1 555 01{i % 100:02d}"


def prompt(kind: str, i: int) -> tuple[str, dict]:
    """The i-th prompt of a kind and its sampling parameters (greedy; the schema for json_extraction)."""
    name, email, city, phone = _record(i)
    card = (f"Customer card #{i}. Name: {name}. Email: {email}. City: {city}. Phone: {phone}. Notes: prefers "
            f"email contact, ordered {i % 7 + 2} items last month, asked about the delivery times to {city}.")
    if kind == "extraction":
        text = f"{card}\n\nCopy the card's Name, Email, City and Phone lines exactly as written above:\nName:"
    elif kind == "summary":
        text = (f"{card}\n\nSummarize the card above in two sentences, reusing its own words where you can.\n"
                f"Summary: Customer card #{i}")
    elif kind == "code_edit":
        text = (f"def total_price(items, tax_rate_{i}):\n    subtotal = 0\n    for item in items:\n"
                f"        subtotal += item.price * item.quantity\n    tax = subtotal * tax_rate_{i}\n"
                f"    return subtotal + tax\n\n# The same function with `subtotal` renamed to `net`:\n"
                f"def total_price(items, tax_rate_{i}):\n")
    elif kind == "json_extraction":
        text = f"{card}\n\nThe card as JSON with keys name, email, city, phone:\n"
        return text, {"json_schema": json.dumps(RECORD_SCHEMA)}
    else:
        topics = ["the sea", "a mountain", "autumn", "a city at night", "an old clock", "a garden", "rain", "trains"]
        text = f"Write a short original poem about {topics[i % len(topics)]}, with a title.\n"
    return text, {}


@dataclass
class Row:
    drafter: str
    kind: str
    batch: int
    tokens: int
    seconds: float
    steps: int
    verify_steps: int
    drafted: int
    kept: int
    forward_s: float
    sample_s: float
    draft_s: float
    outputs: list[list[int]]


def run_engine(options: dict, drafter: str, kinds: list[str], batches: list[int], max_new_tokens: int,
               k: int) -> list[Row]:
    spec: dict = {}
    if drafter == NO_JUMP:
        spec = {"enable_jump_forward": False}
    elif drafter != "off":
        spec = {"speculative_algorithm": drafter, "speculative_num_draft_tokens": k}
        if drafter == "draft_model":
            spec["draft_model_path"] = options.get("draft_model_path") or options.get("model_path")
    engine_options = {k_: v for k_, v in options.items() if k_ != "draft_model_path"}
    if drafter == "draft_model" and spec["draft_model_path"] is None:
        from radixgen.runtime.download import default_model_path

        spec["draft_model_path"] = str(default_model_path())
    rows = []
    eng = Engine(**engine_options, **spec)
    try:
        eng.generate("Warm up the kernels and graphs.", {"max_new_tokens": 8, "temperature": 0})
        for batch in batches:
            for kind in kinds:
                texts, params = zip(*(prompt(kind, i) for i in range(batch)))
                sampling = [{"temperature": 0, "max_new_tokens": max_new_tokens, **p} for p in params]
                eng.flush_cache()
                eng.generate(list(texts), sampling)  # untimed: the first call of a shape compiles kernels
                eng.flush_cache()
                before = eng.get_stats()
                t0 = time.perf_counter()
                outs = eng.generate(list(texts), sampling)
                seconds = time.perf_counter() - t0
                after = eng.get_stats()
                rows.append(Row(drafter, kind, batch, sum(len(o["output_ids"]) for o in outs), seconds,
                                after["steps"] - before["steps"],
                                after.get("spec_verify_steps", 0) - before.get("spec_verify_steps", 0),
                                after.get("spec_draft_tokens", 0) - before.get("spec_draft_tokens", 0),
                                after.get("spec_accepted_tokens", 0) - before.get("spec_accepted_tokens", 0),
                                after["forward_seconds"] - before["forward_seconds"],
                                after["sample_seconds"] - before["sample_seconds"],
                                after["draft_seconds"] - before["draft_seconds"],
                                [o["output_ids"] for o in outs]))
                print(f"{drafter}: {kind} batch {batch} done", flush=True)
    finally:
        eng.shutdown()
        del eng  # the model and its KV pool go before the next engine sizes its pool from the free memory
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def engine_table(rows: list[Row]) -> list[str]:
    base = {(r.kind, r.batch): r for r in rows if r.drafter == "off"}
    exact = {(r.kind, r.batch): r for r in rows if r.drafter == NO_JUMP}
    lines = [f"{'drafter':<12} {'kind':<16} {'batch':>5} {'tokens':>7} {'tok/s':>9} {'vs off':>7} {'kept/step':>9} "
             f"{'kept %':>7} {'steps':>6} {'ms/step':>7} {'fwd':>5} {'smp':>5} {'drf':>5} {'same':>5}"]
    for r in rows:
        ref = base.get((r.kind, r.batch))
        rate = r.tokens / r.seconds
        ratio = f"{rate / (ref.tokens / ref.seconds):.2f}x" if ref is not None else "-"
        twin = exact.get((r.kind, r.batch), ref) if r.kind in CONSTRAINED else ref
        same = "-" if twin is None or r.drafter in ("off", NO_JUMP) else (
            f"{sum(a == b for a, b in zip(r.outputs, twin.outputs))}/{len(r.outputs)}")
        per_step = f"{r.kept / r.verify_steps:.2f}" if r.verify_steps else "-"
        share = f"{100 * r.kept / r.drafted:.0f}%" if r.drafted else "-"
        ms = [1e3 * x / max(r.steps, 1) for x in (r.seconds, r.forward_s, r.sample_s, r.draft_s)]
        lines.append(f"{r.drafter:<12} {r.kind:<16} {r.batch:>5} {r.tokens:>7} {rate:>9.1f} {ratio:>7} "
                     f"{per_step:>9} {share:>7} {r.steps:>6} {ms[0]:>7.2f} {ms[1]:>5.2f} {ms[2]:>5.2f} {ms[3]:>5.2f} "
                     f"{same:>5}")
    return lines


def verify_cost_table(options: dict, batches: list[int], context: int) -> list[str]:
    """Replay each verify graph (rows of k tokens, every token scored) and the decode graph of the same bucket."""
    from radixgen.runtime.engine_config import EngineConfig
    from radixgen.runtime.model_runner import ModelRunner

    config = EngineConfig.from_options(**options, speculative_algorithm="ngram",
                                       speculative_max_batch=max(batches), cuda_graph_max_bs=max(batches),
                                       max_total_tokens=max(batches) * context + 64)
    runner = ModelRunner(config)
    graphs = runner.graph_runner
    assert graphs is not None, "the verify-cost part needs CUDA graphs"
    lines = [f"{'batch':>5} {'tokens/row':>10} {'decode ms':>9} {'verify ms':>9} {'cost':>6} "
             f"{'tok/s at all kept':>17} {'tok/s plain':>11}"]
    for batch in batches:
        bs = graphs.bucket(batch)
        decode = _replay_ms(graphs, graphs.graphs[bs], bs, 1, context)
        for k in graphs.row_tokens:
            verify = _replay_ms(graphs, graphs.verify_graphs[(bs, k)], bs, k, context)
            lines.append(f"{batch:>5} {k:>10} {decode:>9.3f} {verify:>9.3f} {verify / decode:>5.2f}x "
                         f"{batch * k * 1e3 / verify:>17.0f} {batch * 1e3 / decode:>11.0f}")
    return lines


def _replay_ms(graphs, graph, bs: int, k: int, context: int, iters: int = 20) -> float:
    """GPU ms of one replay with every row at `context` tokens, its last `k` new (rows read request row 0)."""
    graphs.seq_lens[:bs].fill_(context)
    graphs.prefix_lens[:bs].fill_(context - k)
    graphs.row_lens[:bs].fill_(k)
    graphs.row_starts[:bs].copy_(torch.arange(bs, device=graphs.device, dtype=torch.int32) * k)
    n = bs * k
    if len(graphs.verify_logits_rows) >= n:
        graphs.verify_logits_rows[:n].copy_(torch.arange(n, device=graphs.device))
    graphs.positions[:n].copy_(context - k + torch.arange(n, device=graphs.device) % k)
    ms = replay_ms(graph, iters)
    for t in (graphs.seq_lens, graphs.prefix_lens, graphs.row_lens, graphs.row_starts, graphs.positions,
              graphs.verify_logits_rows):
        t.zero_()
    return ms


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["engine", "verify-cost", "both"], default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default="default", help="engine part: a model path, or 'default'")
    ap.add_argument("--draft-model", default=None, help="draft model path (default: the target itself)")
    ap.add_argument("--small", action="store_true", help="a tiny random model (smoke run)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=KINDS)
    ap.add_argument("--drafters", nargs="+", choices=DRAFTERS, default=DRAFTERS)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--context", type=int, default=512, help="verify-cost part: tokens of context per row")
    ap.add_argument("--max-running", type=int, default=None,
                    help="engine part: max_running_requests and the largest CUDA graph (default: the engine's)")
    args = ap.parse_args(argv)
    part = args.part or ("both" if args.device == "cuda" else "engine")
    if part in ("engine", "both"):
        options, name = model_options(args.model, args.small, args.device)
        options["device"] = args.device
        if args.max_running:
            options.update(max_running_requests=args.max_running, cuda_graph_max_bs=args.max_running)
        if args.draft_model:
            options["draft_model_path"] = args.draft_model
        drafters = ["off", *[d for d in args.drafters if d != "off"]]
        if CONSTRAINED & set(args.kinds):
            drafters.insert(1, NO_JUMP)
        rows = [r for d in drafters for r in run_engine(options, d, args.kinds, args.batches, args.max_new_tokens,
                                                          args.draft_tokens)]
        print(f"\n## speculative decoding in the engine: {name}, {args.device}, greedy, <= {args.max_new_tokens} "
              f"new tokens, {args.draft_tokens} drafts per step at most")
        print("\n".join(engine_table(rows)))
    if part in ("verify-cost", "both"):
        if args.device != "cuda":
            print("verify-cost needs CUDA graphs: skipped on", args.device)
            return 0
        options, name = model_options(LLAMA3_8B_SHAPE, args.small, args.device)
        print(f"\n## verify step against decode step: {name}, context {args.context}")
        print("\n".join(verify_cost_table({**options, "device": "cuda"}, args.batches, args.context)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
