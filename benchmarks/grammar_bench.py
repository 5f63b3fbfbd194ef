"""JSON Schema constrained decoding: radixgen side by side with XGrammar, llguidance and outlines-core.

The method of ../shared/grammar-bench/README.md, on one thread: for each schema, compile it; walk each valid
instance token by token (serialised as `json.dumps(value, ensure_ascii=False)`, tokenized by the vocabulary's
own tokenizer), computing the full-vocabulary mask before every token, checking the token is allowed and
advancing; at the end EOS must be allowed. Mask times exclude the first mask of each instance. Invalid
instances are walked the same way and count as rejected when some token or the final EOS is refused.

Each engine runs in a child process that is killed and restarted when one schema takes longer than
`--timeout` seconds (counted as a timeout, not compiled). Peers that fail to import are listed and skipped.

A second table counts, per engine, the valid values accepted and the invalid ones rejected on the conformance
cases of tests/test_json_schema_conformance.py (each schema with values of every JSON type and its boundary
values, labelled by `jsonschema`), walked the same way; without that file, on the sample's instances.
`radixgen-disk` compiles each schema once into an on-disk grammar cache (untimed), then times a compile in
a fresh in-process cache: what a restarted server pays.

    python benchmarks/grammar_bench.py ../shared/grammar-bench/jsonschemabench-sample.jsonl.gz \\
        --vocab gpt2 qwen3 --engines radixgen xgrammar llguidance outlines radixgen-disk
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS", "TVM_NUM_THREADS"):
    os.environ[_var] = "1"  # one thread, before any engine library loads

import argparse
import base64
import contextlib
import gzip
import importlib
import json
import multiprocessing as mp
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared"
GPT2_RANKS = SHARED / "vocabs/tiktoken/r50k_base.tiktoken"
QWEN3_TOKENIZER = SHARED / "vocabs/qwen3/tokenizer.json"
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


# ---- vocabularies -------------------------------------------------------------------------------------------
@dataclass
class Vocab:
    """One tokenizer as every engine needs it: token bytes, EOS, an encoder, and the tokenizer object."""

    name: str
    token_bytes: list[bytes]
    eos_id: int
    encode: Callable[[str], list[int]]
    tiktoken_encoding: Any = None
    hf_tokenizer_file: Path | None = None
    special_ids: list[int] = field(default_factory=list)


def load_vocab(name: str) -> Vocab:
    if name == "gpt2":
        import tiktoken

        ranks = {}
        for line in GPT2_RANKS.read_bytes().splitlines():
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        eos = len(ranks)
        enc = tiktoken.Encoding("r50k_base", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                special_tokens={"<|endoftext|>": eos})
        token_bytes = [b""] * (eos + 1)
        for tok, rank in ranks.items():
            token_bytes[rank] = tok
        token_bytes[eos] = b"<|endoftext|>"
        return Vocab("gpt2", token_bytes, eos, lambda s: enc.encode(s, disallowed_special=()), enc,
                     special_ids=[eos])
    if name == "qwen3":
        from tokenizers import Tokenizer

        from radixgen.runtime.constraints import build_vocabulary
        from radixgen.tokenizer import Tokenizer as OurTokenizer

        rv = build_vocabulary(OurTokenizer.from_file(QWEN3_TOKENIZER))
        tok = Tokenizer.from_file(str(QWEN3_TOKENIZER))
        eos = tok.token_to_id("<|im_end|>")
        specials = [i for i in range(len(rv.token_bytes)) if rv.token_bytes[i] and i in set(rv.special_ids)]
        return Vocab("qwen3", list(rv.token_bytes), eos,
                     lambda s: tok.encode(s, add_special_tokens=False).ids, None, QWEN3_TOKENIZER, specials)
    raise ValueError(f"unknown vocabulary {name!r}")


def bit(row: np.ndarray, token: int) -> bool:
    return bool((int(row[token >> 5]) >> (token & 31)) & 1)


# ---- engines: compile(schema) -> handle; walk(handle, tokens) -> (accepted, mask seconds) ---------------------
def timed_walk(fill: Callable[[], Any], row: Any, accept: Callable[[int], bool], tokens: list[int],
               eos: int) -> tuple[bool, list[float]]:
    """The method's walk, shared by every engine: before each token `fill()` writes the mask into `row` (timed),
    the token must be allowed there and accepted; at the end EOS must be allowed. Returns (accepted, mask times)."""
    times = []
    for tok in tokens:
        t0 = time.perf_counter()
        fill()
        times.append(time.perf_counter() - t0)
        if not bit(row, tok) or not accept(tok):
            return False, times
    fill()
    return bit(row, eos), times


class Radixgen:
    def __init__(self, vocab: Vocab, disk_cache: bool = False, **opts: Any) -> None:
        from radixgen.grammars import Vocabulary
        from radixgen.grammars.disk_cache import GrammarDiskCache

        cache = GrammarDiskCache(tempfile.mkdtemp(prefix="grammar-bench-")) if disk_cache else None
        self.vocab = Vocabulary(vocab.token_bytes, [vocab.eos_id], vocab.special_ids, grammar_cache=cache)
        self.eos = vocab.eos_id
        self.opts = opts

    def prepare(self, schema: Any) -> None:
        """Untimed, before `compile`: with a disk cache, compile once so that the timed compile loads."""
        if self.vocab.grammar_cache is not None:
            with contextlib.suppress(Exception):
                self.compile(schema)

    def compile(self, schema: Any) -> Any:
        from radixgen.grammars import clear_cache
        from radixgen.grammars.json_schema import compile_json_schema

        clear_cache()
        return compile_json_schema(schema, self.vocab, **self.opts)

    def relaxed(self, handle: Any) -> bool:
        return bool(handle.relaxations)

    def narrowings(self, handle: Any) -> list[str]:
        return list(getattr(handle, "narrowings", ()))

    def walk(self, handle: Any, tokens: list[int]) -> tuple[bool, list[float]]:
        m = handle.matcher()
        row = np.zeros(self.vocab.mask_words, dtype=np.int32)
        return timed_walk(lambda: m.fill_mask(row), row, m.advance, tokens, self.eos)


class XGrammar:
    def __init__(self, vocab: Vocab, any_whitespace: bool = False) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        info = xgr.TokenizerInfo(vocab.token_bytes, xgr.VocabType.RAW, vocab_size=len(vocab.token_bytes),
                                 stop_token_ids=[vocab.eos_id])
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.size, self.eos, self.any_whitespace = len(vocab.token_bytes), vocab.eos_id, any_whitespace

    def compile(self, schema: Any) -> Any:
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=self.any_whitespace,
                                                 strict_mode=True)

    def walk(self, handle: Any, tokens: list[int]) -> tuple[bool, list[float]]:
        m = self.xgr.GrammarMatcher(handle)
        mask = self.xgr.allocate_token_bitmask(1, self.size)
        return timed_walk(lambda: m.fill_next_token_bitmask(mask), mask[0].numpy(), m.accept_token, tokens, self.eos)


class LLGuidance:
    def __init__(self, vocab: Vocab, lenient: bool = False) -> None:
        import llguidance
        import llguidance.numpy as lln

        self.ll, self.lln = llguidance, lln
        if vocab.tiktoken_encoding is not None:
            from llguidance.tiktoken import lltokenizer_from_encoding

            self.tokenizer = lltokenizer_from_encoding(vocab.tiktoken_encoding, eos_token=vocab.eos_id)
        else:
            from llguidance.hf import from_tokenizer
            from transformers import PreTrainedTokenizerFast

            hf = PreTrainedTokenizerFast(tokenizer_file=str(vocab.hf_tokenizer_file), eos_token="<|im_end|>")
            self.tokenizer = from_tokenizer(hf)
        self.size, self.eos = self.tokenizer.vocab_size, vocab.eos_id
        self.defaults = {"lenient": True} if lenient else None

    def compile(self, schema: Any) -> Any:
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema, defaults=self.defaults)
        m = self.ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def walk(self, handle: Any, tokens: list[int]) -> tuple[bool, list[float]]:
        m = handle.deep_copy()
        mask = self.lln.allocate_token_bitmask(1, self.size)
        return timed_walk(lambda: self.lln.fill_next_token_bitmask(m, mask, 0), mask[0], m.consume_token, tokens,
                          self.eos)


class OutlinesCore:
    def __init__(self, vocab: Vocab) -> None:
        import outlines_core

        self.oc = outlines_core
        by_bytes: dict[bytes, list[int]] = {}
        for tid, tok in enumerate(vocab.token_bytes):
            if tok and tid != vocab.eos_id and tid not in vocab.special_ids:
                by_bytes.setdefault(tok, []).append(tid)
        self.vocabulary = outlines_core.Vocabulary(vocab.eos_id, by_bytes)
        self.words, self.eos = (len(vocab.token_bytes) + 31) // 32, vocab.eos_id

    def compile(self, schema: Any) -> Any:
        from outlines_core.json_schema import build_regex_from_schema

        return self.oc.Index(build_regex_from_schema(json.dumps(schema)), self.vocabulary)

    def walk(self, handle: Any, tokens: list[int]) -> tuple[bool, list[float]]:
        guide = self.oc.Guide(handle)
        row = np.zeros(self.words, dtype=np.int32)

        def accept(tok: int) -> bool:  # the mask already allowed it; advancing cannot refuse it
            guide.advance(tok)
            return True

        return timed_walk(lambda: guide.write_mask_into(row.ctypes.data, row.size, 4), row, accept, tokens, self.eos)


ENGINES: dict[str, Callable[[Vocab], Any]] = {
    "radixgen": lambda v: Radixgen(v),
    "radixgen-flexible": lambda v: Radixgen(v, whitespace="flexible"),
    "radixgen-disk": lambda v: Radixgen(v, disk_cache=True),
    "radixgen-exact": lambda v: Radixgen(v, infer_types=False),  # no inferred types: the exact language
    "xgrammar": lambda v: XGrammar(v),
    "xgrammar-flexible": lambda v: XGrammar(v, any_whitespace=True),
    "llguidance": lambda v: LLGuidance(v),
    "llguidance-lenient": lambda v: LLGuidance(v, lenient=True),
    "outlines": lambda v: OutlinesCore(v),
}


# ---- one engine in a child process --------------------------------------------------------------------------
def run_schema(engine: Any, vocab: Vocab, row: dict) -> dict:
    out: dict[str, Any] = {"compiled": False, "valid": [], "invalid": [], "mask_s": [], "relaxed": False}
    getattr(engine, "prepare", lambda schema: None)(row["schema"])
    t0 = time.perf_counter()
    try:
        handle = engine.compile(row["schema"])
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        return out
    out["compile_s"] = time.perf_counter() - t0
    out["compiled"] = True
    out["relaxed"] = bool(getattr(engine, "relaxed", lambda h: False)(handle))
    out["narrowings"] = getattr(engine, "narrowings", lambda h: [])(handle)
    for test in row["tests"]:
        tokens = vocab.encode(json.dumps(test["data"], ensure_ascii=False))
        try:
            accepted, times = engine.walk(handle, tokens)
        except Exception:
            accepted, times = False, []
        if test["valid"]:
            out["valid"].append(accepted)
            out["mask_s"].extend(times[1:])
        else:
            out["invalid"].append(not accepted)
    return out


def _child(conn: Any, engine_name: str, vocab: Vocab, rows: list[dict], quiet: bool) -> None:
    if quiet:  # peers log a warning per unsupported keyword straight to fd 2
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
    try:
        engine = ENGINES[engine_name](vocab)
    except Exception as exc:
        conn.send(("init-error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while True:
        index = conn.recv()
        if index is None:
            return
        conn.send(("result", run_schema(engine, vocab, rows[index])))


def run_engine(engine_name: str, vocab: Vocab, rows: list[dict], timeout: float, progress: bool,
               quiet_child: bool = False) -> tuple[list[dict], str | None]:
    ctx = mp.get_context("fork")
    results: list[dict] = []
    proc = conn = None

    def start() -> str | None:
        nonlocal proc, conn
        conn, child_conn = ctx.Pipe()
        proc = ctx.Process(target=_child, args=(child_conn, engine_name, vocab, rows, quiet_child), daemon=True)
        proc.start()
        kind, payload = conn.recv()
        return payload if kind == "init-error" else None

    error = start()
    if error:
        return [], error
    for i in range(len(rows)):
        conn.send(i)
        if conn.poll(timeout):
            results.append(conn.recv()[1])
        else:
            proc.kill()
            proc.join()
            results.append({"compiled": False, "timeout": True, "valid": [], "invalid": [], "mask_s": []})
            start()
        if progress and (i + 1) % 50 == 0:
            print(f"  {engine_name}/{vocab.name}: {i + 1}/{len(rows)}", flush=True)
    conn.send(None)
    proc.join(timeout=10)
    return results, None


# ---- the conformance cases -----------------------------------------------------------------------------------
TESTS = Path(__file__).resolve().parents[1] / "tests"


def conformance_rows() -> tuple[list[dict], tuple[str, ...]] | None:
    """The cases of tests/test_json_schema_conformance.py as sample rows (each schema with the probes of every
    JSON type and its boundary values, each labelled valid or invalid by `jsonschema`) and the prefixes of the
    narrowings that change only a value's spelling; None without that file or its test dependencies."""
    if not (TESTS / "test_json_schema_conformance.py").exists():
        return None
    sys.path.insert(0, str(TESTS))
    try:
        import jsonschema

        cases = importlib.import_module("test_json_schema_conformance")
    except ImportError:
        return None
    finally:
        sys.path.remove(str(TESTS))
    rows = []
    for name, schema, values in cases.CASES:
        validator = jsonschema.validators.validator_for(schema)(schema)
        rows.append({"file": name, "schema": schema,
                     "tests": [{"valid": validator.is_valid(v), "data": v} for v in [*cases.PROBES, *values]]})
    return rows, tuple(cases.SPELLING)


