"""Grammar drafts: the text a constraint forces becomes a draft (acceptance 1 unless the model tokenizes it
otherwise), and any other draft of a constrained request is cut where its grammar refuses a token."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from radixgen.runtime.speculative.drafter import TokenIds

if TYPE_CHECKING:
    from radixgen.grammars.backend import GrammarMatcher
    from radixgen.tokenizer import Tokenizer


def whole_utf8_prefix(data: bytes) -> bytes:
    """`data` without an incomplete UTF-8 sequence at its end (the grammar may force part of a character)."""
    for cut in range(min(3, len(data)) + 1):
        try:
            (data[: len(data) - cut]).decode("utf-8")
            return data[: len(data) - cut]
        except UnicodeDecodeError:
            continue
    return b""


class GrammarDrafts:
    """Drafts for constrained requests, over the engine's tokenizer."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def forced(self, matcher: GrammarMatcher, k: int) -> TokenIds:
        """Up to `k` tokens spelling the text the grammar forces next (none when it forces nothing, or the
        forced bytes start inside a character)."""
        if matcher.is_terminated():
            return np.zeros(0, dtype=np.int64)
        try:
            text = whole_utf8_prefix(matcher.forced_suffix()).decode("utf-8")
        except UnicodeDecodeError:
            return np.zeros(0, dtype=np.int64)
        if not text:
            return np.zeros(0, dtype=np.int64)
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False)[:k], dtype=np.int64)

    @staticmethod
    def allowed_prefix(matcher: GrammarMatcher, draft: TokenIds) -> TokenIds:
        """The longest prefix of `draft` the grammar accepts from the matcher's state (which is left unchanged)."""
        taken = 0
        for t in draft.tolist():
            if matcher.is_terminated() or not matcher.advance(t):
                break
            taken += 1
        if taken:
            matcher.rollback(taken)
        return draft[:taken]
