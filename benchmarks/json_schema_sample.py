"""JSON Schema conversion checked on real schemas: the JSONSchemaBench sample, read in place (never copied here).

For each schema: convert it (`json_schema_to_ebnf`; a `SchemaError` counts as refused) and compile it for the
GPT-2 vocabulary; then each instance, serialised as `json.dumps(value, ensure_ascii=False)`, is parsed by the
Lark oracle (tests/json_schema_oracle.py) and walked token by token through the matcher (full mask before every
token, EOS allowed at the end). A valid instance the grammar rejects is explained when a reported narrowing
accounts for it: another spelling of the value is accepted (keys in the declared order, `1` for `1.0`:
tests/json_schema_respell.py), or the grammar compiled with `infer_types=False` accepts it (an inferred type).
Invariants, exit status 1 when one fails:
  * at least 97% of the schemas compile;
  * the oracle accepts at least 95% of the valid instances as written (97% with `--all`); the misses are
    instances whose properties are not in declared order, which the grammar enforces;
  * every valid instance the grammar rejects is explained by a reported narrowing;
  * no instance that `jsonschema` confirms invalid is accepted by a grammar compiled without relaxations;
  * the matcher and the oracle agree on every instance.

    python benchmarks/json_schema_sample.py [../shared/grammar-bench/jsonschemabench-sample.jsonl.gz] [--all]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from grammar_vocabs import TOKENIZERS, Encode, gpt2, is_allowed  # noqa: E402
from json_schema_oracle import accepts  # noqa: E402
from json_schema_respell import accepts_respelled  # noqa: E402

from radixgen.grammars import Grammar, Vocabulary  # noqa: E402
from radixgen.grammars.json_schema import SchemaError, compile_json_schema, json_schema_to_ebnf  # noqa: E402

SAMPLE = ROOT.parent / "shared" / "grammar-bench" / "jsonschemabench-sample.jsonl.gz"
GPT2_RANKS = TOKENIZERS / "r50k_base.tiktoken"
MIN_COMPILED = 0.97
MIN_VALID_ACCEPTED = {False: 0.95, True: 0.97}  # by `--all`


@dataclass
class Tally:
    """Counts over the schemas checked, and the instances that break an invariant (file: text)."""

    schemas: int = 0
    compiled: int = 0
    refused: int = 0
    relaxed: int = 0
    valid_accepted: int = 0
    valid_total: int = 0
    valid_respelled: int = 0  # rejected as written, accepted in another spelling (key order, 1 for 1.0)
    valid_inferred: int = 0  # rejected because of an inferred type (accepted with infer_types=False)
    valid_unexplained: list[str] = field(default_factory=list)
    invalid_total: int = 0
    invalid_rejected: int = 0
    invalid_accepted_relaxed: int = 0  # accepted, with a reported relaxation
    invalid_accepted: list[str] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)


def read_sample(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def really_invalid(schema: dict[str, Any], value: object) -> bool:
    """The sample's label, confirmed by `jsonschema` (it skips formats it has no checker for)."""
    try:
        cls = jsonschema.validators.validator_for(schema)
        return not cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(value)
    except Exception:
        return True


def walk_with_matcher(grammar: Grammar, encode: Encode, text: str) -> bool:
    """Token by token through the reference tokenization, checking each token against the full mask."""
    vocab = grammar.vocab
    m = grammar.matcher()
    row = np.zeros(vocab.mask_words, dtype=np.int32)
    for tok in encode(text):
        m.fill_mask(row)
        if not is_allowed(row, tok) or not m.advance(tok):
            return False
    m.fill_mask(row)
    return any(is_allowed(row, eos) for eos in vocab.eos_token_ids)