# ---- report -------------------------------------------------------------------------------------------------
def _ms(values: list[float], q: float) -> float:
    return float(np.quantile(values, q)) * 1e3 if values else float("nan")


def summarize(engine: str, vocab: str, rows: list[dict], results: list[dict]) -> dict:
    compiled = [r for r in results if r["compiled"]]
    compile_s = [r["compile_s"] for r in compiled]
    mask_s = [t for r in compiled for t in r["mask_s"]]
    valid_total = sum(1 for row in rows for t in row["tests"] if t["valid"])
    exact = [r for r in compiled if not r.get("relaxed")]
    return {
        "engine": engine, "vocab": vocab, "schemas": len(rows), "compiled": len(compiled),
        "timeouts": sum(1 for r in results if r.get("timeout")),
        "compile_median_ms": _ms(compile_s, 0.5), "compile_p90_ms": _ms(compile_s, 0.9),
        "mask_median_us": _ms(mask_s, 0.5) * 1e3, "mask_p99_us": _ms(mask_s, 0.99) * 1e3,
        "valid_accepted": sum(sum(r["valid"]) for r in compiled),
        "valid_of_compiled": sum(len(r["valid"]) for r in compiled), "valid_total": valid_total,
        "invalid_rejected": sum(sum(r["invalid"]) for r in compiled),
        "invalid_of_compiled": sum(len(r["invalid"]) for r in compiled),
        "invalid_accepted_exact": sum(len(r["invalid"]) - sum(r["invalid"]) for r in exact),
        "relaxed": sum(1 for r in compiled if r.get("relaxed")),
    }


