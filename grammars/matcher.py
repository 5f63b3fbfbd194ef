"""Per-request matcher: the automaton state after each accepted token, masks, jump-forward, rollback."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from radixgen.grammars.automaton import DEAD
from radixgen.grammars.token_refs import marker_bytes

if TYPE_CHECKING:
    from radixgen.grammars.grammar import Grammar

MAX_FORCED_BYTES = 4096


def copy_mask(mask: np.ndarray, row: np.ndarray) -> None:
    """`mask` (ceil(V/32) words) into the front of `row`, the rest of `row` zeroed (padding ids never allowed)."""
    words = mask.shape[0]
    if row.shape[0] == words:
        np.copyto(row, mask)
        return
    row[:words] = mask
    row[words:] = 0


class _Position(NamedTuple):
    state: int
    eos_accepted: bool


class Matcher:
    """Tracks one generation against a compiled `Grammar`. Cheap to create; not thread-safe (one per request).

    History holds one position per accepted token (or `advance_bytes` call), so `rollback(n)` undoes the last
    n of them.
    """

    def __init__(self, grammar: Grammar) -> None:
        self._grammar = grammar
        self._history: list[_Position] = [_Position(grammar.automaton.initial, False)]

    @property
    def grammar(self) -> Grammar:
        return self._grammar

    @property
    def state(self) -> int:
        """The automaton state id (equal ids = equal futures within one grammar)."""
        return self._history[-1].state

    @property
    def num_advanced(self) -> int:
        """Tokens (and byte chunks) accepted so far that `rollback` can undo."""
        return len(self._history) - 1

    def is_accepting(self) -> bool:
        """The text so far is a complete match (EOS would be allowed)."""
        pos = self._history[-1]
        return pos.eos_accepted or self._grammar.automaton.accepting(pos.state)

    def is_terminated(self) -> bool:
        """EOS was accepted, or the text is complete and nothing can follow it."""
        pos = self._history[-1]
        return pos.eos_accepted or (self._grammar.automaton.accepting(pos.state)
                                    and not self._grammar.has_continuation(pos.state))

    def fill_mask(self, row: np.ndarray) -> None:
        """Write the packed int32 bitmask of allowed next tokens into `row`.

        `row` holds at least ceil(V/32) words for the vocabulary's V tokens; extra words (a model whose logits
        are padded past the tokenizer's vocabulary) are zeroed, so padding ids are never allowed."""
        pos = self._history[-1]
        copy_mask(self._grammar.vocab.eos_mask if pos.eos_accepted else self._grammar.mask(pos.state), row)

    def allowed_token_ids(self) -> np.ndarray:
        """The allowed ids as an int array (convenience for tests and samplers without a bitmask kernel)."""
        pos = self._history[-1]
        row = self._grammar.vocab.eos_mask if pos.eos_accepted else self._grammar.mask(pos.state)
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")[: self._grammar.vocab.size]
        return np.flatnonzero(bits)

    def accepts_token(self, token_id: int) -> bool:
        return self._next(token_id) is not None

    def _next(self, token_id: int) -> _Position | None:
        """The position after `token_id`: read as a token reference where the grammar names it here (its
        marker bytes, token_refs.py), else as EOS where the text is complete, else as its text."""
        pos = self._history[-1]
        grammar = self._grammar
        vocab = grammar.vocab
        if pos.eos_accepted or not 0 <= token_id < vocab.size:
            return None
        if grammar.reads_token_ref(pos.state):
            nxt = grammar.automaton.step(pos.state, marker_bytes(token_id))
            if nxt != DEAD:
                return _Position(nxt, False)
        if token_id in vocab.special_ids:
            if token_id in vocab.eos_token_ids and grammar.automaton.accepting(pos.state):
                return _Position(pos.state, True)
            return None
        if token_id in vocab.text_excluded or not vocab.token_bytes[token_id]:
            return None
        nxt = grammar.automaton.step(pos.state, vocab.token_bytes[token_id])
        return None if nxt == DEAD else _Position(nxt, False)

    def advance(self, token_id: int) -> bool:
        """Accept `token_id` if the grammar allows it; returns False (state unchanged) otherwise."""
        nxt = self._next(token_id)
        if nxt is None:
            return False
        self._history.append(nxt)
        return True

    def advance_bytes(self, data: bytes) -> bool:
        """Accept raw bytes (e.g. a jump-forward string re-tokenized by the caller); one history entry."""
        pos = self._history[-1]
        if pos.eos_accepted:
            return False
        nxt = self._grammar.automaton.step(pos.state, data)
        if nxt == DEAD:
            return False
        self._history.append(_Position(nxt, False))
        return True

    def forced_suffix(self) -> bytes:
        """The bytes every valid continuation starts with (empty when EOS or two bytes are possible; never a
        token reference's marker bytes)."""
        pos = self._history[-1]
        if pos.eos_accepted:
            return b""
        return self._grammar.forced_bytes(pos.state, MAX_FORCED_BYTES)

    def forced_token(self) -> int | None:
        """The token every valid continuation starts with, where the grammar names one token there (a special
        or added token: `forced_suffix` stops before it); None otherwise. Jump-forward appends it as an id."""
        pos = self._history[-1]
        return None if pos.eos_accepted else self._grammar.forced_token(pos.state)

    def fork(self) -> Matcher:
        """An independent matcher at the same position, with the same history to roll back: a copy of the
        history list (its positions are immutable), no token replayed."""
        twin = Matcher.__new__(Matcher)
        twin._grammar = self._grammar
        twin._history = self._history.copy()
        return twin

    def rollback(self, n_tokens: int) -> None:
        """Undo the last `n_tokens` accepted tokens (byte chunks from `advance_bytes` count as one)."""
        if not 0 <= n_tokens <= self.num_advanced:
            raise ValueError(f"cannot roll back {n_tokens} tokens; {self.num_advanced} were accepted")
        if n_tokens:
            del self._history[-n_tokens:]

    def reset(self) -> None:
        del self._history[1:]
