"""radixgen.lang: the program language (`@function`, `gen`, `select`, `fork`, roles) and its backends.

Layout: expr.py (what a program appends), api.py (the primitives), spec.py / schema.py (sampling options and
constraints), state.py + executor.py + runner.py (eager interpretation), function.py (`@function`),
global_config.py (SGLang's settings object), tracer.py + ir.py + compiler.py (tracing and compiled plans),
backend.py (the interface) with engine_backend.py, endpoint.py and openai_backend.py (its implementations),
chat_template.py and choices.py.
"""

from radixgen.lang.api import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    image,
    select,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)
from radixgen.lang.backend import Backend, GenResult, ModelCallError, SelectResult, StreamDelta
from radixgen.lang.chat_template import CHATML, RoleTemplate
from radixgen.lang.endpoint import Endpoint
from radixgen.lang.engine_backend import EngineBackend
from radixgen.lang.function import SglFunction, function, get_default_backend, set_default_backend
from radixgen.lang.global_config import GlobalConfig, global_config
from radixgen.lang.openai_backend import OpenAICompatible
from radixgen.lang.script import script_backend
from radixgen.lang.state import ForkGroup, ProgramState

__all__ = [
    "CHATML",
    "Backend",
    "Endpoint",
    "EngineBackend",
    "ForkGroup",
    "GenResult",
    "GlobalConfig",
    "ModelCallError",
    "OpenAICompatible",
    "ProgramState",
    "RoleTemplate",
    "SelectResult",
    "SglFunction",
    "StreamDelta",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_default_backend",
    "global_config",
    "image",
    "script_backend",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "user",
    "user_begin",
    "user_end",
    "video",
]
