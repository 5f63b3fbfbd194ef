"""radixgen.radix: the prefix cache, a radix tree from token-id prefixes to KV slot indices.

A library with no engine state (numpy only). `RadixCache` caches; `NoPrefixCache` is the stand-in with the
same interface (`PrefixCache`) for when caching is off. See docs/radix.md.
"""

from .api import CacheStats, InsertResult, MatchResult, Namespace, PrefixCache
from .no_cache import NoPrefixCache
from .node import RadixNode
from .tree import RadixCache

__all__ = [
    "CacheStats",
    "InsertResult",
    "MatchResult",
    "Namespace",
    "NoPrefixCache",
    "PrefixCache",
    "RadixCache",
    "RadixNode",
]
