"""The command line every example script shares: `--model`, `--endpoint`, `--max-tokens`, and the backend."""

from __future__ import annotations

import argparse

from radixgen.lang.backend import Backend


def script_backend(doc: str | None, max_tokens: int, argv: list[str] | None = None
                   ) -> tuple[argparse.Namespace, Backend]:
    """Parse a program script's flags; the backend is the server at --endpoint, else an in-process engine."""
    from radixgen.lang.endpoint import Endpoint
    from radixgen.lang.engine_backend import EngineBackend
    from radixgen.runtime.engine import Engine

    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None)
    parser.add_argument("--model", default=None, help="model file or folder (default: the default model)")
    parser.add_argument("--endpoint", default=None, help="URL of a running `radixgen serve` to use instead")
    parser.add_argument("--max-tokens", type=int, default=max_tokens, help="token budget of each gen")
    args = parser.parse_args(argv)
    backend = Endpoint(args.endpoint) if args.endpoint else EngineBackend(Engine(args.model))
    return args, backend