def value_narrowed(summary: dict, results: list[dict], spelling: tuple[str, ...]) -> dict:
    """`summary` with the schemas whose grammar reports a narrowing of values (not only of their spelling:
    `spelling` prefixes) and the valid values those grammars refused."""
    narrowed = [r for r in results if r["compiled"]
                and any(not n.startswith(spelling) for n in r.get("narrowings", []))]
    return summary | {"narrowed": len(narrowed),
                      "valid_rejected_narrowed": sum(len(r["valid"]) - sum(r["valid"]) for r in narrowed)}


def print_table(summaries: list[dict]) -> None:
    print("| engine | vocab | schemas compiled | compile median / p90 | mask median / p99 | valid accepted "
          "| invalid rejected |")
    print("|---|---|---|---|---|---|---|")
    for s in summaries:
        extra = f", {s['timeouts']} timeouts" if s["timeouts"] else ""
        relaxed = f" ({s['relaxed']} relaxed)" if s["relaxed"] else ""
        exact = f"; {s['invalid_accepted_exact']} accepted by exact grammars" if s["relaxed"] else ""
        print(f"| {s['engine']} | {s['vocab']} | {s['compiled']}/{s['schemas']}{relaxed}{extra} "
              f"| {s['compile_median_ms']:.1f} / {s['compile_p90_ms']:.1f} ms "
              f"| {s['mask_median_us']:.1f} / {s['mask_p99_us']:.0f} µs "
              f"| {s['valid_accepted']}/{s['valid_of_compiled']} (of {s['valid_total']}) "
              f"| {s['invalid_rejected']}/{s['invalid_of_compiled']}{exact} |")


