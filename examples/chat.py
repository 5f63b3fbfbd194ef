"""Chat: a multi-turn conversation written with roles, rendered by the model's own chat template.

    python examples/chat.py
"""

from __future__ import annotations

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


def main(argv: list[str] | None = None) -> None:
    args, backend = sgl.lang.script_backend(__doc__, 32, argv)
    out = run(backend, args.max_tokens)
    for message in out["messages"]:
        print(f"{message['role']:>9}: {message['content']}")


if __name__ == "__main__":
    main()
