"""SGLang's own frontend test programs (`sglang/test/test_programs.py`, see sglang_programs.py) run against
`import radixgen as sgl` in process, on the default model through an Engine backend.

The module's `sgl` is replaced by radixgen, so each function's `sgl.function`, `sgl.gen`, `sgl.select` ... are
ours. Every function that needs no image and no download runs, with `check_answer=False` where it has that
flag; the few that need an image, a download or SGLang-only machinery are in sglang_programs.SKIPPED with the
reason (docs/language.md's compatibility table says the same). Gens are capped at MAX_TOKENS tokens to keep it
quick.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from lang_engine_cache import reseed, shared_engine
from sglang_programs import SKIPPED, WRONG_ANSWERS, programs, run_program, selected

import radixgen
from radixgen.lang.backend import Backend, GenResult, SelectRequest, SelectResult, StreamDelta
from radixgen.lang.chat_template import RoleTemplate
from radixgen.lang.spec import GenSpec

MAX_TOKENS = 24  # every gen's budget is capped at this, so the programs' 128- and 512-token gens stay quick
SELECTED = selected(SKIPPED)


class CappedBackend(Backend):
    """Another backend with every generation's `max_new_tokens` capped at `cap` tokens."""

    def __init__(self, inner: Backend, cap: int) -> None:
        self.inner = inner
        self.cap = cap

    def _capped(self, spec: GenSpec) -> GenSpec:
        return dataclasses.replace(spec, max_new_tokens=min(spec.max_new_tokens or self.cap, self.cap))

    def generate(self, prompt: str, spec: GenSpec) -> GenResult:
        return self.inner.generate(prompt, self._capped(spec))

    def generate_batch(self, prompts: Sequence[str], specs: Sequence[GenSpec]) -> list[GenResult | Exception]:
        return self.inner.generate_batch(prompts, [self._capped(s) for s in specs])

    def stream(self, prompt: str, spec: GenSpec) -> Iterator[StreamDelta]:
        return self.inner.stream(prompt, self._capped(spec))

    def select(self, prompt: str, choices: Sequence[str], method: str, temperature: float = 0.0) -> SelectResult:
        return self.inner.select(prompt, choices, method, temperature)

    def select_batch(self, requests: Sequence[SelectRequest]) -> list[SelectResult | Exception]:
        return self.inner.select_batch(requests)

    def cache_prefix(self, prompt: str) -> None:
        self.inner.cache_prefix(prompt)

    def role_template(self) -> RoleTemplate:
        return self.inner.role_template()

    def get_stats(self) -> dict[str, Any]:
        return self.inner.get_stats()


@pytest.fixture(scope="module")
def as_sgl(default_model_path):
    """SGLang's test module with `sgl` bound to radixgen and the default backend set via `sgl.global_config`."""
    previous = radixgen.global_config.default_backend
    engine = radixgen.EngineBackend(shared_engine(str(default_model_path)))
    radixgen.global_config.default_backend = CappedBackend(engine, MAX_TOKENS)
    mp = pytest.MonkeyPatch()
    mp.setattr(programs, "sgl", radixgen)
    yield programs
    mp.undo()
    radixgen.global_config.default_backend = previous


def test_every_program_is_selected_or_skipped_for_a_reason():
    assert set(WRONG_ANSWERS) <= set(SELECTED)
    assert len(SELECTED) == 15  # of the 19 functions in 0.4.10.post2


@pytest.mark.parametrize("name", SELECTED)
def test_sglang_program(as_sgl, default_model_path, name):
    reseed(shared_engine(str(default_model_path)))  # programs sample: their tokens must not depend on the order
    run_program(as_sgl, name)
