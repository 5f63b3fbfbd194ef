"""Tokenizer throughput: radixgen's BPE side by side with Hugging Face `tokenizers` and tiktoken.

Same ~10 MB text (tests/test_tokenizer_corpus.py, seed 1: prose over a Zipf lexicon, code, JSON, many scripts,
emoji, digit/whitespace runs, special-token strings), cut into documents of a few KB, and the same vocabularies:
  * Qwen3: tokenizer.json for radixgen and HF; tiktoken gets ranks built from the same vocabulary;
  * GPT-2: r50k ranks for radixgen and tiktoken; HF gets transformers' TikTokenConverter conversion of them.
Modes: one thread (a loop of `encode(doc)`; radixgen "cold" is a fresh tokenizer with an empty piece cache,
"warm" a second pass), and all cores (`encode_batch`: radixgen worker processes, HF rayon, tiktoken threads).
Times are wall-clock best-of-N; single-thread rows also give CPU time (`process_time`), which is what the
ratios use, because the 2-core dev machine is shared and wall time there measures the neighbours too.

    python benchmarks/tokenizer_bench.py [--mb 10] [--repeats 3] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "tokenizers"
sys.path.insert(0, str(ROOT / "tests"))

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")


@dataclass
class Timing:
    wall: float
    cpu: float


def timed(fn, repeats: int, fresh=None) -> tuple[Timing, object]:
    """Best wall and CPU time over `repeats` calls; `fresh()` (untimed) builds the argument each time."""
    best = Timing(float("inf"), float("inf"))
    result = None
    for _ in range(repeats):
        arg = fresh() if fresh is not None else None
        w, c = time.perf_counter(), time.process_time()
        result = fn(arg)
        best = Timing(min(best.wall, time.perf_counter() - w), min(best.cpu, time.process_time() - c))
    return best, result


def load_peers(vocab: str):
    import tiktoken
    from tokenizers import Tokenizer as HFTokenizer

    from radixgen.tokenizer import Tokenizer
    from radixgen.tokenizer.byte_level import alphabet_to_bytes
    from radixgen.tokenizer.patterns import GPT2, QWEN2

    if vocab == "qwen3":
        ours = lambda: Tokenizer.from_file(FIXTURES / "qwen3")
        hf = HFTokenizer.from_file(str(FIXTURES / "qwen3" / "tokenizer.json"))
        ranks = {alphabet_to_bytes(t): i for t, i in hf.get_vocab(with_added_tokens=False).items()}
        specials = {t: i for t, i in hf.get_vocab(with_added_tokens=True).items() if i >= len(ranks)}
        tk = tiktoken.Encoding("qwen3", pat_str=QWEN2, mergeable_ranks=ranks, special_tokens=specials)
    else:
        from tiktoken.load import load_tiktoken_bpe
        from transformers.convert_slow_tokenizer import TikTokenConverter

        path = FIXTURES / "r50k_base.tiktoken"
        ours = lambda: Tokenizer.from_file(path, pattern="gpt2")
        hf = TikTokenConverter(
            str(path), pattern=GPT2, extra_special_tokens={"<|endoftext|>": 50256}
        ).converted()
        tk = tiktoken.Encoding(
            "gpt2",
            pat_str=GPT2,
            mergeable_ranks=load_tiktoken_bpe(str(path)),
            special_tokens={"<|endoftext|>": 50256},
        )
    return ours, hf, tk


def bench_vocab(vocab: str, docs: list[str], repeats: int) -> list[dict]:
    ours_factory, hf, tk = load_peers(vocab)
    n_bytes = sum(len(d.encode("utf-8")) for d in docs)
    rows: list[dict] = []

    def row(impl, mode, t: Timing, n_tokens, kind="encode", nb=n_bytes):
        rows.append(
            {
                "vocab": vocab,
                "impl": impl,
                "mode": mode,
                "kind": kind,
                "wall": t.wall,
                "cpu": t.cpu,
                "mb_s": nb / 1e6 / t.wall,
                "cpu_mb_s": nb / 1e6 / t.cpu,
                "tok_s": n_tokens / t.wall,
            }
        )

    # one thread
    t, ids = timed(lambda tok: [tok.encode(d, add_special_tokens=False) for d in docs], repeats, ours_factory)
    n_tokens = sum(map(len, ids))
    row("radixgen", "1 thread, cold cache", t, n_tokens)
    warm_tok = ours_factory()
    [warm_tok.encode(d, add_special_tokens=False) for d in docs]
    t, _ = timed(lambda _: [warm_tok.encode(d, add_special_tokens=False) for d in docs], repeats)
    row("radixgen", "1 thread, warm cache", t, n_tokens)
    t, hf_ids = timed(lambda _: [hf.encode(d, add_special_tokens=False).ids for d in docs], repeats)
    row("HF tokenizers", "1 thread", t, n_tokens)
    t, tk_ids = timed(lambda _: [tk.encode(d, allowed_special="all") for d in docs], repeats)
    row("tiktoken", "1 thread", t, n_tokens)
    agree_hf = sum(a == b for a, b in zip(ids, hf_ids)) / len(docs)
    agree_tk = sum(a == b for a, b in zip(ids, tk_ids)) / len(docs)

    # all cores
    cores = os.cpu_count() or 1

    def fresh_pool():
        tok = ours_factory()
        tok.encode_batch(["warm up the worker processes"] * 16384)  # starts workers; caches stay near empty
        time.sleep(3)  # let every spawned worker finish loading the tokenizer before the clock starts
        return tok

    def batch(tok):
        out = tok.encode_batch(docs, add_special_tokens=False)
        tok.close()
        return out

    t, batch_ids = timed(batch, repeats, fresh_pool)
    assert batch_ids == ids
    row("radixgen", f"{cores} processes, cold", t, n_tokens)
    t, _ = timed(lambda _: hf.encode_batch(docs, add_special_tokens=False), repeats)
    row("HF tokenizers", f"{cores} threads", t, n_tokens)
    t, _ = timed(lambda _: tk.encode_batch(docs, num_threads=cores, allowed_special="all"), repeats)
    row("tiktoken", f"{cores} threads", t, n_tokens)

    # decode (one thread), the same ids for everyone
    out_bytes = n_bytes
    t, _ = timed(lambda _: [warm_tok.decode(i) for i in hf_ids], repeats)
    row("radixgen", "1 thread", t, n_tokens, "decode", out_bytes)
    t, _ = timed(lambda _: [hf.decode(i, skip_special_tokens=False) for i in hf_ids], repeats)
    row("HF tokenizers", "1 thread", t, n_tokens, "decode", out_bytes)
    t, _ = timed(lambda _: [tk.decode(i) for i in hf_ids], repeats)
    row("tiktoken", "1 thread", t, n_tokens, "decode", out_bytes)
    for r in rows:
        r["agree_hf"], r["agree_tk"] = agree_hf, agree_tk
    return rows


def render(rows: list[dict], markdown: bool) -> str:
    lines = []
    header = [
        "vocab",
        "op",
        "implementation",
        "mode",
        "wall MB/s",
        "CPU MB/s",
        "M tokens/s",
        "radixgen ÷ this",
    ]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        base = _ours_reference(rows, r)
        single = "1 thread" in r["mode"]
        ratio = (base["cpu_mb_s"] / r["cpu_mb_s"]) if single else (base["mb_s"] / r["mb_s"])
        cells = [
            r["vocab"],
            r["kind"],
            r["impl"],
            r["mode"],
            f"{r['mb_s']:.2f}",
            f"{r['cpu_mb_s']:.2f}" if single else "-",
            f"{r['tok_s'] / 1e6:.2f}",
            "" if r["impl"] == "radixgen" else f"{ratio:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    return text if markdown else text.replace("|", " ").replace("---", "")


def _ours_reference(rows: list[dict], r: dict) -> dict:
    """The radixgen row a peer row is compared with: cold cache for encode, same op and threading."""
    single = "1 thread" in r["mode"]
    for o in rows:
        same = o["vocab"] == r["vocab"] and o["kind"] == r["kind"] and o["impl"] == "radixgen"
        if same and ("1 thread" in o["mode"]) == single and "warm" not in o["mode"]:
            return o
    return r


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, default=10.0, help="size of the text in MB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab", choices=["qwen3", "gpt2", "both"], default="both")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()

    from test_tokenizer_corpus import make_documents

    docs = make_documents(int(args.mb * (1 << 20)), seed=1)
    n_bytes = sum(len(d.encode("utf-8")) for d in docs)
    print(
        f"# {n_bytes / 1e6:.1f} MB in {len(docs)} documents; {os.cpu_count()} cores; "
        f"{platform.processor() or platform.machine()}; Python {platform.python_version()}"
    )
    rows = []
    for vocab in ["qwen3", "gpt2"] if args.vocab == "both" else [args.vocab]:
        rows += bench_vocab(vocab, docs, args.repeats)
        print(
            f"# {vocab}: identical ids to HF on {rows[-1]['agree_hf']:.1%} of documents, "
            f"to tiktoken on {rows[-1]['agree_tk']:.1%}",
            flush=True,
        )
    print(render(rows, args.markdown))


if __name__ == "__main__":
    main()
