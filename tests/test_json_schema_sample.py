"""Real schemas (JSONSchemaBench sample in ../shared/grammar-bench, read in place, skipped when absent).

Every tenth schema runs by default; all 400 with RADIXGEN_SLOW=1. Valid instances must be accepted (the few
misses are instances whose properties are not in declared order, which the grammar enforces), and no invalid
instance may be accepted by a grammar compiled without relaxations.
"""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import jsonschema
import pytest
from json_schema_oracle import accepts

from radixgen.grammars.json_schema import SchemaError, compile_json_schema, json_schema_to_ebnf

SHARED = Path(__file__).resolve().parents[2] / "shared"
SAMPLE = SHARED / "grammar-bench" / "jsonschemabench-sample.jsonl.gz"
GPT2_RANKS = SHARED / "vocabs" / "tiktoken" / "r50k_base.tiktoken"
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _rows() -> list[dict]:
    if not SAMPLE.exists():
        return []
    with gzip.open(SAMPLE, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


ROWS = _rows()
pytestmark = pytest.mark.skipif(not ROWS, reason=f"{SAMPLE} not found")


def _really_invalid(schema: dict, value) -> bool:
    """The sample's label, confirmed by `jsonschema` (it skips formats it has no checker for)."""
    try:
        cls = jsonschema.validators.validator_for(schema)
        return not cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(value)
    except Exception:
        return True


def check_with_oracle(rows: list[dict]) -> tuple[int, int, int, list[str]]:
    """(compiled, valid accepted, valid total, invalid instances accepted by exact grammars)."""
    compiled = accepted = total = 0
    wrongly_accepted = []
    for row in rows:
        try:
            conv = json_schema_to_ebnf(row["schema"])
        except SchemaError:
            continue
        compiled += 1
        for test in row["tests"]:
            text = json.dumps(test["data"], ensure_ascii=False)
            ok = accepts(conv.ebnf, text)
            if test["valid"]:
                total += 1
                accepted += ok
            elif ok and not conv.relaxations and _really_invalid(row["schema"], test["data"]):
                wrongly_accepted.append(f"{row['file']}: {text[:200]}")
    return compiled, accepted, total, wrongly_accepted


def test_every_tenth_schema():
    rows = ROWS[::10]
    compiled, accepted, total, wrong = check_with_oracle(rows)
    assert compiled >= 0.97 * len(rows)
    assert accepted >= 0.95 * total, (accepted, total)
    assert wrong == []


@pytest.mark.slow
def test_all_schemas():
    compiled, accepted, total, wrong = check_with_oracle(ROWS)
    assert compiled >= 0.97 * len(ROWS)
    assert accepted >= 0.97 * total, (accepted, total)
    assert wrong == []


@pytest.fixture(scope="module")
def gpt2():
    if not GPT2_RANKS.exists():
        pytest.skip("GPT-2 ranks not found")
    import tiktoken

    from radixgen.runtime.constraints import build_vocabulary
    from radixgen.tokenizer import Tokenizer

    ranks = {}
    for line in GPT2_RANKS.read_bytes().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    enc = tiktoken.Encoding("r50k_base", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": len(ranks)})
    return build_vocabulary(Tokenizer.from_file(GPT2_RANKS, pattern="gpt2")), enc


def _walk_with_matcher(grammar, enc, text: str) -> bool:
    """Token by token through the GPT-2 tokenization, checking each token against the full mask."""
    import numpy as np

    vocab = grammar.vocab
    m = grammar.matcher()
    row = np.zeros(vocab.mask_words, dtype=np.int32)
    for tok in enc.encode(text):
        m.fill_mask(row)
        if not (int(row[tok >> 5]) >> (tok & 31)) & 1 or not m.advance(tok):
            return False
    m.fill_mask(row)
    eos = vocab.size - 1
    return bool((int(row[eos >> 5]) >> (eos & 31)) & 1)


def _matcher_check(rows, gpt2) -> None:
    vocab, enc = gpt2
    for row in rows:
        try:
            grammar = compile_json_schema(row["schema"], vocab)
        except SchemaError:
            continue
        conv = json_schema_to_ebnf(row["schema"])
        for test in row["tests"]:
            text = json.dumps(test["data"], ensure_ascii=False)
            # the matcher and the independent oracle agree on every instance
            assert _walk_with_matcher(grammar, enc, text) == accepts(conv.ebnf, text), (row["file"], text[:200])


def test_matcher_agrees_with_oracle_gpt2(gpt2):
    small = [r for r in ROWS[::10] if len(json.dumps(r["schema"])) < 1500][:8]
    _matcher_check(small, gpt2)


@pytest.mark.slow
def test_matcher_agrees_with_oracle_gpt2_all(gpt2):
    _matcher_check(ROWS, gpt2)
