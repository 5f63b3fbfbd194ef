"""Random weights for any config (load_format="dummy"): for benchmarks of shapes we have no checkpoint for."""

from __future__ import annotations

import torch

from radixgen.runtime.models.llama import LlamaForCausalLM


@torch.no_grad()
def init_dummy_weights(model: LlamaForCausalLM, seed: int = 0, std: float = 0.02) -> None:
    """Matrices and biases ~ N(0, std); norm weights (1-D params named *norm*) = 1, so activations stay sane."""
    gen = torch.Generator(device=model.device).manual_seed(seed)
    for name, param in model.named_parameters():
        if param.dim() == 1 and ("norm" in name or "layernorm" in name):
            param.fill_(1.0)
        else:
            param.normal_(0.0, std, generator=gen)
