"""Tool agent: a loop in which the model calls two tools (weather lookup, unit conversion) and then answers.

Each tool turn is `gen(tools=...)`: the grammar makes the model's text a valid call of a declared function, and
the parsed calls come back in `s.get_meta_info(name)["tool_calls"]`. Each later assistant turn opens with a
`select` that decides whether to call another tool or to answer.

    python examples/tool_agent.py
"""

from __future__ import annotations

import json
from collections.abc import Callable

import radixgen as sgl
from radixgen.grammars.tool_formats import tools_prompt

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current temperature of a city, in degrees Celsius.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "convert_temperature", "description": "Convert a temperature from Celsius to another unit.",
        "parameters": {"type": "object", "properties": {
            "celsius": {"type": "number"}, "unit": {"type": "string", "enum": ["fahrenheit", "kelvin"]}},
            "required": ["celsius", "unit"]}}},
]


def get_weather(city: str) -> dict:
    return {"city": city, "celsius": 10 + sum(map(ord, city)) % 20}  # a stand-in for a weather service


def convert_temperature(celsius: float, unit: str) -> dict:
    value = celsius * 9 / 5 + 32 if unit == "fahrenheit" else celsius + 273.15
    return {"unit": unit, "value": round(value, 1)}


ANSWER_LEAD = "The answer:"
NEXT = "Call another tool if the question needs it, else answer."
FUNCTIONS: dict[str, Callable[..., dict]] = {"get_weather": get_weather, "convert_temperature": convert_temperature}


@sgl.function
def agent(s, question, max_turns=3, max_tokens=64):
    s += sgl.system(tools_prompt(TOOLS, "hermes"))
    s += sgl.user(question)
    for turn in range(max_turns):
        s += sgl.assistant_begin()
        if turn:  # the first turn always looks the weather up; later ones choose
            s += sgl.select(f"next{turn}", ["I will call another tool.", "I can answer now."]) + "\n"
            if s[f"next{turn}"] == "I can answer now.":
                s += ANSWER_LEAD + sgl.gen("answer", max_tokens=max_tokens, stop="\n", temperature=0)
                s += sgl.assistant_end()
                return
        choice = "get_weather" if turn == 0 else "required"  # a named function, then any of them
        s += sgl.gen(f"call{turn}", tools=TOOLS, tool_choice=choice, parallel_tool_calls=False,
                     max_tokens=max_tokens, temperature=0)
        s += sgl.assistant_end()
        for call in s.get_meta_info(f"call{turn}")["tool_calls"]:
            result = FUNCTIONS[call["name"]](**json.loads(call["arguments"]))
            s += sgl.user(f"<tool_response>\n{json.dumps(result)}\n</tool_response>\n{NEXT}")
    s += sgl.assistant("I can answer now.\n" + ANSWER_LEAD + sgl.gen("answer", max_tokens=max_tokens, stop="\n",
                                                                   temperature=0))


def run(backend, max_tokens: int = 64, question: str = "How warm is it in Paris, in Fahrenheit?") -> dict:
    state = agent.run(question=question, max_tokens=max_tokens, backend=backend)
    if state.error():
        raise state.error()
    calls = [call for turn in range(3) for call in state.get_meta_info(f"call{turn}").get("tool_calls", [])]
    return {"calls": calls, "answer": state["answer"]}


def main(argv: list[str] | None = None) -> None:
    args, backend = sgl.lang.script_backend(__doc__, 64, argv)
    out = run(backend, args.max_tokens)
    for call in out["calls"]:
        print(f"call {call['name']}({call['arguments']})")
    print("answer:", out["answer"].strip())


if __name__ == "__main__":
    main()
