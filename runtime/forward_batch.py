"""The batch description one model forward consumes: flat token tensors plus KV slot bookkeeping.

Lengths, per request b (all int tensors of shape [B] on the model's device):

    prefix_lens[b]  tokens already in the KV pool before this forward (cached or computed earlier)
    extend_lens[b]  tokens computed by this forward (1 for a decode row)
    seq_lens[b]     prefix_lens[b] + extend_lens[b]: the KV length after this forward

Tokens of request b occupy rows extend_start_loc[b] : extend_start_loc[b] + extend_lens[b] of the flat
tensors. Slot of position p of request b: req_to_token[req_pool_indices[b], p]. The forward first writes the
new K/V rows into out_cache_loc, then attention reads every position 0..seq_len-1 by slot index, so cached
prefixes are read in place.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill / chunked prefill / mixed: any extend_lens
    DECODE = "decode"  # every request extends by exactly one token


@dataclass
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, position of each token within its sequence
    out_cache_loc: torch.Tensor  # [T] int64, KV slot each new token writes
    req_pool_indices: torch.Tensor  # [B] int64, row of req_to_token per request
    req_to_token: torch.Tensor  # [R, max_context] int32, slot of each position of each request row
    prefix_lens: torch.Tensor  # [B] int32
    extend_lens: torch.Tensor  # [B] int32
    seq_lens: torch.Tensor  # [B] int32
    extend_start_loc: torch.Tensor  # [B] int32, offset of request b's first token in the flat tensors
    # Which flat rows need logits: the last token of each request by default; every token of a request when
    # its prompt logprobs are wanted. None = last token of each request.
    logits_indices: torch.Tensor | None = None
    max_extend_len: int = 1
    max_seq_len: int = 1

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def last_token_indices(self) -> torch.Tensor:
        """Flat row of each request's last token."""
        return (self.extend_start_loc + self.extend_lens - 1).long()


def build_forward_batch(
    input_ids: list[list[int]] | list,
    prefix_lens: list[int],
    req_pool_indices: list[int],
    req_to_token: torch.Tensor,
    out_cache_loc: torch.Tensor,
    logits_indices: torch.Tensor | None = None,
) -> ForwardBatch:
    """Assemble a ForwardBatch from per-request new token ids and cached lengths (host-side helper).

    `input_ids[b]` are the tokens request b computes now; their slots (`out_cache_loc`, flat) must already be
    written into `req_to_token` at positions prefix_lens[b] .. prefix_lens[b] + len(input_ids[b]) - 1.
    """
    import numpy as np

    device = req_to_token.device
    extend = np.fromiter((len(x) for x in input_ids), dtype=np.int64, count=len(input_ids))
    prefix = np.asarray(prefix_lens, dtype=np.int64)
    starts = np.zeros_like(extend)
    if len(extend) > 1:
        starts[1:] = np.cumsum(extend)[:-1]
    flat = np.concatenate([np.asarray(x, dtype=np.int64) for x in input_ids]) if len(input_ids) else np.zeros(0, np.int64)
    positions = np.concatenate(
        [np.arange(p, p + e, dtype=np.int64) for p, e in zip(prefix, extend)]
    ) if len(input_ids) else np.zeros(0, np.int64)
    seq = prefix + extend
    mode = ForwardMode.DECODE if len(extend) and bool((extend == 1).all()) else ForwardMode.EXTEND

    def t(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(a).to(device=device, dtype=dtype)

    return ForwardBatch(
        mode=mode,
        input_ids=t(flat, torch.int64),
        positions=t(positions, torch.int64),
        out_cache_loc=out_cache_loc.to(device=device, dtype=torch.int64),
        req_pool_indices=t(np.asarray(req_pool_indices, dtype=np.int64), torch.int64),
        req_to_token=req_to_token,
        prefix_lens=t(prefix, torch.int32),
        extend_lens=t(extend, torch.int32),
        seq_lens=t(seq, torch.int32),
        extend_start_loc=t(starts, torch.int32),
        logits_indices=logits_indices,
        max_extend_len=int(extend.max()) if len(extend) else 1,
        max_seq_len=int(seq.max()) if len(seq) else 1,
    )
