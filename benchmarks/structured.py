"""Structured generation against free decoding of the same tokens, in the engine, per grammar backend.

For each batch size, constraint kind (a 6-field JSON extraction schema, a regex, a GBNF grammar), jump-forward
setting and installed grammar backend: the constrained run (greedy, `--max-new-tokens` at most), then the same
prompts unconstrained with each request's `max_new_tokens` set to the tokens its constrained run produced
(`ignore_eos`), so both sides make the same tokens. Both runs start from an empty prefix cache. Every
constrained output is parsed and checked against its constraint ("invalid" counts the failures and aborts).

Columns: wall seconds of each generate call and their ratio (constrained / free); tokens made (and how many of
them jump-forward appended without a decode step); engine steps, decode steps and overlapped steps (launched
before the previous step's tokens were delivered) as "constrained / free"; the loop's grammar time per
constrained request per step, median and p90 over the constrained run's steps (the engine's own counters).

One engine per (backend, jump-forward) pair runs every batch size and kind; it is shut down and its memory
freed before the next starts. A backend that fails to start, or a kind it cannot compile, is a row with a note.
`--trace N` keeps the engine's step trace and prints, after each timed run, the loop's time per forward path
and its N slowest steps (what profiling a run needs, without patching the loop). `--repeats N` runs each cell's
constrained / free pair N times in a row (each from an empty cache): the walls are the medians, the ratio theirs,
with the range of the single pairs' ratios beside it (a single run of a batch-256 cell moves by up to 0.2x: the
jump policy reads the graphs' replay times as it runs).

    python benchmarks/structured.py                                  # CUDA: Llama-3-8B shape; CPU: default model
    python benchmarks/structured.py --device cpu --batches 16 --kinds json_schema
    python benchmarks/structured.py --small --device cpu --batches 2  # a tiny model, a smoke run of the script
    python benchmarks/structured.py --batches 256 --kinds json_schema --repeats 5      # medians of 5 pairs
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, cast

import torch

sys.path.append(str(Path(__file__).resolve().parent))  # throughput.py, when imported from elsewhere
from throughput import LLAMA3_8B, QWEN3_TOKENIZER, SMALL

from radixgen.grammars.backend import GRAMMAR_BACKENDS, installed_grammar_backends
from radixgen.grammars.tool_formats import FunctionSpec, ToolChoice, tool_call_ebnf
from radixgen.grammars.tool_parsers import parse_tool_output
from radixgen.runtime.engine import Engine
from radixgen.runtime.step_trace import StepRecord

SMOLLM2_TOKENIZER = QWEN3_TOKENIZER.parent.parent / "smollm2-135m-instruct.tokenizer.gguf"
LLAMA3_8B_SHAPE = "llama3-8b-shape"  # --model name of the random-weight Llama-3-8B shape (Qwen3 tokenizer)
DEFAULT_MODEL = "default"  # --model name of the engine's default model

STATUSES = ["single", "married", "divorced", "widowed"]
EXTRACTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 20},
        "job": {"type": "string", "maxLength": 20},
        "has_pets": {"type": "boolean"},
        "status": {"enum": STATUSES},
    },
    "required": ["name", "age", "city", "job", "has_pets", "status"],
    "additionalProperties": False,
}
RECORD_REGEX = r"Name: [A-Z][a-z]{1,15}; Age: [1-9][0-9]?; City: [A-Z][a-z]{1,15}\."
PEOPLE_GBNF = r"""
root   ::= person ( "; " person ){0,2}
person ::= name " (" age ", " name ")"
name   ::= [A-Z] [a-z]{1,15}
age    ::= [1-9] [0-9]?
"""
PEOPLE_REGEX = r"P(; P){0,2}".replace("P", r"[A-Z][a-z]{1,15} \([1-9][0-9]?, [A-Z][a-z]{1,15}\)")  # its language


def _fits_property(value: object, spec: dict[str, Any]) -> bool:
    if "enum" in spec:
        return value in spec["enum"]
    if spec["type"] == "string":
        return isinstance(value, str) and len(value) <= spec["maxLength"]
    if spec["type"] == "integer":
        return isinstance(value, int) and not isinstance(value, bool) and spec["minimum"] <= value <= spec["maximum"]
    return isinstance(value, bool)


def is_extraction(text: str) -> bool:
    """Whether `text` is an instance of EXTRACTION_SCHEMA: every property, in order, of its type and bounds."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    props = EXTRACTION_SCHEMA["properties"]
    return isinstance(value, dict) and list(value) == list(props) and all(
        _fits_property(value[k], spec) for k, spec in props.items())


