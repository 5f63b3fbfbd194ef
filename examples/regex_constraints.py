"""Regex constraints: an IPv4 address and ISO dates, always in shape however small the model.

(Not named regex.py: a script's folder comes first on sys.path, and that name would shadow the `regex` package.)

    python examples/regex_constraints.py
"""

from __future__ import annotations

import argparse

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
    for name, value in run(make_backend(args), args.max_tokens).items():
        print(f"{name}: {value}")


if __name__ == "__main__":
    main()
