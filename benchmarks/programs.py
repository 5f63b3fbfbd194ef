"""Compiled plans against eager execution of radixgen programs, on one in-process engine.

Two workloads: a few-shot QA batch (one long shared prefix, many short questions) and a tree-of-thought batch
(each program forks 3 branches, joins, selects, and answers). Each runs eagerly (`run_batch`, one thread per
program) and compiled (`fn.compile().run_batch`, wave by wave), from an empty cache, with ignore_eos so both do
the same decoding work. Reported: engine steps, tokens forwarded, cached prompt tokens (engine.get_stats()
deltas) and wall time (fastest of --repeat runs, alternating the order).

    python benchmarks/programs.py [--model PATH] [--batch 16] [--max-tokens 16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import radixgen as sgl
from radixgen.lang.engine_backend import EngineBackend

FEW_SHOT = "".join(
    f"Q: What is the capital of {c}?\nA: {a}\n\n"
    for c, a in [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Egypt", "Cairo"),
                 ("Canada", "Ottawa"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Norway", "Oslo")]
)
COUNTRIES = ["Spain", "Germany", "Brazil", "India", "China", "Chile", "Greece", "Poland", "Sweden", "Mexico",
             "Turkey", "Ghana", "Cuba", "Iran", "Iraq", "Fiji", "Laos", "Mali", "Oman", "Chad"]


@sgl.function
def few_shot(s, country, max_tokens=16):
    s += "Answer with the capital city.\n\n" + FEW_SHOT
    s += "Q: What is the capital of " + country + "?\nA:" + sgl.gen("answer", max_tokens=max_tokens)


@sgl.function
def tree_of_thought(s, question, max_tokens=16):
    s += "Think step by step and answer the question.\nQuestion: " + question + "\n"
    branches = s.fork(3)
    for i, branch in enumerate(branches):
        branch += f"Approach {i + 1}:" + sgl.gen("thought", max_tokens=max_tokens) + "\n"
    branches.join()
    for i in range(3):
        s += f"Approach {i + 1}:" + branches[i]["thought"] + "\n"
    s += "The most convincing approach is number" + sgl.select("best", choices=[" 1", " 2", " 3"])
    s += ".\nFinal answer:" + sgl.gen("answer", max_tokens=max_tokens)


def measure(engine: Any, run: Callable[[], list]) -> dict[str, float]:
    engine.flush_cache()
    before = engine.get_stats()
    start = time.perf_counter()
    states = run()
    wall = time.perf_counter() - start
    after = engine.get_stats()
    errors = [s.error() for s in states if s.error()]
    if errors:
        raise RuntimeError(f"{len(errors)} programs failed, first: {errors[0]!r}")
    delta = {k: after[k] - before[k] for k in ("steps", "forward_tokens", "cached_tokens", "prompt_tokens")}
    return {**delta, "wall_s": wall}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode; the fastest is reported")
    args = parser.parse_args(argv)

    engine = sgl.Engine(args.model)
    backend = EngineBackend(engine)
    options = {"backend": backend, "temperature": 0, "ignore_eos": True}
    countries = [COUNTRIES[i % len(COUNTRIES)] for i in range(args.batch)]
    workloads = {
        "few-shot batch": (few_shot.bind(max_tokens=args.max_tokens), [{"country": c} for c in countries]),
        "tree-of-thought": (tree_of_thought.bind(max_tokens=args.max_tokens),
                            [{"question": f"What is {i + 2} times {i + 7}?"} for i in range(max(1, args.batch // 4))]),
    }
    engine.generate("warm up", {"max_new_tokens": 2})
    rows = []
    for name, (fn, batch) in workloads.items():
        plan = fn.compile()
        runs: dict[str, list[dict[str, float]]] = {"eager": [], "compiled": []}
        for r in range(args.repeat):  # alternate the order; the machine is shared, so keep the fastest run
            order = ["eager", "compiled"] if r % 2 == 0 else ["compiled", "eager"]
            for mode in order:
                if mode == "eager":
                    runs[mode].append(measure(engine, lambda fn=fn, batch=batch: fn.run_batch(batch, **options)))
                else:
                    runs[mode].append(measure(engine, lambda plan=plan, batch=batch: plan.run_batch(batch, **options)))
        for mode, label in (("eager", "eager"), ("compiled", f"compiled ({plan.stats.waves} waves)")):
            rows.append((name, len(batch), label, min(runs[mode], key=lambda m: m["wall_s"])))
    engine.shutdown()

    print(f"{'workload':<16} {'programs':>8} {'mode':<22} {'steps':>6} {'fwd tokens':>10} {'cached':>7} {'wall s':>7}")
    for name, n, mode, m in rows:
        print(f"{name:<16} {n:>8} {mode:<22} {m['steps']:>6} {m['forward_tokens']:>10} {m['cached_tokens']:>7} "
              f"{m['wall_s']:>7.2f}")


if __name__ == "__main__":
    main()
