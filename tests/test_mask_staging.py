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
    assert (masks[:, :5] == -1).all() and (masks[:, 5] == 0).all()  # ids past the tokenizer's: never allowed
    second = staging.rows(3)
    second[:] = 7
    assert (masks[:, :5] == -1).all()  # the previous step's rows are not overwritten by the next step's fill
    again = staging.rows(1)
    assert np.shares_memory(again, first)  # the sets alternate
