"""Quickstart: a few-shot question-answering program, run once and then as a batch.

    python examples/quickstart.py
"""

from __future__ import annotations

import argparse

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


def parse_args(argv: list[str] | None, max_tokens: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model file or folder (default: the default model)")
    parser.add_argument("--endpoint", default=None, help="URL of a running `radixgen serve` to use instead")
    parser.add_argument("--max-tokens", type=int, default=max_tokens, help="token budget of each gen")
    return parser.parse_args(argv)


def make_backend(args: argparse.Namespace) -> sgl.lang.Backend:
    """The server at --endpoint, else an in-process engine on --model."""
    return sgl.Endpoint(args.endpoint) if args.endpoint else sgl.EngineBackend(sgl.Engine(args.model))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv, 16)
    out = run(make_backend(args), args.max_tokens)
    print("Q: What is the capital of Japan?\nA:" + out["answer"])
    for answer in out["batch"]:
        print("batch answer:", answer)
    print(f"(the batch reused {out['cached_tokens']} cached prompt tokens of the shared few-shot prefix)")


if __name__ == "__main__":
    main()
