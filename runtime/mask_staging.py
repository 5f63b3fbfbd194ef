"""Host rows the engine loop fills with one step's grammar masks, sent to the device in one transfer.

On CUDA the rows are pinned, so the copy is asynchronous and the loop goes on filling nothing else while it
runs; two sets alternate, so filling a step's masks never writes rows the previous step's copy may still read.
On the CPU the host rows are the masks the sampler reads.
"""

from __future__ import annotations

import numpy as np
import torch


class MaskStaging:
    """`max_rows` packed bitmask rows of `words` int32 words; words from `live_words` on stay 0 (token ids past
    the tokenizer's vocabulary, the padding rows of the model's embedding, are never allowed)."""

    def __init__(self, max_rows: int, words: int, live_words: int, device: torch.device) -> None:
        self.device = device
        self.max_rows, self.words, self.live_words = max_rows, words, live_words
        self._masks: list[torch.Tensor] = []  # allocated with the first constrained step
        self._rows: list[torch.Tensor] = []
        self._turn = 0

    def rows(self, n: int) -> np.ndarray:
        """The next set's first `n` rows, to fill (only words [0, live_words) are ever written)."""
        if not self._masks:
            pin = self.device.type == "cuda"
            self._masks = [torch.zeros((self.max_rows, self.words), dtype=torch.int32, pin_memory=pin)
                           for _ in range(2)]
            self._rows = [torch.zeros(self.max_rows, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self._turn ^= 1
        view: np.ndarray = self._masks[self._turn].numpy()[:n, : self.live_words]
        return view

    def upload(self, logit_rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows just filled (one per entry of `logit_rows`, the logits row each applies to) on the device."""
        n = len(logit_rows)
        masks, rows = self._masks[self._turn][:n], self._rows[self._turn][:n]
        rows.numpy()[:] = logit_rows
        if self.device.type == "cpu":
            return masks, rows
        return masks.to(self.device, non_blocking=True), rows.to(self.device, non_blocking=True)
