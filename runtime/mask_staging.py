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
    the tokenizer's vocabulary, the padding rows of the model's embedding, are never allowed). Each row keeps the
    logits row it applies to in the word after its mask (rows padded to 16 bytes), so one copy moves both, into
    a device set allocated once; the views a step of `n` rows reads are made once per `n`."""

    def __init__(self, max_rows: int, words: int, live_words: int, device: torch.device) -> None:
        self.device = device
        self.max_rows, self.words, self.live_words = max_rows, words, live_words
        self.stride = -(-(words + 1) // 4) * 4  # words per staged row: the mask, its logits row, padding
        self._sets: list[_StagedSet] = []  # allocated with the first constrained step
        self._turn = 0

    def rows(self, n: int) -> np.ndarray:
        """The next set's first `n` rows, to fill (only words [0, live_words) are ever written)."""
        if not self._sets:
            self._sets = [_StagedSet(self.max_rows, self.stride, self.words, self.device) for _ in range(2)]
        self._turn ^= 1
        view: np.ndarray = self._sets[self._turn].host_view[:n, : self.live_words]
        return view

    def upload(self, logit_rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows just filled (one per entry of `logit_rows`, the logits row each applies to) on the device, as
        the masks [n, words] and their logits rows [n] (int32), both read from one transfer."""
        staged = self._sets[self._turn]
        n = len(logit_rows)
        staged.host_view[:n, self.words] = logit_rows
        return staged.send(n)


class _StagedSet:
    """One set of staged rows: host rows (pinned on CUDA), their device twin, and per row count the slices a
    transfer copies and the views the sampler reads."""

    def __init__(self, max_rows: int, stride: int, words: int, device: torch.device) -> None:
        on_cuda = device.type == "cuda"
        self.host = torch.zeros((max_rows, stride), dtype=torch.int32, pin_memory=on_cuda)
        self.host_view: np.ndarray = self.host.numpy()
        self.device_rows = torch.zeros_like(self.host, device=device) if device.type != "cpu" else self.host
        self.words = words
        self._by_count: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def send(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        views = self._by_count.get(n)
        if views is None:
            dev = self.device_rows[:n]
            views = self._by_count[n] = (self.host[:n], dev, dev[:, : self.words], dev[:, self.words])
        src, dst, masks, rows = views
        if dst is not src:
            dst.copy_(src, non_blocking=True)
        return masks, rows
