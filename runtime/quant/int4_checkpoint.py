"""GPTQ and AWQ checkpoint tensors of one linear -> Int4Weight (our layout: kernels/quant_weight.py).

    GPTQ  qweight int32 [K / 8, N]  8 rows of one column per word, lowest nibble first (our layout)
          qzeros  int32 [K / g, N / 8]  8 columns per word; the original format stores zero - 1
          scales  fp16 [K / g, N];  g_idx int32 [K]: the group of each input row (act-order: not k // g)
    AWQ   qweight int32 [K, N / 8], qzeros int32 [K / g, N / 8]: 8 columns per word, nibble i holding column
          AWQ_ORDER[i] of its eight; scales fp16 [K / g, N]
An act-order GPTQ weight is stored with its rows sorted by group, and x's columns are gathered to match.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from radixgen.kernels import Int4Weight, pack_int4, unpack_int4
from radixgen.runtime.errors import CorruptModelFileError, UnsupportedQuantizationError
from radixgen.runtime.quant.scheme import Int4Checkpoint

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_AWQ_UNDO = torch.tensor([AWQ_ORDER.index(i) for i in range(8)])  # nibble holding column i of a word


def _unpack_columns(packed: Tensor, awq: bool) -> Tensor:
    """int32 [R, N / 8] packed along columns -> int32 [R, N]."""
    q = unpack_int4(packed.t().contiguous())  # [N, R]: row c * 8 + i from nibble i of word c
    if awq:
        n, r = q.shape
        q = q.reshape(n // 8, 8, r)[:, _AWQ_UNDO.to(q.device), :].reshape(n, r)
    return q.t()


def int4_from_checkpoint(parts: Mapping[str, Tensor], scheme: Int4Checkpoint, name: str, source: str) -> Int4Weight:
    """The Int4Weight of checkpoint module `name` from its tensors (keys qweight, qzeros, scales, g_idx)."""
    g = scheme.group_size
    scales = parts["scales"].half()
    groups, n = scales.shape
    zeros = (_unpack_columns(parts["qzeros"].to(torch.int32), scheme.method == "awq")[:, :n]
             + scheme.zero_offset).half()
    if scheme.method == "awq":
        q = _unpack_columns(parts["qweight"].to(torch.int32), awq=True)  # [K, N]
    else:
        q = unpack_int4(parts["qweight"].to(torch.int32))
    k = q.shape[0]
    if k != groups * g or zeros.shape != scales.shape or q.shape[1] != n:
        raise CorruptModelFileError(f"{source}: {name}: qweight {tuple(parts['qweight'].shape)}, scales "
                                    f"{tuple(scales.shape)} and qzeros do not fit group_size {g}")
    perm = None
    g_idx = parts.get("g_idx")
    if g_idx is not None and not torch.equal(g_idx.long().cpu(), torch.arange(k) // g):
        perm = torch.argsort(g_idx.long(), stable=True)
        counts = torch.bincount(g_idx.long().cpu(), minlength=groups)
        if counts.numel() != groups or not bool((counts == g).all()):
            raise UnsupportedQuantizationError(f"{source}: {name}: g_idx gives groups of unequal sizes; supported: "
                                               f"act-order with {g} rows in every group")
        q = q.index_select(0, perm)
    return Int4Weight(pack_int4(q), scales.contiguous(), zeros.contiguous(), g, perm)
