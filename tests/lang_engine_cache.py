"""One in-process engine on the default model, shared by the language's test modules (test_lang_engine.py and
test_examples.py), so the suite loads the model once for both; shut down at interpreter exit."""

from __future__ import annotations

import atexit
import functools


@functools.lru_cache(maxsize=1)
def shared_engine(model_path: str):
    from radixgen.runtime.engine import Engine

    engine = Engine(model_path)
    atexit.register(engine.shutdown)
    return engine


def reseed(engine, seed: int = 0) -> None:
    """Restart the engine's generator of unseeded samples, so a sampling test's tokens do not depend on what the
    modules before it sampled on the shared engine."""
    core = engine.core
    core.call(lambda: core.sampler.generator.manual_seed(seed))
