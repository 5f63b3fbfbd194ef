"""render_tree: a RadixCache as indented text, for debugging small trees and for test failure messages."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from .node import RadixNode
    from .tree import RadixCache


def render_tree(cache: RadixCache, max_tokens: int = 8) -> str:
    """One line per node: tokens -> slots, lock count, access tick; edges longer than `max_tokens` elided."""
    header = (
        f"RadixCache(page_size={cache.page_size}, evictable={cache.evictable_size()}, "
        f"protected={cache.protected_size()})"
    )
    lines = [header]
    for namespace, root in cache._roots.items():
        lines.append(f"namespace {namespace!r}")
        _render_children(root, 1, max_tokens, lines)
    return "\n".join(lines)


def _render_children(node: RadixNode, depth: int, max_tokens: int, lines: list[str]) -> None:
    for child in sorted(node.children.values(), key=lambda c: c.key[0]):
        lock = f" lock={child.lock_ref}" if child.lock_ref else ""
        lines.append(
            f"{'  ' * depth}{_ints(child.key, max_tokens)} -> {_ints(child.value, max_tokens)}"
            f"{lock} t={child.last_access}"
        )
        _render_children(child, depth + 1, max_tokens, lines)


def _ints(arr: npt.NDArray[np.int64], max_tokens: int) -> str:
    if len(arr) <= max_tokens:
        return "[" + " ".join(map(str, arr.tolist())) + "]"
    head = " ".join(map(str, arr[:max_tokens].tolist()))
    return f"[{head} ... +{len(arr) - max_tokens}]"
