"""radixgen: fast, exactly-shaped execution of multi-call LLM programs.

The public API is re-exported here; everything else is internal. `import radixgen as sgl` gives the program
language with SGLang's names (`image` and `video` refuse with a clear error: radixgen runs text-only models).
`Engine` loads on first use, so `import radixgen` stays light (no torch until an engine is built).
"""

from typing import Any

from radixgen.lang import (
    Endpoint,
    EngineBackend,
    OpenAICompatible,
    ProgramState,
    assistant,
    assistant_begin,
    assistant_end,
    function,
    gen,
    gen_int,
    gen_string,
    get_default_backend,
    global_config,
    image,
    select,
    set_default_backend,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)

RuntimeEndpoint = Endpoint  # SGLang's name for the same backend

__version__ = "0.1.0"

_LAZY = {"Engine": ("radixgen.runtime.engine", "Engine")}

__all__ = [
    "Endpoint", "Engine", "EngineBackend", "OpenAICompatible", "ProgramState", "RuntimeEndpoint", "assistant",
    "assistant_begin", "assistant_end", "function", "gen", "gen_int", "gen_string", "get_default_backend",
    "global_config", "image", "select", "set_default_backend", "system", "system_begin", "system_end", "user",
    "user_begin", "user_end", "video",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'radixgen' has no attribute {name!r}")
