"""When a step speculates, and how many drafts it verifies.

How many: the k that maximises expected tokens per unit of step time, from the drafts' smoothed acceptance rate
and what a verify step of 1 + k tokens per request costs in decode steps (`step_cost`, timed on the device).
Whether: the loop's measured throughput decides. Output tokens per second of wall time are tracked per batch-size
bucket for decoding steps with and without drafts (the whole loop period: a verify step is synchronous, so it
also gives up the overlap of host work with the forward, and its host work is larger); the faster mode runs,
and the other is probed now and then so a change of workload is noticed. Large batches, where verifying costs
more than the accepted drafts save, thus turn speculation off on their own.
"""

from __future__ import annotations

from collections.abc import Callable


class SpeculationPolicy:
    SMOOTHING = 0.1  # weight of the newest observation (acceptance, throughput)
    PROBE_EVERY = 32  # decoding steps of one bucket after which the mode not chosen is measured again
    WARMUP = 3  # observations of a mode before its throughput is trusted

    def __init__(self, max_draft_tokens: int, max_batch: int, step_cost: Callable[[int, int], float],
                 prior_acceptance: float = 0.6) -> None:
        self.max_draft_tokens = max_draft_tokens
        self.max_batch = max_batch
        self.step_cost = step_cost
        self.acceptance = prior_acceptance
        # per batch-size bucket: [tokens/s without drafts, with drafts], observations of each, steps since probe
        self._rate: dict[int, list[float]] = {}
        self._seen: dict[int, list[int]] = {}
        self._since_probe: dict[int, int] = {}

    def draft_tokens(self, batch_size: int) -> int:
        """The drafts per request for a decoding step of `batch_size` requests (0: a plain decode step)."""
        if batch_size > self.max_batch or self.max_draft_tokens <= 0:
            return 0
        k = self._best_k(batch_size)
        if k == 0:
            return 0
        bucket = _bucket(batch_size)
        seen = self._seen.setdefault(bucket, [0, 0])
        rate = self._rate.setdefault(bucket, [0.0, 0.0])
        for mode in (1, 0):  # measure each mode a few times first
            if seen[mode] < self.WARMUP:
                return k if mode else 0
        since = self._since_probe.get(bucket, 0) + 1
        self._since_probe[bucket] = since
        better = 1 if rate[1] >= rate[0] else 0
        if since >= self.PROBE_EVERY:
            self._since_probe[bucket] = 0
            better = 1 - better
        return k if better else 0

    def _best_k(self, batch_size: int) -> int:
        a = self.acceptance
        best_k, best = 0, 1.0  # plain decoding: one token per step of cost 1
        for k in range(1, self.max_draft_tokens + 1):
            expected = sum(a**i for i in range(k + 1))  # the target's own token plus each draft kept in a chain
            rate = expected / self.step_cost(batch_size, k + 1)
            if rate > best:
                best_k, best = k, rate
        return max(best_k, 1)  # the measured throughput, not this estimate, turns speculation off

    def observe(self, drafted: int, accepted: int) -> None:
        """One verify step's drafted and kept tokens (over its requests)."""
        if drafted > 0:
            self.acceptance += self.SMOOTHING * (accepted / drafted - self.acceptance)

    def observe_step(self, batch_size: int, speculated: bool, tokens: int, seconds: float) -> None:
        """A decoding step's loop period: `tokens` output tokens in `seconds`, with or without drafts."""
        if seconds <= 0 or batch_size > self.max_batch:
            return
        bucket = _bucket(batch_size)
        mode = int(speculated)
        seen = self._seen.setdefault(bucket, [0, 0])
        rate = self._rate.setdefault(bucket, [0.0, 0.0])
        value = tokens / seconds
        rate[mode] = value if seen[mode] == 0 else rate[mode] + self.SMOOTHING * (value - rate[mode])
        seen[mode] += 1


def _bucket(batch_size: int) -> int:
    """Batch sizes grouped by powers of two (1, 2, 3-4, 5-8, ...)."""
    return max(batch_size - 1, 0).bit_length()
