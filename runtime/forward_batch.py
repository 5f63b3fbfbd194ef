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
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
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
    # Leading requests that extend by exactly one token (running decodes, which the scheduler puts first): in
    # an EXTEND batch, attention runs them through the decode kernel (runtime/attention/backend.py, split_rows).
    num_decode_rows: int = 0
    # The host arrays `extend_lens` and `logits_indices` were sent from, where the batch was assembled on the host
    # (None otherwise): a graph runner tells from them, without reading the device, whether its static buffers
    # already hold this batch's row layout.
    host_extend_lens: np.ndarray | None = None
    host_logits_indices: np.ndarray | None = None

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def last_token_indices(self) -> torch.Tensor:
        """Flat row of each request's last token."""
        return (self.extend_start_loc + self.extend_lens - 1).long()


_ALIGN = 4  # elements: 16 bytes of int32, 32 of int64


def exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    out = np.zeros_like(x)
    if len(x) > 1:
        np.cumsum(x[:-1], out=out[1:])
    return out


def pack_to_device(parts: list[np.ndarray], dtype: type, device: torch.device) -> list[torch.Tensor]:
    """One host-to-device copy of `parts` (as `dtype`); returns each part's slice, each starting on a 16-byte
    boundary (Triton specializes kernels on pointer alignment: unaligned slices would compile other variants)."""
    sizes = [len(p) for p in parts]
    starts = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([-(-n // _ALIGN) * _ALIGN for n in sizes], out=starts[1:])
    host: np.ndarray = np.zeros(int(starts[-1]), dtype=dtype)
    for part, a in zip(parts, starts):
        host[a : a + len(part)] = part
    dev = host_to_device(host, device)
    return [dev[a : a + n] for a, n in zip(starts, sizes)]


def host_to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """`array` on `device`. To CUDA through pinned memory without waiting: a pageable copy would also wait for
    every kernel queued before it, which stalls the overlapped loop behind the step in flight. (The caching
    host allocator keeps the pinned block until the copy has read it.)"""
    host = torch.from_numpy(array)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def assemble_forward_batch(ids: np.ndarray, prefix_lens: np.ndarray, extend_lens: np.ndarray,
                           req_pool_indices: np.ndarray, out_cache_loc: np.ndarray, req_to_token: torch.Tensor,
                           logit_rows: np.ndarray | None = None,
                           table_writes: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                           device_ids: torch.Tensor | None = None) -> ForwardBatch:
    """A ForwardBatch from host int arrays (flat `ids` and `out_cache_loc`, per-request lengths and rows), sent
    to the device in two copies. `table_writes` = (rows, cols, slots) entries of req_to_token to set first, in
    the same copies; `logit_rows` None means the model takes each request's last token. `device_ids`, when
    given, are the flat input ids already on the device (tokens the previous step sampled and the host has not
    read yet: the overlapped loop); `ids` is then ignored."""
    device = req_to_token.device
    extend_lens = extend_lens.astype(np.int64, copy=False)
    prefix_lens = prefix_lens.astype(np.int64, copy=False)
    loc = exclusive_cumsum(extend_lens)
    total = int(extend_lens.sum())
    seq = prefix_lens + extend_lens
    positions = np.repeat(prefix_lens - loc, extend_lens) + np.arange(total)
    rows, cols, slots = table_writes if table_writes is not None else (np.zeros(0, np.int64),) * 3
    logits = logit_rows if logit_rows is not None else np.zeros(0, np.int64)
    if device_ids is not None:
        ids = np.zeros(0, np.int64)
    p64 = pack_to_device([ids, positions, out_cache_loc, req_pool_indices, logits, rows, cols], np.int64, device)
    p32 = pack_to_device([prefix_lens, extend_lens, seq, loc, slots], np.int32, device)
    if len(rows):
        req_to_token[p64[5], p64[6]] = p32[4].to(req_to_token.dtype)
    return ForwardBatch(
        mode=ForwardMode.DECODE if len(extend_lens) and bool((extend_lens == 1).all()) else ForwardMode.EXTEND,
        input_ids=p64[0] if device_ids is None else device_ids,
        positions=p64[1],
        out_cache_loc=p64[2],
        req_pool_indices=p64[3],
        req_to_token=req_to_token,
        prefix_lens=p32[0],
        extend_lens=p32[1],
        seq_lens=p32[2],
        extend_start_loc=p32[3],
        logits_indices=p64[4] if logit_rows is not None else None,
        max_extend_len=int(extend_lens.max()) if len(extend_lens) else 1,
        max_seq_len=int(seq.max()) if len(seq) else 1,
        num_decode_rows=_leading_ones(extend_lens),
        host_extend_lens=extend_lens,
        host_logits_indices=logit_rows,
    )


def _leading_ones(x: np.ndarray) -> int:
    """Length of the run of 1s at the start of x."""
    not_one = np.flatnonzero(x != 1)
    return int(not_one[0]) if len(not_one) else len(x)


def forward_batch_from_lists(
    input_ids: Sequence[Sequence[int]],
    prefix_lens: Sequence[int],
    req_pool_indices: Sequence[int],
    req_to_token: torch.Tensor,
    out_cache_loc: torch.Tensor | np.ndarray,
    logits_indices: torch.Tensor | None = None,
) -> ForwardBatch:
    """Assemble a ForwardBatch from per-request new token ids and cached lengths (for tests and benchmarks; the
    engine builds its batches from a schedule in runtime/batch_builder.py, through the same assembly).

    `input_ids[b]` are the tokens request b computes now; their slots (`out_cache_loc`, flat) must already be
    written into `req_to_token` at positions prefix_lens[b] .. prefix_lens[b] + len(input_ids[b]) - 1.
    """
    extend = np.fromiter((len(x) for x in input_ids), dtype=np.int64, count=len(input_ids))
    flat = (np.concatenate([np.asarray(x, dtype=np.int64) for x in input_ids]) if len(input_ids)
            else np.zeros(0, np.int64))
    loc = out_cache_loc.detach().cpu().numpy() if isinstance(out_cache_loc, torch.Tensor) else np.asarray(out_cache_loc)
    rows = None if logits_indices is None else logits_indices.detach().cpu().numpy().astype(np.int64)
    return assemble_forward_batch(flat, np.asarray(prefix_lens, dtype=np.int64), extend,
                                  np.asarray(req_pool_indices, dtype=np.int64), loc.astype(np.int64), req_to_token,
                                  logit_rows=rows)