def check_schema(row: dict[str, Any], vocab_and_encode: tuple[Vocabulary, Encode], tally: Tally) -> None:
    vocab, encode = vocab_and_encode
    tally.schemas += 1
    try:
        conv = json_schema_to_ebnf(row["schema"])
    except SchemaError:
        tally.refused += 1
        return
    tally.compiled += 1
    tally.relaxed += bool(conv.relaxations)
    grammar = compile_json_schema(row["schema"], vocab)
    for test in row["tests"]:
        text = json.dumps(test["data"], ensure_ascii=False)
        ok = accepts(conv.ebnf, text)
        if test["valid"]:
            tally.valid_total += 1
            tally.valid_accepted += ok
            if not ok:
                explain_rejection(row, grammar, test["data"], tally)
        elif really_invalid(row["schema"], test["data"]):
            tally.invalid_total += 1
            tally.invalid_rejected += not ok
            if ok and conv.relaxations:
                tally.invalid_accepted_relaxed += 1
            elif ok:
                tally.invalid_accepted.append(f"{row['file']}: {text[:200]}")
        if walk_with_matcher(grammar, encode, text) != ok:
            tally.disagreements.append(f"{row['file']}: oracle {'accepts' if ok else 'rejects'} {text[:200]}")


def explain_rejection(row: dict[str, Any], grammar: Grammar, value: object, tally: Tally) -> None:
    """Count a valid instance the grammar rejects under the narrowing that explains it, if one does."""
    if grammar.narrowings and accepts_respelled(grammar, value):
        tally.valid_respelled += 1
        return
    if any("type inferred" in n for n in grammar.narrowings):
        exact = compile_json_schema(row["schema"], grammar.vocab, infer_types=False)
        if accepts_respelled(exact, value):
            tally.valid_inferred += 1
            return
    tally.valid_unexplained.append(f"{row['file']}: {json.dumps(value, ensure_ascii=False)[:200]}")


def failures(tally: Tally, all_schemas: bool) -> list[str]:
    out = []
    if tally.compiled < MIN_COMPILED * tally.schemas:
        out.append(f"compiled {tally.compiled}/{tally.schemas} < {MIN_COMPILED:.0%}")
    min_valid = MIN_VALID_ACCEPTED[all_schemas]
    if tally.valid_accepted < min_valid * tally.valid_total:
        out.append(f"valid accepted {tally.valid_accepted}/{tally.valid_total} < {min_valid:.0%}")
    out += [f"valid rejected without a narrowing that explains it: {line}" for line in tally.valid_unexplained]
    out += [f"invalid accepted: {line}" for line in tally.invalid_accepted]
    out += [f"matcher disagrees: {line}" for line in tally.disagreements]
    return out


def table(tally: Tally) -> str:
    rows = [("schemas", tally.schemas), ("compiled", tally.compiled), ("refused", tally.refused),
            ("relaxed", tally.relaxed), ("valid accepted / total", f"{tally.valid_accepted} / {tally.valid_total}"),
            ("valid rejected, explained: another spelling (key order, 1 for 1.0)", tally.valid_respelled),
            ("valid rejected, explained: an inferred type", tally.valid_inferred),
            ("valid rejected, unexplained (must be 0)", len(tally.valid_unexplained)),
            ("invalid rejected / total", f"{tally.invalid_rejected} / {tally.invalid_total}"),
            ("invalid accepted with a reported relaxation", tally.invalid_accepted_relaxed),
            ("invalid accepted without a relaxation (must be 0)", len(tally.invalid_accepted)),
            ("matcher disagreements (must be 0)", len(tally.disagreements))]
    return "\n".join(["| check | count |", "|---|---|"] + [f"| {name} | {value} |" for name, value in rows])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sample", nargs="?", type=Path, default=SAMPLE, help="jsonschemabench-sample.jsonl.gz")
    parser.add_argument("--gpt2-ranks", type=Path, default=GPT2_RANKS, help="r50k_base.tiktoken")
    parser.add_argument("--all", action="store_true", help="all schemas (default: every tenth)")
    args = parser.parse_args()
    for path, what in ((args.sample, "the JSONSchemaBench sample"), (args.gpt2_ranks, "the GPT-2 ranks")):
        if not path.exists():
            print(f"{path} not found: give the path of {what}", file=sys.stderr)
            return 2
    rows = read_sample(args.sample)
    rows = rows if args.all else rows[::10]
    vocab_and_encode = gpt2(args.gpt2_ranks)
    tally, start = Tally(), time.perf_counter()
    for row in rows:
        check_schema(row, vocab_and_encode, tally)
    failed = failures(tally, args.all)
    for line in failed:
        print("FAIL", line)
    print(f"{args.sample.name}, {'all schemas' if args.all else 'every tenth schema'}, GPT-2 vocabulary, "
          f"{time.perf_counter() - start:.1f} s")
    print(table(tally))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
