"""Open-loop serving benchmark: Poisson arrivals against a live `radixgen serve`, shared-prefix vs no sharing.

Each request is a streamed `/v1/completions` call (greedy, `ignore_eos`, fixed output length); arrivals follow a
Poisson process at `--rate` requests/s regardless of how fast the server answers (open loop), so queueing shows
up in the latencies. Per workload: throughput, time to first token and inter-token latency percentiles, and the
cache hit rate (cached / prompt tokens from each response's `usage`). The cache is flushed between workloads.
Writes a markdown table and a plot (matplotlib, when installed) to `--out-dir`.

    python benchmarks/serving.py                       # starts `radixgen serve` on the default model
    python benchmarks/serving.py --url http://127.0.0.1:30000 --rate 8 --num-requests 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

WORDS = [
    "alpha", "beta", "gamma", "delta", "river", "mountain", "city", "forest", "ocean", "model", "token",
    "prefix", "cache", "tree", "question", "answer", "because", "therefore", "system", "user", "assistant",
    "fast", "slow", "bright", "dark", "light", "stone", "water", "fire", "cloud",
]


@dataclass
class Result:
    ok: bool
    ttft: float = float("nan")
    itls: list[float] = field(default_factory=list)
    e2e: float = float("nan")
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def shared_prefix_prompts(rng: random.Random, n: int, groups: int, prefix_words: int, suffix_words: int) -> list[str]:
    """`groups` long system prefixes, each followed by many distinct short questions (round-robin)."""
    prefixes = [f"System {g}: {sentence(rng, prefix_words)}\n" for g in range(groups)]
    return [f"{prefixes[i % groups]}Question {i}: {sentence(rng, suffix_words)}\nAnswer:" for i in range(n)]


def unshared_prompts(rng: random.Random, n: int, words: int) -> list[str]:
    """Prompts of the same length that share no prefix (each starts with its own number)."""
    return [f"{i} {sentence(rng, words)}\nAnswer:" for i in range(n)]


async def one_request(session: aiohttp.ClientSession, url: str, prompt: str, output_len: int) -> Result:
    body = {"model": "bench", "prompt": prompt, "max_tokens": output_len, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    last = None
    result = Result(ok=False)
    async with session.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            return result
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            now = time.perf_counter()
            if event.get("usage"):
                usage = event["usage"]
                result.prompt_tokens = usage["prompt_tokens"]
                result.completion_tokens = usage["completion_tokens"]
                result.cached_tokens = usage["prompt_tokens_details"]["cached_tokens"]
            if event.get("choices") and event["choices"][0]["text"]:
                if last is None:
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                last = now
    result.e2e = time.perf_counter() - start
    result.ok = True
    return result


async def run_workload(url: str, prompts: list[str], rate: float, output_len: int,
                       seed: int) -> tuple[list[Result], float]:
    """Fire the prompts at Poisson arrival times; returns the results and the wall time."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=len(prompts))
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        tasks = []
        for prompt, gap in zip(prompts, gaps):
            await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(one_request(session, url, prompt, output_len)))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


def summarize(name: str, results: list[Result], wall: float) -> dict:
    ok = [r for r in results if r.ok]
    ttft = np.array([r.ttft for r in ok]) * 1000
    itl = np.array([x for r in ok for x in r.itls]) * 1000
    prompt = sum(r.prompt_tokens for r in ok)

    def pct(a, q):
        return float(np.percentile(a, q)) if len(a) else float("nan")

    return {"workload": name, "requests": len(results), "ok": len(ok), "wall_s": wall,
            "req_per_s": len(ok) / wall, "out_tok_per_s": sum(r.completion_tokens for r in ok) / wall,
            "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90), "ttft_p99": pct(ttft, 99),
            "itl_p50": pct(itl, 50), "itl_p90": pct(itl, 90), "itl_p99": pct(itl, 99),
            "e2e_p50_s": pct(np.array([r.e2e for r in ok]), 50),
            "cache_hit_rate": sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
            "mean_prompt_tokens": prompt / max(len(ok), 1), "_ttft": ttft, "_itl": itl}


