"""StopChecker: per request, decides when stop conditions end it and which text is safe to stream so far.

Two checks, called by the engine for every new output token (the engine itself owns the length limit, since
it also knows the room left in the context):

    check_token(token_id, num_output_tokens)   a stop token: EOS (unless ignore_eos) or one of stop_token_ids
                                               -> StopFinish(token_id)
    feed_text(detok, ids, finished)            the text of the new ids (through the request's incremental
                                               detokenizer), scanned for stop strings matched across token
                                               boundaries; sets `stop_string_hit` (the engine then finishes
                                               with StopFinish(the string)) and returns the text to emit

min_new_tokens: a stop token counts only after min_new_tokens other tokens (the sampler blocks it before, so
this matters only for forced tokens); a stop string counts once min_new_tokens tokens exist, the one that
completes it included (vLLM's rule).

Streaming: text that could be the start of a stop string is held back until the next tokens show whether the
string completes; then it is either released or, with the stop string, trimmed. Only the held tail is searched
(it is shorter than the longest stop string), so each step costs O(len(delta) + max stop length) whatever the
length of the output. The matched stop string and the text of a matched stop token are left out of the
emitted text unless `no_stop_trim`. When several stop strings occur, the one that completes first wins.

Invariant (why searching held + delta suffices): the held text is the longest suffix of everything seen that
is a proper prefix of some stop string, so any occurrence of a stop string that ends in the new text starts
inside that suffix or in the new text.

Stop regexes (`stop_regex`, the `regex` module's syntax) follow the same rules: the request stops as soon as
the text so far contains a match (the leftmost one; `stop_string_hit` holds its pattern, as SGLang's finish_reason
does), and the match is trimmed like a stop string. The held text starts where the earliest partial match
starts (`regex`'s `partial=True`: a match that needs more text to complete), so a match is found whatever the
token boundaries. The emitted text just before the held part is kept as context, for lookbehinds and `^`.
Anchors that look at the end (`$`, `\\b`) see the end of the text so far, as in SGLang.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

import regex

from radixgen.runtime.outputs import StopFinish
from radixgen.runtime.sampling_params import SamplingParams


class Detokenizer(Protocol):
    """What the checker needs of `runtime.tokenizer.IncrementalDetokenizer`."""

    def feed(self, token_id: int) -> str: ...

    def feed_many(self, ids: Sequence[int]) -> str: ...

    def flush(self) -> str: ...


REGEX_CONTEXT_CHARS = 256  # emitted text kept before the held text, for lookbehinds and `^`


class StopChecker:
    def __init__(self, params: SamplingParams, eos_token_ids: Collection[int] = ()) -> None:
        self.min_new_tokens = params.min_new_tokens
        self.stop_strings = params.stop
        self.stop_token_ids = frozenset(params.stop_token_ids) | (
            frozenset() if params.ignore_eos else frozenset(eos_token_ids))
        self.stop_regexes = tuple(regex.compile(p) for p in params.stop_regex)
        self.no_stop_trim = params.no_stop_trim
        self._longest_held = max((len(s) for s in self.stop_strings), default=1) - 1
        self.num_tokens = 0  # output tokens seen by check_token
        self.matched_token: int | None = None
        self.stop_string_hit: str | None = None  # the stop string, or the pattern of the stop regex, that matched
        self.held = ""
        self._emitted: list[str] = []
        self._context = ""  # the last emitted characters (stop regexes only)

    @property
    def text(self) -> str:
        """All text emitted so far (the output text once finished)."""
        return "".join(self._emitted)

    @property
    def finished(self) -> bool:
        return self.matched_token is not None or self.stop_string_hit is not None

    def check_token(self, token_id: int, num_output_tokens: int) -> StopFinish | None:
        """Is `token_id`, the `num_output_tokens`-th output token, a stop token? Call for every token, first."""
        self.num_tokens = num_output_tokens
        if num_output_tokens > self.min_new_tokens and token_id in self.stop_token_ids:
            self.matched_token = token_id
            return StopFinish(token_id)
        return None

    def feed_text(self, detok: Detokenizer, ids: Sequence[int], finished: bool = False) -> str:
        """Decode `ids` (already passed to check_token) and return the text to emit now. A matched stop
        token's own text is dropped (unless no_stop_trim); `finished` flushes the detokenizer and the held
        text."""
        trim_last = (self.matched_token is not None and not self.no_stop_trim and len(ids) > 0
                     and ids[-1] == self.matched_token)
        text = detok.feed_many(ids[:-1] if trim_last else ids)
        if finished:
            text += detok.flush()
        return self.feed(text, finished)

    def feed(self, text: str, finished: bool = False) -> str:
        """The text path alone: `text` is new complete text; returns what is safe to emit."""
        if self.stop_string_hit is not None:
            return ""
        if (self.stop_strings or self.stop_regexes) and self.num_tokens >= self.min_new_tokens:
            out = self._scan(self.held + text)
        else:
            out, self.held = self.held + text, ""
        if finished and self.stop_string_hit is None:
            out, self.held = out + self.held, ""
        self._emitted.append(out)
        if self.stop_regexes:
            self._context = (self._context + out)[-REGEX_CONTEXT_CHARS:]
        return out

    def _scan(self, pending: str) -> str:
        """Find the first stop string or regex to complete in `pending`; hold back a possible start of one."""
        best: tuple[int, int, str] | None = None  # (end, start, stop string or pattern)
        for stop in self.stop_strings:
            start = pending.find(stop)
            if start >= 0 and (best is None or (start + len(stop), start) < best[:2]):
                best = (start + len(stop), start, stop)
        hold_from = len(pending) - self._held_suffix_len(pending)
        if self.stop_regexes:
            best, hold_from = self._scan_regexes(pending, best, hold_from)
        if best is not None:
            end, start, stop = best
            self.held = ""
            self.stop_string_hit = stop
            return pending[:end] if self.no_stop_trim else pending[:start]
        self.held = pending[hold_from:]
        return pending[:hold_from]

    def _scan_regexes(self, pending: str, best: tuple[int, int, str] | None,
                      hold_from: int) -> tuple[tuple[int, int, str] | None, int]:
        """`_scan` for the stop regexes: the earliest-ending complete match so far, and where the earliest
        partial match starts (the text from there is held)."""
        base = len(self._context)
        text = self._context + pending
        for pattern in self.stop_regexes:
            match = pattern.search(text, base)
            if match is not None and match.end() > match.start():
                found = (match.end() - base, match.start() - base, pattern.pattern)
                if best is None or found[:2] < best[:2]:
                    best = found
                continue
            partial = pattern.search(text, base, partial=True)
            if partial is not None:
                hold_from = min(hold_from, partial.start() - base)
        return best, hold_from

    def _held_suffix_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        for k in range(min(self._longest_held, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stop_strings):
                return k
        return 0
