"""Pre-tokenizers from tokenizer.json, compiled to one function `(text, at_start) -> list of pieces`.

Each step maps the current pieces to finer pieces, as Hugging Face's `PreTokenizedString.split` does. The
byte-level alphabet conversion of `ByteLevel` is not done here: pieces stay raw text so the BPE cache can be
keyed by them, and `PreTokenizer.byte_level` tells the model to spell a piece in bytes on a cache miss.

Supported: Split (all behaviours, invert), ByteLevel (prefix space, GPT-2 regex), Metaspace (prepend schemes,
split), Digits, WhitespaceSplit, Sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import regex

from .normalizers import pattern_of
from .patterns import GPT2

# A step maps the list of pieces of one text segment to a finer list; `at_start` says the segment begins at
# offset 0 of the input (Metaspace's "first" scheme prepends only there).
Step = Callable[[list[str], bool], list[str]]


@dataclass(frozen=True)
class PreTokenizer:
    steps: tuple[Step, ...]
    byte_level: bool  # pieces are spelled in GPT-2's byte alphabet before the model sees them

    def __call__(self, text: str, at_start: bool) -> list[str]:
        pieces = [text]
        for step in self.steps:
            pieces = step(pieces, at_start)
        return pieces


class RegexSplit:
    """Split each piece on a regex with one of Hugging Face's delimiter behaviours."""

    def __init__(self, pattern: regex.Pattern, behavior: str = "Isolated", invert: bool = False):
        self.pattern = pattern
        self.behavior = behavior
        self.invert = invert
        isolated = (
            behavior == "Isolated" and not invert and pattern.groups == 0
        )  # findall returns whole matches
        self._findall = pattern.findall if isolated else None

    def __call__(self, pieces: list[str], at_start: bool) -> list[str]:
        if self._findall is not None:
            # Fast path: the split patterns of real vocabularies match every character, so the matches alone
            # are the pieces; their total length proves it (non-overlapping, in order), else split exactly.
            out = (
                self._findall(pieces[0])
                if len(pieces) == 1
                else [q for p in pieces for q in self._findall(p)]
            )
            if sum(map(len, out)) == sum(map(len, pieces)):
                return out
        return [q for p in pieces for q in self._split_one(p)]

    def _split_one(self, text: str) -> list[str]:
        # (start, end, is_match) spans covering the text, matches and gaps alternating
        spans: list[tuple[int, int, bool]] = []
        pos = 0
        for m in self.pattern.finditer(text):
            if m.start() == m.end():
                continue
            if m.start() > pos:
                spans.append((pos, m.start(), False))
            spans.append((m.start(), m.end(), True))
            pos = m.end()
        if pos < len(text):
            spans.append((pos, len(text), False))
        if self.invert:
            spans = [(s, e, not is_match) for s, e, is_match in spans]
        out: list[str] = []
        behavior = self.behavior
        if behavior == "Isolated":
            return [text[s:e] for s, e, _ in spans]
        if behavior == "Removed":
            return [text[s:e] for s, e, is_match in spans if not is_match]
        if behavior == "MergedWithPrevious":  # a match joins the piece before it, unless that was a match
            previous_was_match = False
            for s, e, is_match in spans:
                if is_match and not previous_was_match and out:
                    out[-1] += text[s:e]
                else:
                    out.append(text[s:e])
                previous_was_match = is_match
            return out
        if behavior == "MergedWithNext":  # a match joins the piece after it, unless that is a match
            following_is_match = False
            for s, e, is_match in reversed(spans):
                if is_match and not following_is_match and out:
                    out[-1] = text[s:e] + out[-1]
                else:
                    out.append(text[s:e])
                following_is_match = is_match
            out.reverse()
            return out
        if behavior == "Contiguous":  # neighbours of the same kind (two matches, two gaps) are joined
            previous_was_match = False
            for s, e, is_match in spans:
                if out and is_match == previous_was_match:
                    out[-1] += text[s:e]
                else:
                    out.append(text[s:e])
                previous_was_match = is_match
            return out
        raise ValueError(f"unsupported split behavior {behavior!r}")


def _merged_with_next(delimiter: str, text: str) -> list[str]:
    """Split before every delimiter character, keeping it at the start of the next piece."""
    out: list[str] = []
    start = 0
    pos = text.find(delimiter, 1)
    while pos != -1:
        out.append(text[start:pos])
        start = pos
        pos = text.find(delimiter, pos + 1)
    out.append(text[start:])
    return [p for p in out if p]


@dataclass(frozen=True)
class Metaspace:
    replacement: str
    prepend_scheme: str  # "always" | "first" | "never"
    split: bool

    def __call__(self, pieces: list[str], at_start: bool) -> list[str]:
        out: list[str] = []
        rep = self.replacement
        for index, piece in enumerate(pieces):
            if not piece:
                continue
            piece = piece.replace(" ", rep)
            if not piece.startswith(rep) and (
                self.prepend_scheme == "always"
                or (self.prepend_scheme == "first" and at_start and index == 0)
            ):
                piece = rep + piece
            if self.split:
                out.extend(_merged_with_next(rep, piece))
            else:
                out.append(piece)
        return out


def _prefix_space(pieces: list[str], at_start: bool) -> list[str]:
    return [p if p.startswith(" ") else " " + p for p in pieces if p]


def build_pretokenizer(spec: dict | None) -> PreTokenizer:
    steps: list[Step] = []
    byte_level = _collect(spec, steps)
    return PreTokenizer(steps=tuple(steps), byte_level=byte_level)


def _collect(spec: dict | None, steps: list[Step]) -> bool:
    """Append the steps of `spec`; returns whether a ByteLevel step is among them."""
    if spec is None:
        return False
    kind = spec["type"]
    if kind == "Sequence":
        found = False
        for sub in spec["pretokenizers"]:
            found |= _collect(sub, steps)
        return found
    if kind == "Split":
        steps.append(
            RegexSplit(
                pattern_of(spec["pattern"]), spec.get("behavior", "Isolated"), spec.get("invert", False)
            )
        )
        return False
    if kind == "ByteLevel":
        if spec.get("add_prefix_space", False):
            steps.append(_prefix_space)
        if spec.get("use_regex", True):
            steps.append(RegexSplit(regex.compile(GPT2)))
        return True
    if kind == "Metaspace":
        scheme = spec.get("prepend_scheme")
        if scheme is None:  # files written before prepend_scheme existed
            scheme = "always" if spec.get("add_prefix_space", True) else "never"
        steps.append(Metaspace(spec.get("replacement", "▁"), scheme, spec.get("split", True)))
        return False
    if kind == "Digits":
        digits = regex.compile(r"\p{N}" if spec.get("individual_digits", False) else r"\p{N}+")
        steps.append(RegexSplit(digits, "Isolated"))
        return False
    if kind == "WhitespaceSplit":
        steps.append(RegexSplit(regex.compile(r"\s+"), "Removed"))
        return False
    raise ValueError(f"unsupported pre-tokenizer type {kind!r}")
