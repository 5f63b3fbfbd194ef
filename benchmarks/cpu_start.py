"""What a newcomer waits for on the CPU: `radixgen generate` as a fresh process, by thread count.

Each run starts `radixgen generate PROMPT --max-new-tokens 16 --threads T` and records the time to its first
byte on stdout (the first token, after Python, torch's import, the engine's start and the prefill), the time to
exit, and the process's peak resident memory. The first run of all warms the weight cache and is not counted.
A second table times `import torch` alone, the part of the start no engine change can remove.

    python benchmarks/cpu_start.py [--threads 1 2] [--repeats 2]
"""

from __future__ import annotations

import argparse
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    ap.add_argument("--repeats", type=int, default=2)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
