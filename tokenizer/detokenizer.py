"""Streaming detokenization: ids in, text out only once it is complete UTF-8 and can no longer change.

Works on the same per-id byte table as `Tokenizer.decode`, so for every prefix of ids
`emitted text + flush() == decode(prefix)`, and each step costs only the new token's bytes (linear overall).
  * byte-level vocabularies: an incremental UTF-8 decoder holds back an unfinished character;
  * SentencePiece byte fallback: a run of '<0xNN>' tokens is held until a normal token ends it, because
    one bad byte anywhere in the run turns the whole run into U+FFFD characters (Hugging Face's rule);
  * the SentencePiece leading space is dropped once, at the very start;
  * an id past the vocabulary gives no text and changes nothing, as `decode` leaves it out.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable


class IncrementalDetokenizer:
    def __init__(
        self,
        token_bytes: list[bytes],
        is_byte_token: bytearray | None,
        strip_leading_space: bool,
        skipped_ids: frozenset[int] = frozenset(),
    ):
        self._table = token_bytes
        self._skipped = skipped_ids  # ids that vanish entirely (skip_special_tokens), as if never generated
        self._is_byte = is_byte_token
        self._strip = strip_leading_space
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._run = bytearray()
        self._run_len = 0
        self._started = False  # some text has been emitted (so no leading space to drop any more)
        self._parts: list[str] = []

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._parts)

    def feed(self, token_id: int) -> str:
        """Add one id; returns the newly final text (possibly empty)."""
        if token_id in self._skipped or not 0 <= token_id < len(self._table):
            return ""  # an id past the vocabulary (a padding row of the model's embedding) has no text
        data = self._table[token_id]
        if self._is_byte is None:
            return self._emit(self._utf8.decode(data))
        if self._is_byte[token_id]:
            self._run += data
            self._run_len += 1
            return ""
        return self._emit(self._close_run() + data.decode("utf-8", "replace"))

    def feed_many(self, ids: Iterable[int]) -> str:
        """Add several ids; returns the newly final text, as feeding them one by one would. A byte-level
        vocabulary decodes their bytes in one call (a finishing request's whole output, at the end of a step in
        which a batch ends together)."""
        if self._is_byte is not None:
            return "".join([self.feed(i) for i in ids])
        table, skipped, n = self._table, self._skipped, len(self._table)
        return self._emit(self._utf8.decode(b"".join([table[i] for i in ids if 0 <= i < n and i not in skipped])))

    def flush(self) -> str:
        """End of stream: whatever is held back, decoded with replacement characters."""
        if self._is_byte is None:
            return self._emit(self._utf8.decode(b"", final=True))
        return self._emit(self._close_run())

    def _close_run(self) -> str:
        if not self._run_len:
            return ""
        try:
            text = self._run.decode("utf-8")
        except UnicodeDecodeError:
            text = "\ufffd" * self._run_len
        self._run.clear()
        self._run_len = 0
        return text

    def _emit(self, text: str) -> str:
        if not text:
            return text
        if not self._started:
            self._started = True
            if self._strip and text.startswith(" "):
                text = text[1:]
        self._parts.append(text)
        return text