def print_conformance_table(summaries: list[dict], what: str) -> None:
    print(f"\nConformance: {what}")
    print("(values as json.dumps writes them: keys in the schema's order where it has one, no respelling; a"
          " grammar with a reported narrowing may refuse some valid ones, one with a relaxation accept invalid ones)")
    print("| engine | vocab | schemas compiled | valid accepted | invalid rejected |")
    print("|---|---|---|---|---|")
    for s in summaries:
        report = [f"{s['relaxed']} relaxed"] if s["relaxed"] else []
        report += [f"{s['narrowed']} narrowed"] if s.get("narrowed") else []
        narrowed = (f"; {s['valid_rejected_narrowed']} refused by grammars with a narrowing of values"
                    if s.get("valid_rejected_narrowed") else "")
        exact = f"; {s['invalid_accepted_exact']} accepted by exact grammars" if s["relaxed"] else ""
        print(f"| {s['engine']} | {s['vocab']} | {s['compiled']}/{s['schemas']}"
              f"{' (' + ', '.join(report) + ')' if report else ''} "
              f"| {s['valid_accepted']}/{s['valid_of_compiled']} (of {s['valid_total']}){narrowed} "
              f"| {s['invalid_rejected']}/{s['invalid_of_compiled']}{exact} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_path", type=Path, help="jsonschemabench-sample.jsonl.gz")
    ap.add_argument("--vocab", nargs="+", default=["gpt2", "qwen3"], choices=["gpt2", "qwen3"])
    ap.add_argument("--engines", nargs="+", default=["radixgen", "xgrammar", "llguidance", "outlines"],
                    choices=sorted(ENGINES))
    ap.add_argument("--limit", type=int, default=None, help="only the first N schemas (after --stride)")
    ap.add_argument("--stride", type=int, default=1, help="every Nth schema (a spread over all sources)")
    ap.add_argument("--peer-log", action="store_true", help="keep the peers' warnings on stderr")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per schema (compile + walks)")
    ap.add_argument("--json-out", type=Path, default=None, help="also write summaries and per-schema results")
    ap.add_argument("--no-conformance", action="store_true", help="skip the conformance table")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()

    with gzip.open(args.data_path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()][:: args.stride][: args.limit]
    print(f"{len(rows)} schemas, {sum(len(r['tests']) for r in rows)} instances; {platform.processor() or ''} "
          f"{platform.machine()}, one thread")
    loaded = None if args.no_conformance else conformance_rows()
    cases, spelling = loaded if loaded is not None else (None, ())
    summaries, conformance, details, skipped = [], [], {}, []
    for vocab_name in args.vocab:
        vocab = load_vocab(vocab_name)
        for engine in args.engines:
            t0 = time.perf_counter()
            quiet_child = not args.peer_log and not engine.startswith("radixgen")
            results, error = run_engine(engine, vocab, rows, args.timeout, not args.quiet, quiet_child)
            if error:
                skipped.append(f"{engine}/{vocab_name}: {error}")
                continue
            summaries.append(summarize(engine, vocab_name, rows, results))
            details[f"{engine}/{vocab_name}"] = [
                {k: v for k, v in r.items() if k != "mask_s"} | {"file": row["file"]}
                for r, row in zip(results, rows)]
            if cases is not None:
                case_results, _ = run_engine(engine, vocab, cases, args.timeout, False, quiet_child)
                conformance.append(value_narrowed(summarize(engine, vocab_name, cases, case_results), case_results,
                                                  spelling))
            if not args.quiet:
                print(f"  {engine}/{vocab_name} done in {time.perf_counter() - t0:.0f} s", flush=True)
    print_table(summaries)
    if not args.no_conformance:
        if cases is None:  # the sample's own instances, as in the table above
            print_conformance_table(summaries, "tests/test_json_schema_conformance.py is not here (or its test "
                                               "dependencies are missing): the sample's instances instead")
        else:
            print_conformance_table(conformance, f"tests/test_json_schema_conformance.py, {len(cases)} schemas, "
                                                 f"{sum(len(r['tests']) for r in cases)} values labelled by "
                                                 "jsonschema")
    for line in skipped:
        print(f"skipped {line}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"summaries": summaries, "conformance": conformance,
                                             "results": details}, indent=1))


if __name__ == "__main__":
    main()
