"""Added and special tokens: matched in the raw text before any normalization or splitting, as HF does.

Matching is leftmost, and longest among tokens starting at the same place (alternatives sorted by length).
`lstrip`/`rstrip` let a token swallow the whitespace on its left/right; `single_word` only matches a token
that is not glued to word characters. Tokens marked `normalized` are matched in normalized text instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import regex


@dataclass(frozen=True)
class AddedToken:
    id: int
    content: str
    special: bool = True
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False
    normalized: bool = False


# A segment is either text still to tokenize (str) or the id of a matched added token (int).
Segment = str | int


class AddedTokenMatcher:
    """Splits text into plain-text segments and added-token ids."""

    def __init__(self, tokens: list[AddedToken]):
        self.by_content = {t.content: t.id for t in tokens}
        ordered = sorted(tokens, key=lambda t: -len(t.content))
        alternatives = []
        for t in ordered:
            body = regex.escape(t.content)
            if t.single_word:
                body = rf"(?<![\w]){body}(?![\w])"
            alternatives.append((r"\s*" if t.lstrip else "") + body + (r"\s*" if t.rstrip else ""))
        self.pattern = regex.compile("|".join(alternatives)) if alternatives else None

    def split(self, text: str) -> list[Segment]:
        if self.pattern is None:
            return [text]
        out: list[Segment] = []
        pos = 0
        for m in self.pattern.finditer(text):
            if m.start() > pos:
                out.append(text[pos : m.start()])
            found = m.group()
            tid = self.by_content.get(found)
            if tid is None:  # the match swallowed whitespace (lstrip / rstrip)
                tid = self.by_content[found.strip()]
            out.append(tid)
            pos = m.end()
        if pos == 0:
            return [text]
        if pos < len(text):
            out.append(text[pos:])
        return out