def table(rows: list[dict]) -> str:
    head = ("| workload | ok/sent | req/s | out tok/s | TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms "
            "| e2e p50 s | prompt tok | cache hit |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['ok']}/{r['requests']} | {r['req_per_s']:.2f} | {r['out_tok_per_s']:.1f} "
                     f"| {r['ttft_p50']:.0f} / {r['ttft_p90']:.0f} / {r['ttft_p99']:.0f} "
                     f"| {r['itl_p50']:.0f} / {r['itl_p90']:.0f} / {r['itl_p99']:.0f} | {r['e2e_p50_s']:.2f} "
                     f"| {r['mean_prompt_tokens']:.0f} | {r['cache_hit_rate']:.1%} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for r in rows:
        for ax, key in zip(axes, ("_ttft", "_itl")):
            data = np.sort(r[key])
            if len(data):
                ax.plot(data, np.arange(1, len(data) + 1) / len(data), label=f"{r['workload']} "
                        f"(hit {r['cache_hit_rate']:.0%})")
    axes[0].set(xlabel="time to first token (ms)", ylabel="fraction of requests", title="TTFT CDF")
    axes[1].set(xlabel="inter-token latency (ms)", ylabel="fraction of tokens", title="ITL CDF")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def post(url: str, path: str) -> None:
    req = urllib.request.Request(url + path, data=b"{}", method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60):
        pass


def launch(model: str | None, extra: list[str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "radixgen", "serve", "--port", str(port), "--log-level", "warning", *extra]
    if model:
        cmd += ["--model", model]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        assert proc.poll() is None, "the server exited"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server did not become ready")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="a running server; default: start `radixgen serve` for the run")
    p.add_argument("--model", default=None, help="model for the launched server")
    p.add_argument("--server-arg", action="append", default=[], help="extra `radixgen serve` flag (repeatable)")
    p.add_argument("--num-requests", type=int, default=40)
    p.add_argument("--rate", type=float, default=4.0, help="Poisson arrival rate, requests/s")
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--prefix-words", type=int, default=120, help="words of each shared system prefix")
    p.add_argument("--suffix-words", type=int, default=12)
    p.add_argument("--groups", type=int, default=2, help="distinct shared prefixes in the shared-prefix mix")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="benchmarks/results/serving")
    args = p.parse_args(argv)
    proc = None
    url = args.url
    if url is None:
        proc, url = launch(args.model, args.server_arg)
    try:
        rng = random.Random(args.seed)
        workloads = {
            "shared-prefix": shared_prefix_prompts(rng, args.num_requests, args.groups, args.prefix_words,
                                                   args.suffix_words),
            "no-sharing": unshared_prompts(rng, args.num_requests, args.prefix_words + args.suffix_words),
        }
        rows = []
        for name, prompts in workloads.items():
            post(url, "/flush_cache")
            results, wall = asyncio.run(run_workload(url, prompts, args.rate, args.output_len, args.seed))
            rows.append(summarize(name, results, wall))
            print(f"{name}: {rows[-1]['ok']}/{len(prompts)} ok in {wall:.1f}s", file=sys.stderr)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = table(rows)
    settings = (f"{args.num_requests} requests per workload, Poisson {args.rate}/s, output {args.output_len} tokens, "
                f"prefix {args.prefix_words} words x {args.groups} groups + {args.suffix_words}-word questions")
    (out / "serving.md").write_text(f"{settings}\n\n{text}\n")
    has_plot = plot(rows, out / "serving.png")
    print(settings)
    print(text)
    picture = f" and {out / 'serving.png'}" if has_plot else " (no matplotlib: no plot)"
    print(f"\nwrote {out / 'serving.md'}" + picture)


if __name__ == "__main__":
    main()
