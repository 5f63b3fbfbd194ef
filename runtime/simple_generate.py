"""One request, start to finish, on a ModelRunner: the minimal generate path (the CLI's, and tests').

Prefill the prompt into freshly allocated KV slots, then decode one token per step until an EOS id or
`max_new_tokens`. Greedy at temperature 0; otherwise a softmax draw from a generator seeded with `seed`, so the
same seed gives the same tokens. The engine (runtime/engine.py) is the batched, cached path; this loop is kept
small on purpose so model correctness can be checked without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from radixgen.runtime.forward_batch import build_forward_batch
from radixgen.runtime.model_runner import ModelRunner


def sample_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """logits [vocab] (fp32) -> token id: argmax at temperature 0, else a draw from softmax(logits / T)."""
    if temperature <= 0.0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def generate_ids(runner: ModelRunner, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
                 seed: int | None = None, stop_ids: Iterable[int] = ()) -> Iterator[int]:
    """Yield each new token id as it is produced (a stop id is yielded, then generation ends).

    The KV slots and the request row are returned to the runner's pools when the iterator finishes or is closed.
    """
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if len(prompt_ids) + max_new_tokens > runner.context_length:
        raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                         f"context length {runner.context_length}")
    stop = set(stop_ids)
    generator = None
    if temperature > 0.0:
        generator = torch.Generator(device="cpu").manual_seed(seed if seed is not None else 0)
    table = runner.req_to_token_pool
    row = table.alloc()
    if row is None:
        raise RuntimeError("no free request row in the runner")
    owned: list = []
    try:
        new_ids, cached = list(prompt_ids), 0
        for _ in range(max_new_tokens):
            slots = runner.slot_allocator.alloc(len(new_ids))
            if slots is None:
                raise RuntimeError("the KV pool is full")
            owned.append(slots)
            table.write(row, cached, slots)
            batch = build_forward_batch([new_ids], [cached], [row], table.req_to_token, torch.from_numpy(slots))
            logits = runner.forward(batch)[0].cpu()
            token = sample_token(logits, temperature, generator)
            yield token
            if token in stop:
                return
            cached += len(new_ids)
            new_ids = [token]
    finally:
        for slots in owned:
            runner.slot_allocator.free(slots)
        table.free(row)
