"""Copying checkpoint tensors, one at a time, into a model's preallocated (possibly fused) parameters."""

from __future__ import annotations

import logging
import re

import torch

from radixgen.runtime.errors import CorruptModelFileError
from radixgen.runtime.models.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)

# Tensors some checkpoints carry that the model computes itself.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# FP8 KV cache scales of FP8 checkpoints (vLLM's and compressed-tensors' names): dequantized K = code * k_scale.
_KV_SCALE = re.compile(r"^model\.layers\.(\d+)\.self_attn\.([kv])_scale$")


class WeightSink:
    """Receives (name, tensor) pairs in any order; `finish()` checks that every expected tensor arrived."""

    def __init__(self, model: LlamaForCausalLM, source: str, exclude: frozenset[str] = frozenset()) -> None:
        """`exclude`: names another sink takes (the layer linears of a quantized checkpoint)."""
        self.source = source
        self.targets = {name: t for name, t in model.checkpoint_targets().items() if name not in exclude}
        self.loaded: set[str] = set()
        self.tied = model.config.tie_word_embeddings
        self.num_layers = model.config.num_hidden_layers
        self._kv_scales: dict[tuple[int, str], torch.Tensor] = {}  # (layer, "k" | "v") -> its scale(s)

    def wants(self, name: str) -> bool:
        return name in self.targets or _KV_SCALE.match(name) is not None

    def skip(self, name: str, origin: str | None = None) -> None:
        """Note a checkpoint tensor the model has no place for (warned about unless it is a known extra)."""
        if not (name.endswith(_IGNORED_SUFFIXES) or (self.tied and name == "lm_head.weight")):
            logger.warning("%s: ignoring unexpected tensor %s", origin or self.source, name)

    @torch.no_grad()
    def put(self, name: str, tensor: torch.Tensor, origin: str | None = None) -> None:
        """Copy `tensor` (any dtype/device) into its target rows, converting to the parameter's dtype."""
        target = self.targets.get(name)
        if target is None:
            scale = _KV_SCALE.match(name)
            if scale is not None:
                self._kv_scales[(int(scale[1]), scale[2])] = tensor.detach().float().reshape(-1).cpu()
                return
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

    def kv_scales(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The checkpoint's K and V cache scales, [num_layers, 1] (per tensor) or [num_layers, num_kv_heads],
        when every layer has both; None otherwise (an FP8 KV cache then keeps its default scales)."""
        if len(self._kv_scales) != 2 * self.num_layers:
            return None
        try:
            k, v = (torch.stack([self._kv_scales[(i, kind)] for i in range(self.num_layers)]) for kind in "kv")
        except (KeyError, RuntimeError):  # a layer missing one, or layers of different widths
            return None
        return k, v

    def finish(self) -> None:
        missing = [n for n in self.targets if n not in self.loaded]
        if missing:
            shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
            raise CorruptModelFileError(f"{self.source}: missing {len(missing)} tensor(s) the config requires: {shown}")
