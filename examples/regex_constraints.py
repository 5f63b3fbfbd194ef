"""Regex constraints: an IPv4 address and ISO dates, always in shape however small the model.

(Not named regex.py: a script's folder comes first on sys.path, and that name would shadow the `regex` package.)

    python examples/regex_constraints.py
"""

from __future__ import annotations

import radixgen as sgl

IPV4 = r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
ISO_DATE = r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"


@sgl.function
def facts(s, max_tokens=16):
    s += "Q: What is the IP address of Google's public DNS server?\nA: "
    s += sgl.gen("dns", max_tokens=max_tokens, regex=IPV4) + "\n"
    s += "Q: On what date did Apollo 11 land on the Moon (YYYY-MM-DD)?\nA: "
    s += sgl.gen("moon", max_tokens=max_tokens, regex=ISO_DATE) + "\n"
    s += "Q: On what date did the Berlin Wall fall (YYYY-MM-DD)?\nA: "
    s += sgl.gen("wall", max_tokens=max_tokens, regex=ISO_DATE) + "\n"


def run(backend, max_tokens: int = 16) -> dict:
    state = facts.run(max_tokens=max_tokens, backend=backend, temperature=0)
    if state.error():
        raise state.error()
    return {name: state[name] for name in ("dns", "moon", "wall")}


def main(argv: list[str] | None = None) -> None:
    args, backend = sgl.lang.script_backend(__doc__, 16, argv)
    for name, value in run(backend, args.max_tokens).items():
        print(f"{name}: {value}")


if __name__ == "__main__":
    main()
