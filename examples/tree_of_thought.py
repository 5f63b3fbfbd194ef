"""Tree of thought: fork the question into several lines of reasoning, decode them in parallel, then let the
model pick the most convincing one. Runs eagerly, then as a compiled plan over a small batch.

    python examples/tree_of_thought.py
"""

from __future__ import annotations

import radixgen as sgl

NUM_BRANCHES = 3


@sgl.function
def tree_of_thought(s, question, max_tokens=24):
    s += "Think step by step and answer the question.\n"
    s += "Question: " + question + "\n"
    branches = s.fork(NUM_BRANCHES)
    for i, branch in enumerate(branches):
        # Sampled (temperature 0.8) so that the branches explore different lines of thought.
        branch += f"Approach {i + 1}:" + sgl.gen("thought", max_tokens=max_tokens, min_tokens=4, stop="\n",
                                                 temperature=0.8) + "\n"
    branches.join()
    for i in range(NUM_BRANCHES):
        s += f"Approach {i + 1}:" + branches[i]["thought"] + "\n"
    s += "The most convincing approach is number" + sgl.select("best", choices=[" 1", " 2", " 3"])
    s += ".\nFinal answer:" + sgl.gen("answer", max_tokens=max_tokens, stop="\n")


QUESTIONS = ["What is 15 times 4?", "Which is heavier, a kilogram of iron or a kilogram of feathers?"]


def run(backend, max_tokens: int = 24) -> dict:
    state = tree_of_thought.run(question=QUESTIONS[0], max_tokens=max_tokens, backend=backend, temperature=0)
    if state.error():
        raise state.error()
    plan = tree_of_thought.bind(max_tokens=max_tokens).compile()  # bound: the plan's gens know their budget
    batch = plan.run_batch([{"question": q} for q in QUESTIONS], backend=backend, temperature=0)
    return {"thoughts": state["thought"], "best": state["best"], "answer": state["answer"],
            "batch_answers": [s["answer"] for s in batch], "plan": str(plan), "waves": plan.stats.waves}


def main(argv: list[str] | None = None) -> None:
    args, backend = sgl.lang.script_backend(__doc__, 24, argv)
    out = run(backend, args.max_tokens)
    for i, thought in enumerate(out["thoughts"]):
        print(f"approach {i + 1}:{thought}")
    print(f"best:{out['best']}  answer:{out['answer']}")
    print(out["plan"])
    print(f"compiled batch ran in {out['waves']} waves:", out["batch_answers"])


if __name__ == "__main__":
    main()
