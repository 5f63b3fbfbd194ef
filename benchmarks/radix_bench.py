"""RadixCache speed: 10k sequences of 1k tokens, and a deep multi-turn chat tree.

    python benchmarks/radix_bench.py
"""

from __future__ import annotations

import time

import numpy as np

from radixgen.radix import RadixCache


def shared_prefix_workload(
    num_seqs: int = 10_000, seq_len: int = 1024, num_groups: int = 100, prefix_len: int = 512
) -> np.ndarray:
    """`num_seqs` int32 rows: one of `num_groups` shared prefixes (a few-shot prompt) + a unique tail."""
    rng = np.random.default_rng(0)
    prefixes = rng.integers(0, 32_000, size=(num_groups, prefix_len), dtype=np.int32)
    seqs = np.empty((num_seqs, seq_len), dtype=np.int32)
    seqs[:, :prefix_len] = prefixes[np.arange(num_seqs) % num_groups]
    seqs[:, prefix_len:] = rng.integers(0, 32_000, size=(num_seqs, seq_len - prefix_len), dtype=np.int32)
    return seqs


def measure_insert_match(page_size: int) -> dict[str, float]:
    """Insert then match every row of the shared-prefix workload; rates in sequences per second."""
    seqs = shared_prefix_workload()
    num_seqs, seq_len = seqs.shape
    positions = np.arange(seq_len, dtype=np.int64)
    cache = RadixCache(page_size)
    start = time.perf_counter()
    for i in range(num_seqs):
        cache.insert(seqs[i], positions + i * seq_len)
    insert_s = time.perf_counter() - start
    start = time.perf_counter()
    hits = sum(cache.match_prefix(seqs[i]).length for i in range(num_seqs))
    match_s = time.perf_counter() - start
    assert hits == seqs.size  # every sequence is fully cached
    start = time.perf_counter()
    freed = cache.evict(cache.evictable_size())
    evict_s = time.perf_counter() - start
    assert len(freed) == cache.stats().evicted_tokens and cache.stats().num_nodes == 0
    return {
        "insert_seq_per_s": num_seqs / insert_s,
        "match_seq_per_s": num_seqs / match_s,
        "evict_all_s": evict_s,
    }


def measure_chat(conversations: int = 100, turns: int = 100, turn_len: int = 10) -> float:
    """Requests per second of the scheduler's round trip (match, lock, insert, unlock) over multi-turn chats,
    each turn resending the whole conversation: the tree grows `turns` nodes deep."""
    rng = np.random.default_rng(1)
    convs = rng.integers(0, 32_000, size=(conversations, turns * turn_len))
    cache, next_slot = RadixCache(), 0
    start = time.perf_counter()
    for turn in range(1, turns + 1):
        for conv in convs:
            seq = conv[: turn * turn_len]
            match = cache.match_prefix(seq)
            cache.lock(match.node)
            new = np.arange(next_slot, next_slot + len(seq) - match.length)
            next_slot += len(new)
            result = cache.insert(seq, np.concatenate([match.slots, new]))
            cache.unlock(match.node)
            assert result.cached_len == match.length == (turn - 1) * turn_len
    return conversations * turns / (time.perf_counter() - start)


if __name__ == "__main__":
    for page_size in (1, 16):
        r = measure_insert_match(page_size)
        print(
            f"page_size={page_size:>2}: insert {r['insert_seq_per_s']:>9,.0f} seq/s "
            f"({r['insert_seq_per_s'] * 1024 / 1e6:.1f}M tok/s), match {r['match_seq_per_s']:>9,.0f} seq/s "
            f"({r['match_seq_per_s'] * 1024 / 1e6:.1f}M tok/s), evict all 5.1M tokens {r['evict_all_s']:.3f} s"
        )
    print(f"chat (100 convs x 100 turns x 10 tokens): {measure_chat():,.0f} match+lock+insert+unlock per s")
