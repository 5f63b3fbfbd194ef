"""Cost of constrained decoding in the engine, and the decode steps jump-forward saves.

Workload: the JSON-extraction example at batch 32 (schema-constrained extraction from free text), greedy.
Runs: constrained with jump-forward, constrained without it, and unconstrained, on one engine each.
Reports engine steps, time in the forward vs in grammar work (mask filling, matcher advances, jump-forward),
and the share of decode time spent on the grammar.

    python benchmarks/constrained_decoding.py [--model PATH] [--batch 32]
"""

from __future__ import annotations

import argparse
import json
import random
import time

from radixgen.runtime.engine import Engine

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "maxLength": 24},
        "occupation": {"type": "string", "maxLength": 32},
        "has_pets": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "occupation", "has_pets"],
}
NAMES = ["Alice", "Bob", "Chen", "Dmitri", "Elena", "Farah", "Gustavo", "Hiro"]
CITIES = ["Paris", "Lagos", "Osaka", "Lima", "Oslo", "Austin", "Pune", "Cairo"]
JOBS = ["baker", "nurse", "pilot", "teacher", "engineer", "farmer", "lawyer", "painter"]


def prompts(n: int) -> list[str]:
    rng = random.Random(0)
    out = []
    for _ in range(n):
        name, city, job = rng.choice(NAMES), rng.choice(CITIES), rng.choice(JOBS)
        pets = rng.choice(["has two cats", "has no pets"])
        out.append(f"{name} is a {rng.randint(20, 70)}-year-old {job} from {city} who {pets}.\n"
                   f"Extract the person as JSON with name, age, city, occupation, has_pets.\nJSON: ")
    return out


def run(engine: Engine, texts: list[str], params: dict) -> dict:
    engine.flush_cache()
    before = engine.get_stats()
    t0 = time.perf_counter()
    outs = engine.generate(texts, params)
    wall = time.perf_counter() - t0
    after = engine.get_stats()
    d = {k: after[k] - before[k] for k in ("steps", "decode_steps", "forward_seconds", "grammar_seconds",
                                           "sample_seconds", "generated_tokens", "jump_forward_tokens")}
    d["wall"] = wall
    d["valid"] = sum(_valid(o["text"]) for o in outs) if "json_schema" in params else None
    return d


def _valid(text: str) -> bool:
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    return set(obj) == set(SCHEMA["required"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    texts = prompts(args.batch)
    constrained = {"temperature": 0, "max_new_tokens": args.max_new_tokens, "json_schema": json.dumps(SCHEMA)}
    results = {}
    for name, jf, params in [("schema + jump-forward", True, constrained),
                             ("schema, no jump-forward", False, constrained),
                             ("unconstrained", True, {"temperature": 0, "max_new_tokens": args.max_new_tokens})]:
        with Engine(args.model, enable_jump_forward=jf) as engine:
            run(engine, texts[:2], params)  # warm-up: grammar compile cache, allocator
            results[name] = run(engine, texts, params)
    print(f"batch {args.batch}, greedy, max_new_tokens {args.max_new_tokens}")
    print(f"{'run':<26} {'valid':>6} {'tokens':>7} {'jumped':>7} {'steps':>6} {'decode steps':>12} "
          f"{'forward s':>9} {'grammar s':>9} {'grammar/decode':>14} {'wall s':>7}")
    for name, r in results.items():
        share = r["grammar_seconds"] / max(r["forward_seconds"] + r["grammar_seconds"] + r["sample_seconds"], 1e-9)
        valid = "-" if r["valid"] is None else f"{r['valid']}/{args.batch}"
        print(f"{name:<26} {valid:>6} {r['generated_tokens']:>7} {r['jump_forward_tokens']:>7} {r['steps']:>6} "
              f"{r['decode_steps']:>12} {r['forward_seconds']:>9.2f} {r['grammar_seconds']:>9.3f} "
              f"{share:>13.1%} {r['wall']:>7.2f}")
    a, b = results["schema + jump-forward"], results["schema, no jump-forward"]
    print(f"jump-forward: {1 - a['decode_steps'] / max(b['decode_steps'], 1):.1%} fewer decode steps")


if __name__ == "__main__":
    main()
