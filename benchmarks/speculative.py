"""Speculative decoding against plain decoding of the same requests, in the engine, and what a verify step costs.

Part "engine" (default: the default model, real weights): for each configuration (speculation off, off without
jump-forward, n-gram, the draft model, grammar drafts only), batch size and prompt kind, greedy generate calls of
distinct prompts from an empty prefix cache. Kinds where copying is natural (record extraction, summarizing by
quoting, a code edit, JSON extraction under a schema) and one where it is not (free chat). Each cell runs
`--repeats` times (3 on CUDA, 1 on the CPU): with more than one, all engines live at once and, per cell, after
one untimed call on each engine, round r calls every configuration once in an order rotated by r, so drift in
the machine lands on all alike; with one, the engines run one after another, each cell after an untimed call.
On the CPU, engines that live at once are slower than one alone (each engine's loop thread keeps its own OpenMP
team: more threads than cores, docs/performance-notes.md), hence one repeat there by default. Greedy outputs
with speculation equal those without, so all runs make the same tokens: "same" checks it, row by row (for the
constrained kind against constrained decoding without jump-forward, the "off-no-jf" rows: jump-forward
re-tokenizes forced text, verified drafts do not). On CUDA every engine's KV pool holds the largest batch's
rows (not a share of the memory the engines built before left free). Columns: the median output tok/s of the
calls, their spread ((max - min) / median), the ratio of medians to speculation off's and the range of the
ratios of single rounds ("per round"); drafts kept per verify step ("kept/step", the target's own token not
counted) and the share of drafted tokens kept, over all rounds; engine steps and the median wall ms per step,
with the loop's own split of it ("fwd": launching or running the forward, "smp": sampling and waiting for the
tokens, "drf": proposing drafts); "same": requests whose tokens equal the reference's in every round (bf16 on
CUDA is not batch-invariant: a verify step's rows round differently from a decode step's, so a greedy
continuation may take the other side of a near tie). The noise lines under the table give "off-no-jf" against
"off" on the unconstrained kinds, where the two are the same engine: a ratio inside that band means nothing.
`--json PATH` also writes every timed call's numbers.

Part "verify-cost" (default on CUDA: the Llama-3-8B shape, random weights): GPU time of one verify-graph replay
of rows of 1 + k tokens, every token scored, against one decode-graph replay, at batch 1, 8 and 32 and the
context `--context`; the ratio bounds the speedup any drafter can give ((kept + 1) / cost per step).

    python benchmarks/speculative.py                                   # CUDA: both parts; CPU: the engine part
    python benchmarks/speculative.py --part engine --device cpu --batches 1 --max-new-tokens 64
    python benchmarks/speculative.py --part verify-cost                # CUDA only
    python benchmarks/speculative.py --small --device cpu --batches 2  # a tiny model, a smoke run of the script
    python benchmarks/speculative.py --device cpu --batches 1 --kinds extraction --drafters ngram --repeats 2 \
        --max-new-tokens 16 --json /tmp/spec.json                      # the repeat mode, briefly, on the CPU
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median
from typing import NamedTuple

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
PROMPT_TOKENS = 512  # more than any prompt here takes: the CUDA KV pool holds the largest batch's rows


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


@dataclass(frozen=True)
class Config:
    """One engine configuration of the table: its name and the engine options it adds to the model's."""

    name: str
    spec: dict


class Cell(NamedTuple):
    """One prompt kind at one batch size: the same requests go to every configuration."""

    kind: str
    batch: int


@dataclass
class Row:
    """One timed generate call: a configuration's cell in one round, with the loop's counters over the call."""

    drafter: str
    kind: str
    batch: int
    repeat: int  # the round
    slot: int  # the position of this configuration in its round's order
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

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


def configurations(drafters: list[str], options: dict, k: int) -> list[Config]:
    """"off", "off-no-jf" (the noise control on unconstrained kinds, the reference on constrained ones), then the
    drafters asked for."""
    out = [Config("off", {}), Config(NO_JUMP, {"enable_jump_forward": False})]
    for drafter in (d for d in drafters if d != "off"):
        spec: dict = {"speculative_algorithm": drafter, "speculative_num_draft_tokens": k}
        if drafter == "draft_model":
            path = options.get("draft_model_path") or options.get("model_path")
            if path is None:
                from radixgen.runtime.download import default_model_path

                path = str(default_model_path())
            spec["draft_model_path"] = path
        out.append(Config(drafter, spec))
    return out


def requests(cell: Cell, max_new_tokens: int) -> tuple[list[str], list[dict]]:
    texts, params = zip(*(prompt(cell.kind, i) for i in range(cell.batch)))
    return list(texts), [{"temperature": 0, "max_new_tokens": max_new_tokens, **p} for p in params]


def open_engine(options: dict, config: Config) -> Engine:
    eng = Engine(**{k: v for k, v in options.items() if k != "draft_model_path"}, **config.spec)
    eng.generate("Warm up the kernels and graphs.", {"max_new_tokens": 8, "temperature": 0})
    return eng


