"""Speculative decoding: drafters propose tokens, one verify step scores them all, the longest prefix the target
model agrees with is kept (runtime/engine_core.py runs the step; this package decides what to propose)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixgen.runtime.speculative.acceptance import accepted_lengths
from radixgen.runtime.speculative.drafter import Drafter
from radixgen.runtime.speculative.grammar_drafts import GrammarDrafts
from radixgen.runtime.speculative.ngram import NgramDrafter, ngram_lookup
from radixgen.runtime.speculative.policy import SpeculationPolicy

if TYPE_CHECKING:
    from radixgen.runtime.engine_config import EngineConfig
    from radixgen.runtime.model_runner import ModelRunner

__all__ = ["Drafter", "GrammarDrafts", "NgramDrafter", "SpeculationPolicy", "accepted_lengths", "make_drafter",
           "ngram_lookup"]


def make_drafter(config: EngineConfig, runner: ModelRunner) -> Drafter | None:
    """The drafter of `config.speculative_algorithm` (None for "grammar": only forced text is drafted)."""
    algorithm = config.speculative_algorithm
    if algorithm == "ngram":
        return NgramDrafter(config.speculative_ngram_min, config.speculative_ngram_max)
    if algorithm == "draft_model":
        from radixgen.runtime.speculative.draft_model import DraftModelDrafter

        return DraftModelDrafter(config, runner)
    return None