@dataclass(frozen=True)
class ConstraintKind:
    """One constraint of the benchmark: its sampling_params key and source, what the prompt asks for, and the
    check every output must pass."""

    name: str  # json_schema | regex | ebnf | tool_call
    source: str
    instruction: str
    is_valid: Callable[[str], bool]
    key: str | None = None  # the sampling_params key, when not `name` (tool_call: its grammar, as ebnf)

    @property
    def param(self) -> str:
        return self.key or self.name


TOOL = FunctionSpec("record_person", {
    "type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
    "properties": {"name": {"type": "string", "maxLength": 20},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "city": {"type": "string", "maxLength": 20}}}, "Record one person.")
TOOL_CALL_GBNF = tool_call_ebnf([TOOL], "hermes", ToolChoice("required"), parallel=False)


def is_tool_call(text: str) -> bool:
    """Whether `text` is exactly one hermes-format call of TOOL whose arguments fit its schema."""
    calls = parse_tool_output(text, "hermes").complete_calls
    if len(calls) != 1 or calls[0].name != TOOL.name:
        return False
    try:
        args = json.loads(calls[0].arguments)
    except ValueError:
        return False
    props = TOOL.parameters["properties"]
    return isinstance(args, dict) and set(args) == set(props) and all(
        _fits_property(args[k], spec) for k, spec in props.items())


KINDS = {k.name: k for k in (
    ConstraintKind("json_schema", json.dumps(EXTRACTION_SCHEMA),
                   "Extract the person as JSON with name, age, city, job, has_pets, status.\nJSON: ", is_extraction),
    ConstraintKind("regex", RECORD_REGEX, "Write it as 'Name: <name>; Age: <age>; City: <city>.'\nAnswer: ",
                   lambda text: re.fullmatch(RECORD_REGEX, text) is not None),
    ConstraintKind("ebnf", PEOPLE_GBNF, "List the person as 'Name (age, City)'.\nAnswer: ",
                   lambda text: re.fullmatch(PEOPLE_REGEX, text) is not None),
    ConstraintKind("tool_call", TOOL_CALL_GBNF or "", "Call record_person with the person's name, age and city.\n",
                   is_tool_call, key="ebnf"),
)}

NAMES = ["Alice", "Bob", "Chen", "Dmitri", "Elena", "Farah", "Gustavo", "Hiro"]
CITIES = ["Paris", "Lagos", "Osaka", "Lima", "Oslo", "Austin", "Pune", "Cairo"]
JOBS = ["baker", "nurse", "pilot", "teacher", "engineer", "farmer", "lawyer", "painter"]


def prompts(n: int, kind: ConstraintKind, seed: int = 0) -> list[str]:
    """`n` short biographies (deterministic for a seed), each followed by the kind's instruction."""
    out = []
    for i in range(seed, seed + n):  # every field cycles at its own period: n distinct prompts
        pets = "has two cats" if i % 3 else "has no pets"
        out.append(f"{NAMES[i % 8]} is a {20 + i % 51}-year-old {JOBS[i // 8 % 8]} from {CITIES[i // 64 % 8]} who "
                   f"is {STATUSES[i % 4]} and {pets}.\n{kind.instruction}")
    return out


