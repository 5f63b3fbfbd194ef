"""The one interface through which programs reach a model, so the same program runs in-process or over HTTP.

A backend answers five questions: generate a span after a prefix (`generate`, `generate_batch`, `stream`), score
choices after a prefix (`select`), prefill a prefix so later calls hit the cache (`cache_prefix`), and how
chat roles are written for its model (`role_template`). Implementations: `EngineBackend` (in-process
`radixgen.Engine`), `Endpoint` (a radixgen server's native API), `OpenAICompatible` (any /v1/completions server).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from radixgen.lang.chat_template import RoleTemplate
from radixgen.lang.spec import GenSpec


class ModelCallError(RuntimeError):
    """A model call failed (aborted by the engine, HTTP error, unsupported feature); kept in the state."""


@dataclass(frozen=True)
class GenResult:
    text: str
    meta_info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamDelta:
    """One piece of a streamed generation; the last one has `finished=True` and the full `meta_info`."""

    text: str
    finished: bool = False
    meta_info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SelectRequest:
    """One `select` to score: each choice as a continuation of `prompt`."""

    prompt: str
    choices: tuple[str, ...]
    method: str = "token_length_normalized"
    temperature: float = 0.0


@dataclass(frozen=True)
class SelectResult:
    choice: str
    meta_info: dict[str, Any] = field(default_factory=dict)


class Backend(ABC):
    """Base class: subclasses implement `generate`, `select`, `role_template`; the rest has sound defaults."""

    @abstractmethod
    def generate(self, prompt: str, spec: GenSpec) -> GenResult:
        """Continue `prompt` per `spec`; raise `ModelCallError` when the model call fails."""

    def generate_batch(self, prompts: Sequence[str], specs: Sequence[GenSpec]) -> list[GenResult | Exception]:
        """Several generations submitted together; a failed one is returned as its exception, in place."""
        def one(i: int) -> GenResult | Exception:
            try:
                return self.generate(prompts[i], specs[i])
            except ModelCallError as exc:
                return exc

        with ThreadPoolExecutor(max_workers=max(1, min(32, len(prompts)))) as pool:
            return list(pool.map(one, range(len(prompts))))

    def stream(self, prompt: str, spec: GenSpec) -> Iterator[StreamDelta]:
        """Deltas of one generation; the default generates whole and yields it once."""
        result = self.generate(prompt, spec)
        yield StreamDelta(result.text, True, result.meta_info)

    @abstractmethod
    def select(self, prompt: str, choices: Sequence[str], method: str, temperature: float = 0.0) -> SelectResult:
        """Score each choice as a continuation of `prompt` in one batched call and pick one."""

    def select_batch(self, requests: Sequence[SelectRequest]) -> list[SelectResult | Exception]:
        """Several selects scored together; a failed one is returned as its exception, in place."""
        def one(req: SelectRequest) -> SelectResult | Exception:
            try:
                return self.select(req.prompt, req.choices, req.method, req.temperature)
            except ModelCallError as exc:
                return exc

        with ThreadPoolExecutor(max_workers=max(1, min(32, len(requests)))) as pool:
            return list(pool.map(one, requests))

    def cache_prefix(self, prompt: str) -> None:
        """Prefill `prompt` so that later calls sharing it hit the cache; a no-op where there is no cache."""
        return None

    @abstractmethod
    def role_template(self) -> RoleTemplate:
        """How `system`/`user`/`assistant` turns are written for this backend's model."""

    def get_stats(self) -> dict[str, Any]:
        """Engine counters where the backend can see them (steps, cache hits); empty otherwise."""
        return {}
