"""Quickstart: a few-shot question-answering program, run once and then as a batch.

    python examples/quickstart.py
"""

from __future__ import annotations

import radixgen as sgl


@sgl.function
def few_shot_qa(s, question, max_tokens=16):
    s += "Answer each question in a few words.\n\n"
    s += "Q: What is the capital of France?\nA: Paris\n\n"
    s += "Q: How many legs does a spider have?\nA: Eight\n\n"
    s += "Q: " + question + "\nA:" + sgl.gen("answer", max_tokens=max_tokens, stop="\n")


def run(backend, max_tokens: int = 16) -> dict:
    state = few_shot_qa.run(question="What is the capital of Japan?", max_tokens=max_tokens, backend=backend,
                            temperature=0)
    batch = few_shot_qa.run_batch(
        [{"question": q, "max_tokens": max_tokens} for q in ("Who wrote Hamlet?", "What is 2 + 3?")],
        backend=backend, temperature=0,
    )
    return {"answer": state["answer"], "cached_tokens": batch[0].get_meta_info("answer")["cached_tokens"],
            "batch": [s["answer"] for s in batch]}


def main(argv: list[str] | None = None) -> None:
    args, backend = sgl.lang.script_backend(__doc__, 16, argv)
    out = run(backend, args.max_tokens)
    print("Q: What is the capital of Japan?\nA:" + out["answer"])
    for answer in out["batch"]:
        print("batch answer:", answer)
    print(f"(the batch reused {out['cached_tokens']} cached prompt tokens of the shared few-shot prefix)")


if __name__ == "__main__":
    main()
