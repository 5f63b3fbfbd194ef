"""The engine's host rows for a step's grammar masks (runtime/mask_staging.py)."""

from __future__ import annotations

import numpy as np
import torch

from radixgen.runtime.mask_staging import MaskStaging


def test_two_sets_alternate_and_padding_words_stay_zero():
    staging = MaskStaging(max_rows=4, words=6, live_words=5, device=torch.device("cpu"))
    first = staging.rows(2)
    assert first.shape == (2, 5)
    first[:] = -1
    masks, rows = staging.upload([3, 0])
    assert masks.shape == (2, 6) and rows.tolist() == [3, 0]
    assert masks.untyped_storage().data_ptr() == rows.untyped_storage().data_ptr()  # one transfer moves both
    assert (masks[:, :5] == -1).all() and (masks[:, 5] == 0).all()  # ids past the tokenizer's: never allowed
    second = staging.rows(3)
    second[:] = 7
    assert (masks[:, :5] == -1).all()  # the previous step's rows are not overwritten by the next step's fill
    again = staging.rows(1)
    assert np.shares_memory(again, first)  # the sets alternate


def test_staged_rows_apply_as_the_reference_applies_contiguous_ones():
    from radixgen.kernels import apply_token_bitmask_reference

    gen = torch.Generator().manual_seed(0)
    staging = MaskStaging(max_rows=3, words=4, live_words=4, device=torch.device("cpu"))
    filled = staging.rows(2)
    filled[:] = torch.randint(-(2**31), 2**31 - 1, (2, 4), generator=gen, dtype=torch.int32).numpy()
    masks, rows = staging.upload([4, 1])
    assert masks.stride(-1) == 1 and rows.dtype == torch.int32
    logits = torch.randn(5, 100, generator=gen)
    expected = logits.clone()
    apply_token_bitmask_reference(expected, masks.contiguous(), torch.tensor([4, 1]))
    apply_token_bitmask_reference(logits, masks, rows)
    assert torch.equal(logits, expected)
