"""Reasoning models' thinking section (`<think>...</think>`): the grammar that leaves the thinking free and
constrains only the answer after it, and the split of an output (or a prefix of one) into reasoning and answer.

`opened` says whether the prompt already opened the section (DeepSeek-R1's template ends the generation prompt
with `<think>\\n`); otherwise the model may open it itself as its output's first text (Qwen3).
"""

from __future__ import annotations

from dataclasses import dataclass

from radixgen.grammars.ebnf_embed import EmbeddedRules
from radixgen.grammars.free_text import text_until
from radixgen.grammars.json_schema_text import literal
from radixgen.grammars.tool_parsers import held_back

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def thinking_ebnf(answer: EmbeddedRules, opened: bool, prefix: str = "think-") -> str:
    """GBNF (start `root`): free thinking text up to `</think>`, whitespace, then `answer`; without `opened`,
    the output either opens the section itself or is the answer alone."""
    after = f"{prefix}answer"
    thinking = text_until(f"{prefix}text-", {THINK_CLOSE: after}, may_end=False)
    root = thinking.start if opened else f"{literal(THINK_OPEN)} {thinking.start} | {answer.start}"
    return (f"root ::= {root}\n{after} ::= [ \\n]* {answer.start}\n{thinking.text}{answer.text}")


@dataclass(frozen=True)
class ReasoningSplit:
    """`reasoning`: the thinking text (None when the output has no thinking section); `content`: the answer."""

    reasoning: str | None
    content: str
    thinking: bool  # the section is still open (only for a text that is not final)


def split_reasoning(text: str, opened: bool, final: bool = True) -> ReasoningSplit:
    """Split an output into its thinking and its answer; a prefix (`final=False`) holds back what may still
    turn out to be a marker."""
    body = text
    if not opened:
        stripped = text.lstrip()
        if stripped.startswith(THINK_OPEN):
            body = stripped[len(THINK_OPEN):]
        elif not final and THINK_OPEN.startswith(stripped):
            return ReasoningSplit(None, "", False)
        else:
            return ReasoningSplit(None, text, False)
    at = body.find(THINK_CLOSE)
    if at < 0:
        keep = len(body) if final else len(body) - held_back(body, THINK_CLOSE)
        return ReasoningSplit(body[:keep].lstrip("\n"), "", not final)
    return ReasoningSplit(body[:at].lstrip("\n"), body[at + len(THINK_CLOSE):].lstrip(), False)
