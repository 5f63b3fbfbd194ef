"""The interface every drafter offers the engine: proposals for a batch of requests, and a release hook."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from radixgen.runtime.request import Req

TokenIds = npt.NDArray[np.int64]


class Drafter(Protocol):
    """Proposes up to `k` next tokens per request (possibly none). Batched, so a draft model runs one forward
    for all the requests that speculate this step; `release` forgets a request that finished."""

    def propose(self, reqs: Sequence[Req], k: int) -> list[TokenIds]: ...

    def release(self, rid: str) -> None: ...