@dataclass(frozen=True)
class LoopCounts:
    """What the engine's counters say one generate call cost (deltas of monotonic counters)."""

    steps: int
    decode_steps: int
    overlapped_steps: int
    jump_forward_tokens: int

    @classmethod
    def between(cls, before: dict, after: dict) -> LoopCounts:
        return cls(**{f.name: after[f.name] - before[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class Row:
    """One line of the table; a run that could not be measured has `note` set and no numbers."""

    device: str
    backend: str
    constraint: str
    batch: int
    jump_forward: bool
    constrained_s: float | None = None
    free_s: float | None = None
    tokens: int | None = None
    constrained: LoopCounts | None = None
    free: LoopCounts | None = None
    grammar_us_p50: float | None = None
    grammar_us_p90: float | None = None
    invalid: int | None = None
    ratio_range: tuple[float, float] | None = None  # the single pairs' constrained / free, with --repeats > 1
    note: str = ""


def timed_generate(engine: Engine, texts: list[str], params: list[dict],
                   trace: tuple[str, int] | None = None) -> tuple[list[dict], float, LoopCounts]:
    """One generate call from an empty prefix cache: its outputs, wall seconds and engine counts; with `trace`
    (a label, how many slow steps), the steps' summary printed (`print_trace`)."""
    engine.flush_cache()
    engine.take_step_records()  # forget the steps before this call
    before = engine.get_stats()
    start = time.perf_counter()
    outs = cast(list[dict], engine.generate(texts, params))  # a list of prompts: a list of outputs
    wall = time.perf_counter() - start
    if trace is not None:
        print_trace(trace[0], engine.take_step_records(), trace[1])
    return outs, wall, LoopCounts.between(before, engine.get_stats())


def print_trace(label: str, records: list[StepRecord], slowest: int) -> None:
    """A run's steps: the loop's seconds per forward path, the median step's parts, and the slowest steps."""
    if not records:
        return
    paths: dict[str, list[float]] = {}
    for r in records:
        paths.setdefault(r.path.split(" ")[0], []).append(r.wall_s)
    walls = sorted(r.wall_s for r in records)
    print(f"trace {label}: {len(records)} steps, {sum(walls):.3f} s, median {walls[len(walls) // 2] * 1e3:.2f} ms; "
          + ", ".join(f"{p} {len(w)} steps {sum(w):.3f} s" for p, w in sorted(paths.items())))
    for r in sorted(records, key=lambda r: -r.wall_s)[:slowest]:
        print(f"trace {label}:   step {r.index}: {r.wall_s * 1e3:.1f} ms, {r.mode} of {r.batch_size} ({r.tokens} "
              f"tokens), {r.path}{', overlapped' if r.overlapped else ''}; forward {r.forward_s * 1e3:.1f} ms, "
              f"grammar {r.grammar_s * 1e3:.1f} ms, sample {r.sample_s * 1e3:.1f} ms")


def measure(engine: Engine, head: Row, kind: ConstraintKind, max_new_tokens: int, trace: int = 0,
            repeats: int = 1) -> Row:
    """The constrained run of `head.batch` prompts, then the same prompts free for the same tokens, `repeats`
    times (`trace`: the slowest steps to print of each, with the step trace on, first pair only)."""
    texts = prompts(head.batch, kind)
    label = f"{kind.name} b{head.batch} jump-forward {'on' if head.jump_forward else 'off'}"
    engine.core.call(engine.core.grammar_us_per_request.clear)
    walls: list[tuple[float, float]] = []
    invalid = 0
    for r in range(repeats):
        traced = trace if r == 0 else 0
        outs, constrained_s, counts = timed_generate(
            engine, texts,
            [{"temperature": 0.0, "max_new_tokens": max_new_tokens, kind.param: kind.source}] * len(texts),
            (f"{label} constrained", traced) if traced else None)
        lengths = [len(o["output_ids"]) for o in outs]
        invalid += sum(o["meta_info"]["finish_reason"]["type"] == "abort" or not kind.is_valid(o["text"])
                       for o in outs)
        free_outs, free_s, free_counts = timed_generate(
            engine, texts, [{"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True} for n in lengths],
            (f"{label} free", traced) if traced else None)
        made = [len(o["output_ids"]) for o in free_outs]
        if made != lengths:
            raise RuntimeError(f"the free run made {sum(made)} tokens, not the constrained run's {sum(lengths)}")
        if r == 0:
            first = (sum(lengths), counts, free_counts)
        walls.append((constrained_s, free_s))
    stats = engine.get_stats()
    ratios = [c / f for c, f in walls]
    tokens, constrained, free = first
    return replace(head, constrained_s=statistics.median(c for c, _ in walls),
                   free_s=statistics.median(f for _, f in walls), tokens=tokens, constrained=constrained, free=free,
                   invalid=invalid, grammar_us_p50=stats["grammar_us_per_request_step_p50"],
                   grammar_us_p90=stats["grammar_us_per_request_step_p90"],
                   ratio_range=(min(ratios), max(ratios)) if repeats > 1 else None)


def warm_up(engine: Engine, batches: list[int], kinds: list[ConstraintKind], max_new_tokens: int) -> None:
    """Untimed: each batch size's first steps, free and under each kind (kernel specializations, the allocator's
    blocks for that many masked rows), and each kind's grammar compile, on prompts the timed runs do not use."""
    for b in batches:
        engine.generate(prompts(b, kinds[0], seed=1000), {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True})
    for kind in kinds:
        with contextlib.suppress(Exception):  # measure() reports a failure on the kind's rows
            engine.generate(prompts(2, kind, seed=1000),
                            {"temperature": 0.0, "max_new_tokens": max_new_tokens, kind.param: kind.source})
            for b in batches:
                engine.generate(prompts(b, kind, seed=1000),
                                {"temperature": 0.0, "max_new_tokens": 8, kind.param: kind.source})


def run_engine(options: dict, heads: list[Row], kinds: list[ConstraintKind], max_new_tokens: int,
               trace: int = 0, repeats: int = 1) -> list[Row]:
    """Every (batch, kind) row of one engine; the engine is shut down and its memory freed before returning."""
    label = f"{heads[0].backend}, jump-forward {'on' if heads[0].jump_forward else 'off'}"
    start = time.perf_counter()
    try:
        engine = Engine(**options)
    except Exception as exc:
        return [replace(h, note=f"engine failed to start: {type(exc).__name__}: {exc}") for h in heads]
    print(f"{label}: engine ready in {time.perf_counter() - start:.1f} s", flush=True)
    rows = []
    try:
        warm_up(engine, sorted({h.batch for h in heads}), kinds, max_new_tokens)
        for head in heads:
            try:
                rows.append(measure(engine, head, KINDS[head.constraint], max_new_tokens, trace, repeats))
            except Exception as exc:
                rows.append(replace(head, note=f"{type(exc).__name__}: {exc}"))
            print(f"{label}: {format_row(rows[-1])}", flush=True)
    finally:
        engine.shutdown()
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            print(f"{label}: engine freed, {torch.cuda.memory_allocated() / 2**30:.2f} GiB still allocated",
                  flush=True)
    return rows


def model_options(model: str, small: bool, device: str) -> tuple[dict, str]:
    """Engine options for --model / --small, and the model's name for the table's title."""
    if not small and model != LLAMA3_8B_SHAPE:
        return {"model_path": None if model == DEFAULT_MODEL else model}, model
    from radixgen.tokenizer import Tokenizer

    tokenizer = SMOLLM2_TOKENIZER if small else QWEN3_TOKENIZER  # the smaller vocabulary keeps a smoke run quick
    vocab = Tokenizer.from_file(str(tokenizer)).vocab_size  # the model's vocabulary is the tokenizer's
    config = {**(SMALL if small else LLAMA3_8B), "vocab_size": vocab}
    dtype = "bfloat16" if device == "cuda" else "float32"
    name = (f"{'tiny' if small else 'Llama-3-8B-shaped'} random-weight model, {dtype}, "
            f"tokenizer {tokenizer.name} ({vocab:,} ids)")
    return {"load_format": "dummy", "dummy_config": config, "tokenizer_path": str(tokenizer), "dtype": dtype}, name


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _pair(r: Row, name: str) -> str:
    """A LoopCounts field as "constrained / free"."""
    if r.constrained is None or r.free is None:
        return "-"
    return f"{getattr(r.constrained, name)} / {getattr(r.free, name)}"


def format_row(r: Row) -> str:
    ratio = f"{r.constrained_s / r.free_s:.2f}x" if r.constrained_s is not None and r.free_s else "-"
    if r.ratio_range is not None:
        ratio += f" ({r.ratio_range[0]:.2f}-{r.ratio_range[1]:.2f})"
    jumped = None if r.constrained is None else r.constrained.jump_forward_tokens
    return (f"| {r.device} | {r.backend} | {r.constraint} | {r.batch} | {'on' if r.jump_forward else 'off'} "
            f"| {_num(r.constrained_s, '.2f')} | {_num(r.free_s, '.2f')} | {ratio} | {_num(r.tokens, ',')} "
            f"| {_num(jumped, ',')} | {_pair(r, 'steps')} | {_pair(r, 'decode_steps')} "
            f"| {_pair(r, 'overlapped_steps')} | {_num(r.grammar_us_p50, '.1f')} | {_num(r.grammar_us_p90, '.1f')} "
            f"| {_num(r.invalid, 'd')} | {r.note} |")


TABLE_HEAD = ("| device | backend | constraint | batch | jump_forward | constrained wall s | free wall s | ratio "
              "| tokens | jumped | steps | decode steps | overlapped steps | grammar µs/request-step p50 | p90 "
              "| invalid | note |\n|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--model", default=None, help=f"a model path, {DEFAULT_MODEL!r} or {LLAMA3_8B_SHAPE!r} "
                    f"(default: {LLAMA3_8B_SHAPE} on CUDA, {DEFAULT_MODEL} on the CPU)")
    ap.add_argument("--small", action="store_true", help="a tiny random-weight model (a smoke run of the script)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS))
    ap.add_argument("--backends", nargs="+", choices=GRAMMAR_BACKENDS, default=list(installed_grammar_backends()),
                    help="default: those installed")
    ap.add_argument("--jump-forward", nargs="+", choices=["on", "off"], default=["on", "off"])
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--json", type=Path, default=None, help="also write every row here")
    ap.add_argument("--repeats", type=int, default=1, metavar="N",
                    help="run each cell's constrained / free pair N times: median walls, the pairs' ratio range")
    ap.add_argument("--trace", type=int, default=0, metavar="N",
                    help="print each timed run's time per forward path and its N slowest steps (the step trace)")
    args = ap.parse_args(argv)

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    model = args.model or (LLAMA3_8B_SHAPE if device == "cuda" else DEFAULT_MODEL)
    options, model_name = model_options(model, args.small, device)
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    max_b = max(args.batches)
    options.update(device=device, max_running_requests=max_b, cuda_graph_max_bs=max_b,
                   max_total_tokens=max_b * (256 + args.max_new_tokens) + 256, step_trace=8192 if args.trace else 0)
    kinds = [KINDS[k] for k in args.kinds]
    rows: list[Row] = []
    for backend in args.backends:
        for jf in (setting == "on" for setting in args.jump_forward):
            heads = [Row(device_name, backend, k.name, b, jf) for b in args.batches for k in kinds]
            rows += run_engine({**options, "grammar_backend": backend, "enable_jump_forward": jf}, heads, kinds,
                               args.max_new_tokens, args.trace, args.repeats)

    print(f"\n{model_name}; greedy, at most {args.max_new_tokens} new tokens; "
          f"steps, decode steps and overlapped steps are constrained / free"
          + (f"; walls: medians of {args.repeats} pairs, the ratio's range over them" if args.repeats > 1 else
             ""))
    print(TABLE_HEAD)
    for r in rows:
        print(format_row(r))
    if args.json:
        args.json.write_text(json.dumps({"model": model_name, "rows": [asdict(r) for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
