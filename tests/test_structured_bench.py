"""benchmarks/structured.py: its output checks accept and refuse the right texts, and a smoke run on a tiny model
prints a row per engine and kind with every constrained output valid (numbers are printed, never asserted)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "structured.py"


@pytest.fixture(scope="module")
def structured():
    spec = importlib.util.spec_from_file_location("radixgen_bench_structured", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


EXTRACTION = {"name": "Ann", "age": 30, "city": "Oslo", "job": "baker", "has_pets": True, "status": "married"}
CHECKS = [
    ("json_schema", json.dumps(EXTRACTION), True),
    ("json_schema", json.dumps({**EXTRACTION, "age": 121}), False),
    ("json_schema", json.dumps({**EXTRACTION, "age": True}), False),
    ("json_schema", json.dumps({**EXTRACTION, "name": "x" * 21}), False),
    ("json_schema", json.dumps({**EXTRACTION, "status": "engaged"}), False),
    ("json_schema", json.dumps({k: v for k, v in EXTRACTION.items() if k != "job"}), False),
    ("json_schema", json.dumps({"age": 30, **EXTRACTION}), False),  # the properties out of their declared order
    ("json_schema", json.dumps(EXTRACTION)[:-1], False),
    ("regex", "Name: Ann; Age: 30; City: Oslo.", True),
    ("regex", "Name: Ann; Age: 0; City: Oslo.", False),
    ("ebnf", "Ann (30, Oslo); Bob (4, Lima)", True),
    ("ebnf", "Ann (30, Oslo); Bob (4, Lima); Cy (5, Pune); Di (6, Rome)", False),
    ("ebnf", "Ann (30, Oslo);", False),
    ("tool_call", '<tool_call>\n{"name": "record_person", "arguments": {"name": "Ann", "age": 30, "city": "Oslo"}}'
                  '\n</tool_call>', True),
    ("tool_call", '<tool_call>\n{"name": "record_person", "arguments": {"name": "Ann", "age": 300, "city": "Oslo"}}'
                  '\n</tool_call>', False),
    ("tool_call", '<tool_call>\n{"name": "other", "arguments": {}}\n</tool_call>', False),
]


@pytest.mark.parametrize(("kind", "text", "valid"), CHECKS)
def test_output_checks(structured, kind, text, valid):
    assert structured.KINDS[kind].is_valid(text) is valid


def test_smoke_run_on_a_tiny_model(structured, tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert structured.main(["--small", "--device", "cpu", "--batches", "2", "--kinds", "regex", "--backends",
                            "radixgen", "--jump-forward", "on", "off", "--max-new-tokens", "64",
                            "--json", str(out), "--trace", "2", "--repeats", "2"]) == 0
    printed = capsys.readouterr().out.splitlines()
    table = [line for line in printed if line.startswith("| cpu | radixgen | regex |")]
    assert len(table) == 2
    # the step trace (the first of the two pairs): per run a summary line (all eager on the CPU), two slowest steps
    summaries = [line for line in printed if line.startswith("trace ") and " steps, " in line]
    slowest = [line for line in printed if line.startswith("trace ") and ":   step " in line]
    assert len(summaries) == 4 and all("eager" in line for line in summaries) and len(slowest) == 8
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["jump_forward"]) for r in rows] == [(2, True), (2, False)]
    for r in rows:
        assert r["note"] == "" and r["invalid"] == 0 and r["tokens"] > 0
        assert r["constrained"]["steps"] > 0 and r["free"]["decode_steps"] > 0
        low, high = r["ratio_range"]  # the two pairs' ratios, around the ratio of the median walls
        assert 0 < low <= r["constrained_s"] / r["free_s"] <= high
