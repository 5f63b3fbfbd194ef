"""JSON extraction: pull a typed record out of free text; the schema (a dataclass) forces valid JSON.

    python examples/json_extraction.py
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import radixgen as sgl


@dataclass
class Person:
    name: str
    age: int
    city: str


@sgl.function
def extract(s, text, max_tokens=48):
    s += "Extract the person described in the text as JSON with name, age and city.\n\n"
    s += "Text: " + text + "\nJSON: "
    s += sgl.gen("record", max_tokens=max_tokens, json_schema=Person)


TEXTS = [
    "Maria Lopez, 34, moved from Madrid to Lisbon last spring and loves it there.",
    "At 61, retired engineer Tom Becker still cycles through Munich every morning.",
]


def run(backend, max_tokens: int = 48) -> dict:
    states = extract.run_batch([{"text": t, "max_tokens": max_tokens} for t in TEXTS], backend=backend,
                               temperature=0)
    records = []
    for state in states:
        if state.error():
            raise state.error()
        if state.get_meta_info("record")["finish_reason"]["type"] == "length":
            # The grammar keeps every prefix valid, but a budget too small to close the object cuts it short.
            raise SystemExit(f"max_tokens={max_tokens} is too small to finish a record: {state['record']!r}")
        records.append(Person(**json.loads(state["record"])))
    return {"records": records}


def main(argv: list[str] | None = None) -> None:
    args, backend = sgl.lang.script_backend(__doc__, 48, argv)
    for text, record in zip(TEXTS, run(backend, args.max_tokens)["records"]):
        print(text, "\n  ->", record)


if __name__ == "__main__":
    main()
