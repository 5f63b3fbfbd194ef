"""Chat: a multi-turn conversation written with roles, rendered by the model's own chat template.

    python examples/chat.py
"""

from __future__ import annotations

import argparse

import radixgen as sgl


@sgl.function
def conversation(s, turns, max_tokens=32):
    s += sgl.system("You are a friendly assistant. Keep answers short.")
    for i, question in enumerate(turns):
        with s.user():
            s += question
        with s.assistant():
            s += sgl.gen(f"answer{i}", max_tokens=max_tokens)


def run(backend, max_tokens: int = 32) -> dict:
    turns = ["What is the capital of Italy?", "What is a famous food from there?"]
    state = conversation.run(turns=turns, max_tokens=max_tokens, backend=backend, temperature=0)
    return {"messages": state.messages(), "text": state.text()}


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
    args = parse_args(argv, 32)
    out = run(make_backend(args), args.max_tokens)
    for message in out["messages"]:
        print(f"{message['role']:>9}: {message['content']}")


if __name__ == "__main__":
    main()
