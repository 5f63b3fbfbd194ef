"""The command line every example script shares: `--model`, `--endpoint`, `--max-tokens`, and the backend."""

from __future__ import annotations

import argparse

from radixgen.lang.backend import Backend, ModelCallError
from radixgen.runtime.errors import RadixgenError

PROBE_TIMEOUT = 10.0  # seconds the --endpoint server gets to answer its first request


def script_backend(doc: str | None, max_tokens: int, argv: list[str] | None = None
                   ) -> tuple[argparse.Namespace, Backend]:
    """Parse a program script's flags and pick its backend: the server at --endpoint (checked to answer), else an
    in-process engine on --model, else the default backend when one is set (as under `radixgen run`), else an
    engine on the default model. A bad endpoint or model ends the script with one line on stderr (exit 1)."""
    from radixgen.lang.endpoint import Endpoint
    from radixgen.lang.engine_backend import EngineBackend
    from radixgen.lang.function import get_default_backend
    from radixgen.lang.http import HttpClient
    from radixgen.runtime.engine import Engine

    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None)
    parser.add_argument("--model", default=None, help="model file or folder (default: the default model)")
    parser.add_argument("--endpoint", default=None, help="URL of a running `radixgen serve` to use instead")
    parser.add_argument("--max-tokens", type=int, default=max_tokens, help="token budget of each gen")
    args = parser.parse_args(argv)
    if args.max_tokens < 1:
        parser.error(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.endpoint and "://" not in args.endpoint:
        parser.error(f"--endpoint must be a URL with its scheme, e.g. http://{args.endpoint}")
    try:
        if args.endpoint:
            HttpClient(args.endpoint, timeout=PROBE_TIMEOUT).get("/get_model_info")  # a wrong URL fails here
            return args, Endpoint(args.endpoint)
        default = get_default_backend()
        if args.model is None and default is not None:
            return args, default
        return args, EngineBackend(Engine(args.model))
    except (ModelCallError, RadixgenError, ValueError, OSError) as exc:
        parser.exit(1, f"{parser.prog}: error: {exc}\n")
