"""Prompt scoring: logprobs of given next tokens under rows of raw logits (for `select`, `logprob_start_len`).

Row t of `logits` is the model's prediction after token t, so the logprob of prompt token t + 1 is
`log_softmax(logits[t])[ids[t + 1]]`; callers pass the already shifted `next_ids`. Logits are the model's
(temperature 1, no penalties: a prompt is scored, not sampled). Rows are processed in chunks so a long prompt
never materialises a full float32 [T, V] log_softmax at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprobs:
    logprobs: torch.Tensor  # [T] float32: logprob of next_ids[t] under row t
    top_values: torch.Tensor | None = None  # [T, k] float32, descending
    top_ids: torch.Tensor | None = None  # [T, k] int64


def token_logprobs(logits: torch.Tensor, next_ids: torch.Tensor, top_k: int = 0,
                   chunk_rows: int = 256) -> TokenLogprobs:
    """Logprob of `next_ids[t]` ([T] int) under `logits[t]` ([T, V], any float dtype), plus the `top_k`
    best entries of every row when top_k > 0."""
    if logits.dim() != 2 or next_ids.shape != logits.shape[:1]:
        raise ValueError(f"logits [T, V] and next_ids [T] expected, got {list(logits.shape)} and "
                         f"{list(next_ids.shape)}")
    T, V = logits.shape
    k = min(top_k, V)
    ids = next_ids.to(logits.device, torch.int64)
    out = torch.empty(T, dtype=torch.float32, device=logits.device)
    top_v = torch.empty(T, max(k, 0), dtype=torch.float32, device=logits.device)
    top_i = torch.empty(T, max(k, 0), dtype=torch.int64, device=logits.device)
    for start in range(0, T, chunk_rows):
        end = min(start + chunk_rows, T)
        lp = torch.log_softmax(logits[start:end].float(), dim=-1)
        out[start:end] = lp.gather(1, ids[start:end, None]).squeeze(1)
        if k > 0:
            top = lp.topk(k, dim=-1)
            top_v[start:end], top_i[start:end] = top.values, top.indices
    return TokenLogprobs(out, top_v, top_i) if k > 0 else TokenLogprobs(out)
