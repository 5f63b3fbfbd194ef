"""Grammar elements that match one token id rather than text: a special or added token such as Mistral's
`[TOOL_CALLS]`, Llama 3.1's `<|python_tag|>` or Qwen's `<tool_call>`, which a model writes as one token and which
the text path cannot (or should not) spell.

Syntax, in EBNF and Lark alike (llguidance's; usable in rules, not inside a Lark terminal):

    <[128010]>             the token of id 128010
    <[128000-128255,7]>    any one token of these ids (inclusive ranges)
    <|python_tag|>         the token spelling exactly `<|python_tag|>`: a special token first, else the one token
                           of that spelling (an added token); a GrammarError when the vocabulary has none
    <[TOOL_CALLS]>         the same, for a spelling in square brackets (`[TOOL_CALLS]`, `[INST]`)
    <~"[TOOL_CALLS]">      radixgen's extension: that token where the vocabulary has one, else the text itself
                           (how tool-call formats and structural tags write their markers, tokenizer-agnostic)

The automaton stays byte-level: a reference reads the *marker bytes* of its ids (0xFF, then `[id]`). Byte 0xFF
never occurs in UTF-8 text and the vocabulary keeps every token holding it out of its trie, so no text token
spells a marker and token walks never enter one. Where a state can read 0xFF, the ids it reads as markers are
found by following the automaton over those bytes (`token_ref_targets`): the mask allows them, and the matcher
takes such a token by its marker (matcher.py). Jump-forward stops before a marker (grammar.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from radixgen.grammars.automaton import DEAD, ByteAutomaton, DfaAutomaton, PdaAutomaton
from radixgen.grammars.bytedfa import ByteDFA, dfa_from_bytes, dfa_from_strings
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.ir import Expr, GrammarIR, Terminal, TokenRef, map_children
from radixgen.grammars.json_schema_text import literal
from radixgen.grammars.vocabulary import MARKER_BYTE

if TYPE_CHECKING:
    from radixgen.grammars.vocabulary import Vocabulary

MAX_REF_IDS = 1 << 16  # ids one reference may name (its ranges summed)
MAX_ID_DIGITS = 10
_OPEN = bytes([MARKER_BYTE]) + b"["
_STRICT = re.compile(r"<[^<>\s]+>")
_ID_LIST = re.compile(r"[0-9,\-]*[0-9][0-9,\-]*")
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "0": "\0", "f": "\f", "v": "\v", "a": "\a", "b": "\b"}
_HEX = {"x": 2, "u": 4, "U": 8}
Syntax = Literal["ebnf", "lark"]


def marker_bytes(token_id: int) -> bytes:
    """The bytes a reference to `token_id` reads in the automaton (never a text token's)."""
    return _OPEN + str(token_id).encode() + b"]"


def soft_token(text: str) -> str:
    """The GBNF of `text` written as its single token where the vocabulary has one, else as text."""
    return f"<~{literal(text)}>"


# ------------------------------------------------------------------------------------------------ syntax
def ref_end(text: str, pos: int) -> int | None:
    """The index just past the token reference that starts at `text[pos]` (a '<'), or None when none does."""
    if text.startswith("<~", pos):
        quote = text[pos + 2:pos + 3]
        if quote not in ('"', "'"):
            return None
        i = pos + 3
        while i < len(text) and text[i] != "\n":
            if text[i] == "\\":
                i += 2
            elif text[i] == quote:
                return i + 2 if text.startswith(">", i + 1) else None
            else:
                i += 1
        return None
    match = _STRICT.match(text, pos)
    return match.end() if match else None


def _unescape(body: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        i += 1
        if ch != "\\" or i >= len(body):
            out.append(ch)
            continue
        ch = body[i]
        i += 1
        if ch in _HEX:
            digits = body[i:i + _HEX[ch]]
            if len(digits) != _HEX[ch] or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise GrammarError(f"bad \\{ch} escape")
            out.append(chr(int(digits, 16)))
            i += len(digits)
        else:
            out.append(_ESCAPES.get(ch, ch))
    return "".join(out)


def _ids(body: str, written: str) -> tuple[int, ...]:
    ids: list[int] = []
    for part in body.split(","):
        if not part:
            continue
        ends = part.split("-")
        if len(ends) > 2 or not all(e.isdigit() and len(e) <= MAX_ID_DIGITS for e in ends):
            raise GrammarError(f"token reference {written}: bad id range {part!r}")
        lo, hi = int(ends[0]), int(ends[-1])
        if hi < lo:
            raise GrammarError(f"token reference {written}: range {part!r} ends before it starts")
        if len(ids) + hi - lo + 1 > MAX_REF_IDS:
            raise GrammarError(f"token reference {written}: names more than {MAX_REF_IDS} ids")
        ids.extend(range(lo, hi + 1))
    return tuple(sorted(set(ids)))


def parse_token_ref(written: str) -> TokenRef:
    """The reference `written` (as `ref_end` delimits it); a GrammarError for a malformed one."""
    if written.startswith("<~"):
        return TokenRef(written, name=_unescape(written[3:-2]), fallback=True)
    body = written[1:-1]
    if body.startswith("[") and body.endswith("]") and _ID_LIST.fullmatch(body[1:-1]):
        return TokenRef(written, ids=_ids(body[1:-1], written))
    return TokenRef(written, name=written)


def _quoted_end(text: str, pos: int, close: str) -> int:
    i = pos + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == close:
            return i + 1
        else:
            i += 1
    return len(text)


def _skipped_end(text: str, i: int, syntax: Syntax) -> int | None:
    """The end of a string, class, regex or comment starting at `text[i]` (where no reference can be)."""
    ch = text[i]
    if ch == '"' or (ch == "'" and syntax == "ebnf"):
        return _quoted_end(text, i, ch)
    if ch == "[" and syntax == "ebnf":
        return _quoted_end(text, i, "]")
    if ch == "#" or (syntax == "lark" and text.startswith("//", i)):
        end = text.find("\n", i)
        return len(text) if end < 0 else end
    if ch == "/":
        return _quoted_end(text, i, "/")
    return None


def replace_token_refs(text: str, syntax: Syntax, replace: Callable[[TokenRef], str]) -> str:
    """`text` (EBNF or Lark) with every token reference replaced by `replace(reference)`; strings, classes,
    regexes and comments are left as they are."""
    out: list[str] = []
    i = copied = 0
    while i < len(text):
        skipped = _skipped_end(text, i, syntax)
        if skipped is not None:
            i = skipped
            continue
        end = ref_end(text, i) if text[i] == "<" else None
        if end is None:
            i += 1
            continue
        out += [text[copied:i], replace(parse_token_ref(text[i:end]))]
        i = copied = end
    return "".join(out) + text[copied:]


# ------------------------------------------------------------------------------------------------ compile
def _ids_dfa(ids: tuple[int, ...]) -> ByteDFA:
    if len(ids) == 1:
        return dfa_from_bytes(marker_bytes(ids[0]))
    return dfa_from_strings(marker_bytes(i) for i in ids)


def _resolve(ref: TokenRef, vocab: Vocabulary) -> Terminal:
    if ref.name is None:
        outside = [i for i in ref.ids if i >= vocab.size]
        if outside:
            raise GrammarError(f"token reference {ref.written}: id {outside[0]} is outside the vocabulary of "
                               f"{vocab.size}")
        return Terminal(_ids_dfa(ref.ids), ref.written)
    found = vocab.token_id_of(ref.name)
    if found is None and not ref.fallback and ref.name.startswith("<[") and ref.name.endswith("]>"):
        found = vocab.token_id_of(ref.name[1:-1])
    if found is not None:
        return Terminal(_ids_dfa((found,)), ref.written)
    if ref.fallback:
        return Terminal(dfa_from_bytes(ref.name.encode("utf-8")), literal(ref.name))
    names = sorted(vocab.token_bytes[i].decode("utf-8", "replace") for i in vocab.special_ids)
    shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    raise GrammarError(f"token reference {ref.written}: no single token of the vocabulary spells it (its "
                       f"special tokens: {shown or 'none'})")


def resolve_token_refs(ir: GrammarIR, vocab: Vocabulary) -> GrammarIR:
    """`ir` with every token reference turned into the terminal reading its ids' marker bytes (or, for a
    fallback reference whose text is no single token, that text); a GrammarError naming an unknown one."""

    def visit(expr: Expr) -> Expr:
        if isinstance(expr, TokenRef):
            return _resolve(expr, vocab)
        return map_children(expr, visit)

    return GrammarIR({name: visit(body) for name, body in ir.rules.items()}, ir.start)


# ------------------------------------------------------------------------------------------------ matching
def has_token_refs(automaton: ByteAutomaton) -> bool:
    """Some state of `automaton` reads a marker byte (its grammar names a token somewhere); checked once per
    grammar, so a grammar without references never looks for them."""
    if isinstance(automaton, PdaAutomaton):
        return bool((automaton.pda.trans[:, MARKER_BYTE] >= 0).any())
    if isinstance(automaton, DfaAutomaton):
        return bool((automaton.table[:, MARKER_BYTE] >= 0).any())
    return True


def reads_token_ref(automaton: ByteAutomaton, state: int) -> bool:
    """Some token reference may be read from `state` (it has a live marker byte)."""
    return automaton.row_tuple(state)[MARKER_BYTE] >= 0


def token_ref_targets(automaton: ByteAutomaton, state: int) -> tuple[tuple[int, int], ...]:
    """(token id, state after it) for every token `state` reads as a reference, by id: the marker bytes the
    automaton can read from there, followed digit by digit."""
    if not reads_token_ref(automaton, state):
        return ()
    start = automaton.step(state, _OPEN)
    if start == DEAD:
        return ()
    found: list[tuple[int, int]] = []
    work = [(start, 0, 0)]  # (state, id so far, digits read)
    while work:
        q, value, digits = work.pop()
        for byte, nxt in automaton.live_pairs(q):
            if 0x30 <= byte <= 0x39 and digits < MAX_ID_DIGITS:
                work.append((nxt, value * 10 + byte - 0x30, digits + 1))
            elif byte == 0x5D and digits:  # ']'
                found.append((value, nxt))
    return tuple(sorted(found))
