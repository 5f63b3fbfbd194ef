"""ReAct agent: the model chooses an action with select, Python runs the tool, the observation goes back in.

The tool input is regex-constrained, so every call the model makes is one the tool can run.

    python examples/react_agent.py
"""

from __future__ import annotations

import ast
import operator

import radixgen as sgl

# What the model may write as a calculator input: numbers joined by + - * / (the regex keeps tool calls valid).
ARITHMETIC = r"[0-9]{1,6} [-+*/] [0-9]{1,6}"
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculator(expression: str) -> str:
    """The agent's tool: arithmetic on numbers, evaluated from the syntax tree (never eval)."""
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError("only + - * / on numbers")

    try:
        result = value(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    return f"{result:g}"


@sgl.function
def react_agent(s, question, max_steps=3, max_tokens=16):
    s += "Solve the problem. Use the calculator for arithmetic, then finish with the answer.\n\n"
    s += "Question: A shelf holds 30 books. How many books are on 4 shelves?\n"
    s += "Action: calculator\nExpression: 30 * 4\nObservation: 120\nAction: finish\nAnswer: 120 books\n\n"
    s += "Question: " + question + "\n"
    for step in range(max_steps):
        s += "Action:" + sgl.select(f"action{step}", choices=[" calculator", " finish"])
        if s[f"action{step}"] == " calculator":
            s += "\nExpression: " + sgl.gen(f"expr{step}", max_tokens=max_tokens, regex=ARITHMETIC)
            s += "\nObservation: " + calculator(s[f"expr{step}"]) + "\n"
        else:
            break
    s += "\nAnswer:" + sgl.gen("answer", max_tokens=max_tokens, stop="\n")


def run(backend, max_tokens: int = 16) -> dict:
    state = react_agent.run(question="A box holds 12 eggs. How many eggs are in 7 boxes?", max_tokens=max_tokens,
                            backend=backend, temperature=0)
    if state.error():
        raise state.error()
    return {"text": state.text(), "variables": state.variables()}


def main(argv: list[str] | None = None) -> None:
    args, backend = sgl.lang.script_backend(__doc__, 16, argv)
    print(run(backend, args.max_tokens)["text"])


if __name__ == "__main__":
    main()
