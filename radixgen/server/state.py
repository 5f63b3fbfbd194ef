"""What every route handler shares: the engine, settings, metrics, live generations, programs, readiness."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from radixgen.server.errors import bad_request
from radixgen.server.generation import GenerationRegistry
from radixgen.server.metrics import ServerMetrics

DEFAULT_PORT = 30000
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None  # Bearer token required on every route but /health
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    served_model_name: str | None = None  # default: the model file or folder name
    warmup: bool = True  # /health turns 200 only after one generate step ran
    shutdown_grace: float = 30.0  # seconds in-flight requests get to finish after SIGTERM
    owns_engine: bool = True  # shut the engine down with the app
    chat_template: str | None = None  # Jinja text replacing the model's own (`--chat-template FILE`)
    tool_call_format: str | None = None  # grammars.tool_formats.TOOL_FORMATS; default: read from the chat template


@dataclass
class ServerState:
    engine: Any  # radixgen.runtime.engine.Engine
    settings: ServerSettings
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    generations: GenerationRegistry = field(default_factory=GenerationRegistry)
    programs: Any = None  # radixgen.server.programs.ProgramRegistry | None
    ready: bool = False
    started_at: float = field(default_factory=time.time)
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(4, thread_name_prefix="rg-server"))

    @property
    def model_name(self) -> str:
        if self.settings.served_model_name:
            return self.settings.served_model_name
        path = str(getattr(self.engine.runner, "model_path", None) or self.engine.config.model_path or "default")
        return path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def chat_template(self) -> str | None:
        """The chat template requests are rendered with: `--chat-template`'s, else the model's."""
        return self.settings.chat_template or self.engine.tokenizer.chat_template

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    @property
    def vocab_size(self) -> int:
        return self.engine.model_config.vocab_size

    async def run_blocking(self, fn, *args: Any) -> Any:
        """Run a blocking call (tokenizing, engine stats) off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def encode(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        tok = self.engine.tokenizer
        return await self.run_blocking(lambda: [tok.encode(t, add_special_tokens) for t in texts])

    def check_fits(self, ids: list[int], max_new_tokens: int | None, prompt_param: str, max_param: str) -> None:
        """A 400 when the prompt, or the prompt plus an explicit token budget, does not fit the context."""
        limit = self.context_length
        if len(ids) >= limit:
            raise bad_request(prompt_param, f"the prompt has {len(ids)} tokens; the context length is {limit} "
                                            f"(at least one token must remain for the output)")
        if max_new_tokens is not None and len(ids) + max_new_tokens > limit:
            raise bad_request(max_param, f"{max_new_tokens} tokens requested after a {len(ids)}-token prompt exceed "
                                         f"the context length {limit} (at most {limit - len(ids)})")


STATE: web.AppKey[ServerState] = web.AppKey("radixgen_state", ServerState)