def close_engines(engines: list[Engine]) -> None:
    """Shut the engines down and free their memory before the next ones size their pools."""
    for eng in engines:
        eng.shutdown()
    engines.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def timed_call(eng: Engine, config: Config, cell: Cell, texts: list[str], sampling: list[dict], repeat: int,
               slot: int) -> Row:
    """One generate call of the cell's requests from an empty prefix cache, timed, with the counters it moved."""
    eng.flush_cache()
    gc.collect()  # a collection inside the call would land on whichever configuration runs then
    before = eng.get_stats()
    t0 = time.perf_counter()
    outs = eng.generate(texts, sampling)
    seconds = time.perf_counter() - t0
    after = eng.get_stats()

    def moved(key: str) -> float:
        return after.get(key, 0) - before.get(key, 0)

    return Row(config.name, cell.kind, cell.batch, repeat, slot, sum(len(o["output_ids"]) for o in outs), seconds,
               int(moved("steps")), int(moved("spec_verify_steps")), int(moved("spec_draft_tokens")),
               int(moved("spec_accepted_tokens")), moved("forward_seconds"), moved("sample_seconds"),
               moved("draft_seconds"), [o["output_ids"] for o in outs])


def round_order(configs: list[Config], repeat: int) -> list[Config]:
    """Round r starts at the r-th configuration, so no configuration always runs first (or right after another)."""
    shift = repeat % len(configs)
    return configs[shift:] + configs[:shift]


def run_engine(options: dict, configs: list[Config], cells: list[Cell], repeats: int,
               max_new_tokens: int) -> list[Row]:
    """Every configuration's every cell `repeats` times. With repeats > 1 all engines live at once and each cell
    runs round by round, every configuration once a round in a rotated order, so drift in the machine lands on
    all of them alike; with one repeat the engines run one after another. Every engine makes one untimed call of
    a cell before its timed ones (the first call of a shape compiles kernels)."""
    groups = [configs] if repeats > 1 else [[c] for c in configs]
    rows: list[Row] = []
    for group in groups:
        engines: list[Engine] = []
        try:
            for config in group:
                engines.append(open_engine(options, config))
            by_name = dict(zip((c.name for c in group), engines))
            for cell in cells:
                texts, sampling = requests(cell, max_new_tokens)
                for eng in engines:
                    eng.flush_cache()
                    eng.generate(texts, sampling)
                for repeat in range(repeats):
                    for slot, config in enumerate(round_order(group, repeat)):
                        rows.append(timed_call(by_name[config.name], config, cell, texts, sampling, repeat, slot))
                names = ", ".join(c.name for c in group)
                print(f"{names}: {cell.kind} batch {cell.batch} done ({repeats} round(s))", flush=True)
        finally:
            close_engines(engines)
    return rows


@dataclass
class Summary:
    """A configuration's repeats of one cell: median and range of tok/s, and against "off" of the same rounds."""

    drafter: str
    cell: Cell
    runs: list[Row]
    ratio: float | None  # median tok/s over "off"'s median tok/s
    round_ratios: list[float]  # tok/s over "off"'s tok/s of the same round

    @property
    def rates(self) -> list[float]:
        return [r.rate for r in self.runs]


def summarize(rows: list[Row]) -> list[Summary]:
    """One summary per configuration and cell, in the order the configurations and cells first ran."""
    groups: dict[tuple[str, Cell], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.drafter, Cell(r.kind, r.batch)), []).append(r)
    out = []
    for (drafter, cell), runs in groups.items():
        runs = sorted(runs, key=lambda r: r.repeat)
        base = sorted(groups.get(("off", cell), []), key=lambda r: r.repeat)
        ratio = median(r.rate for r in runs) / median(r.rate for r in base) if base else None
        pairs = {r.repeat: r.rate for r in base}
        out.append(Summary(drafter, cell, runs, ratio, [r.rate / pairs[r.repeat] for r in runs if r.repeat in pairs]))
    order = {name: i for i, name in enumerate(dict.fromkeys(r.drafter for r in rows))}
    return sorted(out, key=lambda s: order[s.drafter])


def _same(s: Summary, twin: Summary | None) -> str:
    """Requests whose tokens equal the reference's (its first round) in every round."""
    if twin is None or s.drafter in ("off", NO_JUMP):
        return "-"
    ref = twin.runs[0].outputs
    same = sum(all(r.outputs[i] == ref[i] for r in s.runs) for i in range(len(ref)))
    return f"{same}/{len(ref)}"


