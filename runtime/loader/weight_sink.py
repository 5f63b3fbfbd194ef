"""Copying checkpoint tensors, one at a time, into a model's preallocated (possibly fused) parameters."""

from __future__ import annotations

import logging

import torch

from radixgen.runtime.errors import CorruptModelFileError
from radixgen.runtime.models.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)

# Tensors some checkpoints carry that the model computes itself.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightSink:
    """Receives (name, tensor) pairs in any order; `finish()` checks that every expected tensor arrived."""

    def __init__(self, model: LlamaForCausalLM, source: str, exclude: frozenset[str] = frozenset()) -> None:
        """`exclude`: names another sink takes (the layer linears of a quantized checkpoint)."""
        self.source = source
        self.targets = {name: t for name, t in model.checkpoint_targets().items() if name not in exclude}
        self.loaded: set[str] = set()
        self.tied = model.config.tie_word_embeddings

    def wants(self, name: str) -> bool:
        return name in self.targets

    def skip(self, name: str, origin: str | None = None) -> None:
        """Note a checkpoint tensor the model has no place for (warned about unless it is a known extra)."""
        if not (name.endswith(_IGNORED_SUFFIXES) or (self.tied and name == "lm_head.weight")):
            logger.warning("%s: ignoring unexpected tensor %s", origin or self.source, name)

    @torch.no_grad()
    def put(self, name: str, tensor: torch.Tensor, origin: str | None = None) -> None:
        """Copy `tensor` (any dtype/device) into its target rows, converting to the parameter's dtype."""
        target = self.targets.get(name)
        if target is None:
            self.skip(name, origin)
            return
        dest = target.param[target.start : target.stop]
        if tuple(tensor.shape) != tuple(dest.shape):
            raise CorruptModelFileError(
                f"{origin or self.source}: tensor {name} has shape {tuple(tensor.shape)}, "
                f"the config implies {tuple(dest.shape)}"
            )
        dest.copy_(tensor)
        self.loaded.add(name)

    def finish(self) -> None:
        missing = [n for n in self.targets if n not in self.loaded]
        if missing:
            shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
            raise CorruptModelFileError(f"{self.source}: missing {len(missing)} tensor(s) the config requires: {shown}")
