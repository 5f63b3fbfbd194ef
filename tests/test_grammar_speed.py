"""Grammar compile and mask timings, the method of ../shared/grammar-bench/README.md (one thread, CPU time).

As a script, on the JSONSchemaBench sample (read in place from the shared folder beside the repository, or from
the path given; never copied into the project):

    python tests/test_grammar_speed.py [PATH] [N] [--qwen]

For each schema: compile, then walk each valid instance token by token (mask before every token, the token
must be allowed, advance), EOS must be allowed at the end; mask times exclude the first mask of an instance.
Times are thread CPU time, so other processes on a shared machine do not inflate them.
"""

from __future__ import annotations

import ast
import gzip
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from grammar_vocabs import VOCABS, Encode, is_allowed  # tests/ is on sys.path under pytest and as a script

from radixgen.grammars import (
    Grammar,
    GrammarError,
    Vocabulary,
    clear_cache,
    compile_grammar,
    load_builtin_grammar,
)

SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "grammar-bench" / "jsonschemabench-sample.jsonl.gz"


@dataclass
class Timings:
    compile_ms: list[float]
    mask_us: list[float]
    accepted: int = 0
    instances: int = 0

    def summary(self) -> str:
        c, m = np.array(self.compile_ms), np.array(self.mask_us)
        return (f"compile median {np.median(c):.1f} ms p90 {np.percentile(c, 90):.1f} ms; "
                f"mask median {np.median(m):.1f} us p99 {np.percentile(m, 99):.0f} us (n={m.size}); "
                f"valid accepted {self.accepted}/{self.instances}")


def walk_instance(grammar: Grammar, vocab: Vocabulary, encode: Encode, text: str, timings: Timings) -> bool:
    m = grammar.matcher()
    row = vocab.new_mask()
    for i, tid in enumerate(encode(text)):
        t = time.thread_time()
        m.fill_mask(row)
        if i:
            timings.mask_us.append((time.thread_time() - t) * 1e6)
        if not is_allowed(row, tid) or not m.advance(tid):
            return False
    m.fill_mask(row)
    return is_allowed(row, vocab.eos_token_ids[0])


def bench_schemas(path: Path, vocab_name: str, limit: int) -> tuple[Timings, int, int, list[str]]:
    from radixgen.grammars import compile_json_schema

    vocab, encode = VOCABS[vocab_name]()
    timings = Timings([], [])
    compiled = total = 0
    refused: list[str] = []
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f][:limit]
    for r in rows:
        total += 1
        schema = r["schema"] if isinstance(r["schema"], (dict, bool)) else ast.literal_eval(r["schema"])
        tests = r["tests"] if isinstance(r["tests"], list) else ast.literal_eval(r["tests"])
        clear_cache()
        t = time.thread_time()
        try:
            grammar = compile_json_schema(schema, vocab)
        except GrammarError as exc:
            refused.append(f"{r.get('file')}: {str(exc)[:100]}")
            continue
        timings.compile_ms.append((time.thread_time() - t) * 1e3)
        compiled += 1
        for test in tests:
            if test["valid"]:
                timings.instances += 1
                timings.accepted += walk_instance(grammar, vocab, encode,
                                                  json.dumps(test["data"], ensure_ascii=False), timings)
    return timings, compiled, total, refused


DOCS = [{"id": i, "name": f"item {i}", "tags": ["a", "b"][: i % 3], "price": i * 1.25, "ok": i % 2 == 0,
         "nested": {"depth": [[i]], "note": None}} for i in range(8)]


@pytest.mark.slow
def test_builtin_json_grammar_speed() -> None:
    """Loose bounds (a shared CI machine): warm masks are table lookups, cold ones stay in milliseconds."""
    vocab, encode = VOCABS["gpt2"]()
    clear_cache()
    t = time.thread_time()
    grammar = compile_grammar(load_builtin_grammar("json"), vocab)
    timings = Timings([(time.thread_time() - t) * 1e3], [])
    for doc in DOCS:
        timings.instances += 1
        timings.accepted += walk_instance(grammar, vocab, encode, json.dumps(doc), timings)
    print(timings.summary())  # timings are reported, never asserted (benchmarks/grammar_bench.py holds the numbers)
    assert timings.accepted == timings.instances


@pytest.mark.slow
@pytest.mark.skipif(not SAMPLE.exists(), reason=f"{SAMPLE} not found (the JSONSchemaBench sample)")
def test_sample_schemas_speed() -> None:
    """The first schemas of the sample all compile; their timings are reported, never asserted."""
    result, compiled, total, refused = bench_schemas(SAMPLE, "gpt2", 10)
    print(f"gpt2: compiled {compiled}/{total}; {result.summary()}")
    assert compiled == total, refused


if __name__ == "__main__":
    positional = [a for a in sys.argv[1:] if not a.startswith("--")]
    data = next((Path(a) for a in positional if not a.isdigit()), SAMPLE)
    n = next((int(a) for a in positional if a.isdigit()), 30)
    if not data.exists():
        sys.exit(f"{data} not found: give the path of jsonschemabench-sample.jsonl.gz")
    for name in ["gpt2"] + (["qwen3"] if "--qwen" in sys.argv else []):
        result, ok, of, refused = bench_schemas(data, name, n)
        print(f"{name}: compiled {ok}/{of}; {result.summary()}")
        for line in refused:
            print("  refused:", line)