def engine_table(summaries: list[Summary]) -> list[str]:
    cells = {(s.drafter, s.cell): s for s in summaries}
    lines = [f"{'drafter':<12} {'kind':<16} {'batch':>5} {'tokens':>7} {'tok/s':>9} {'spread':>6} {'vs off':>7} "
             f"{'per round':>9} {'kept/step':>9} {'kept %':>7} {'steps':>6} {'ms/step':>7} {'fwd':>5} {'smp':>5} "
             f"{'drf':>5} {'same':>5}"]
    for s in summaries:
        rates, runs = s.rates, s.runs
        n = len(runs)
        spread = f"{100 * (max(rates) - min(rates)) / median(rates):.0f}%" if n > 1 else "-"
        ratio = f"{s.ratio:.2f}x" if s.ratio is not None else "-"
        rounds = (f"{min(s.round_ratios):.2f}-{max(s.round_ratios):.2f}"
                  if n > 1 and s.round_ratios and s.drafter != "off" else "-")
        off = cells.get(("off", s.cell))
        twin = cells.get((NO_JUMP, s.cell), off) if s.cell.kind in CONSTRAINED else off
        verify_steps, kept, drafted = (sum(getattr(r, f) for r in runs) for f in ("verify_steps", "kept", "drafted"))
        per_step = f"{kept / verify_steps:.2f}" if verify_steps else "-"
        share = f"{100 * kept / drafted:.0f}%" if drafted else "-"
        ms = [median(1e3 * getattr(r, f) / max(r.steps, 1) for r in runs)
              for f in ("seconds", "forward_s", "sample_s", "draft_s")]
        tokens, steps = (int(median(getattr(r, f) for r in runs)) for f in ("tokens", "steps"))
        lines.append(f"{s.drafter:<12} {s.cell.kind:<16} {s.cell.batch:>5} {tokens:>7} {median(rates):>9.1f} "
                     f"{spread:>6} {ratio:>7} {rounds:>9} {per_step:>9} {share:>7} {steps:>6} {ms[0]:>7.2f} "
                     f"{ms[1]:>5.2f} {ms[2]:>5.2f} {ms[3]:>5.2f} {_same(s, twin):>5}")
    return lines


def noise_lines(summaries: list[Summary]) -> list[str]:
    """How far apart two identical configurations measure: "off-no-jf" against "off" on unconstrained kinds,
    where jump-forward has nothing to do."""
    twins = [s for s in summaries if s.drafter == NO_JUMP and s.cell.kind not in CONSTRAINED and s.ratio is not None]
    if not twins:
        return []
    kinds = ", ".join(dict.fromkeys(s.cell.kind for s in twins))
    lines = [f"noise: {NO_JUMP} against off, the same engine on unconstrained kinds ({kinds}); a 'vs off' ratio "
             "inside its batch's band is no measured difference"]
    for batch in sorted({s.cell.batch for s in twins}):
        at = [s for s in twins if s.cell.batch == batch]
        ratios = [s.ratio for s in at if s.ratio is not None]
        rounds = [x for s in at for x in s.round_ratios]
        lines.append(f"  batch {batch:>3}: ratio of medians {min(ratios):.2f}-{max(ratios):.2f}x over {len(at)} "
                     f"kind(s); single rounds {min(rounds):.2f}-{max(rounds):.2f}x")
    return lines


def write_json(path: str, rows: list[Row], meta: dict) -> None:
    """Every timed call's raw numbers (the output token ids left out), for a later look at the distribution."""
    raw = [{k: v for k, v in asdict(r).items() if k != "outputs"} | {"tok_s": r.rate} for r in rows]
    Path(path).write_text(json.dumps({"meta": meta, "rows": raw}, indent=1) + "\n")


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
    ap.add_argument("--repeats", type=int, default=None,
                    help="engine part: timed calls per cell, interleaved across the configurations (default: 3 on "
                         "CUDA, 1 on the CPU)")
    ap.add_argument("--json", default=None, help="engine part: also write every timed call's numbers to this file")
    args = ap.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    part = args.part or ("both" if args.device == "cuda" else "engine")
    if part in ("engine", "both"):
        options, name = model_options(args.model, args.small, args.device)
        options["device"] = args.device
        if args.max_running:
            options.update(max_running_requests=args.max_running, cuda_graph_max_bs=args.max_running)
        if args.draft_model:
            options["draft_model_path"] = args.draft_model
        if args.device == "cuda":  # a fixed KV pool, not a share of what the engines built before left free
            options["max_total_tokens"] = max(args.batches) * (args.max_new_tokens + PROMPT_TOKENS)
        repeats = args.repeats if args.repeats is not None else (3 if args.device == "cuda" else 1)
        configs = configurations(args.drafters, options, args.draft_tokens)
        cells = [Cell(kind, batch) for batch in args.batches for kind in args.kinds]
        rows = run_engine(options, configs, cells, repeats, args.max_new_tokens)
        print(f"\n## speculative decoding in the engine: {name}, {args.device}, greedy, <= {args.max_new_tokens} "
              f"new tokens, {args.draft_tokens} drafts per step at most, "
              + (f"medians of {repeats} interleaved rounds" if repeats > 1 else "one timed call per cell"))
        summaries = summarize(rows)
        print("\n".join(engine_table(summaries) + noise_lines(summaries)))
        if args.json:
            write_json(args.json, rows, {"model": name, "device": args.device, "repeats": repeats,
                                         "max_new_tokens": args.max_new_tokens, "draft_tokens": args.draft_tokens})
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
