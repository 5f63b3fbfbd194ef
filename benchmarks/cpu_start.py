"""What a newcomer waits for on the CPU: `radixgen generate` as a fresh process, by thread count.

Each run starts `radixgen generate PROMPT --max-new-tokens 16 --threads T` and records the time to its first
byte on stdout (the first token, after Python, torch's import, the engine's start and the prefill), the time to
exit, and the process's peak resident memory. The first run of all warms the weight cache and is not counted.
A second table times `import torch` alone, the part of the start no engine change can remove. A third follows
one process's resident memory (VmRSS, and its peak VmHWM) through an engine's life: after `import torch`, after
the engine is built, after a first request and after a batch, with the bytes its weights hold (each distinct
parameter storage once), so the rest is what the engine adds to torch and the weights.

    python benchmarks/cpu_start.py [--threads 1 2] [--repeats 2] [--dtype auto]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PROMPT = "What is the capital of France?"


def run_once(threads: int) -> tuple[float, float, float]:
    """(first byte s, exit s, peak RSS MB) of one `radixgen generate`."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "radixgen", "generate", PROMPT, "--max-new-tokens", "16",
                             "--threads", str(threads)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    proc.stdout.read(1)
    first = time.perf_counter() - start
    proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (peak RSS in KB)
    proc.returncode = os.waitstatus_to_exitcode(status)
    done = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"radixgen generate exited with {proc.returncode}")
    return first, done, usage.ru_maxrss / 1024


# Run in a fresh process: one JSON line per stage, with VmRSS and VmHWM in MB.
MEMORY_STAGES = r"""
import json, sys

def stage(name, **extra):
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    mb = {k: int(status[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}
    print(json.dumps({"stage": name, **mb, **extra}), flush=True)

stage("python")
import torch
stage("import torch")
import radixgen
engine = radixgen.Engine(cpu_threads=int(sys.argv[1]), dtype=sys.argv[2], device="cpu")
storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in engine.runner.model.parameters()}
stage("engine built", weights=sum(storages.values()) / 2**20)
engine.generate("What is the capital of France?", {"max_new_tokens": 16, "temperature": 0})
stage("first request (16 tokens)")
engine.generate(["Tell me a story."] * 8, {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True})
stage("8 requests x 64 tokens")
engine.shutdown()
"""


def memory_stages(threads: int, dtype: str) -> list[dict]:
    """The stages of MEMORY_STAGES, run in a fresh process."""
    out = subprocess.run([sys.executable, "-c", MEMORY_STAGES, str(threads), dtype], check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtype", default="auto", help="the engine's dtype in the memory table")
    args = ap.parse_args()
    run_once(args.threads[0])  # warms the weight cache
    print("| threads | first token s | exit s | peak RSS MB |\n| ---: | ---: | ---: | ---: |")
    for _ in range(args.repeats):
        for threads in args.threads:
            first, done, peak = run_once(threads)
            print(f"| {threads} | {first:.2f} | {done:.2f} | {peak:.0f} |")
    imports = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        imports.append(time.perf_counter() - t)
    print(f"\n`python -c 'import torch'`: {', '.join(f'{x:.2f}' for x in imports)} s")
    stages = memory_stages(args.threads[0], args.dtype)
    print(f"\nresident memory of one engine (dtype {args.dtype}, {args.threads[0]} thread(s)):\n\n"
          "| stage | RSS MB | peak MB |\n| --- | ---: | ---: |")
    for row in stages:
        print(f"| {row['stage']} | {row['VmRSS']:.0f} | {row['VmHWM']:.0f} |")
    torch_mb = next(r["VmRSS"] for r in stages if r["stage"] == "import torch")
    built = next(r for r in stages if r["stage"] == "engine built")
    print(f"\nat the engine's start: torch {torch_mb:.0f} MB + weights {built['weights']:.0f} MB + the rest "
          f"{built['VmRSS'] - torch_mb - built['weights']:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
