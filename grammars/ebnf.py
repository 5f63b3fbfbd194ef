"""EBNF / GBNF front end: grammar text -> `GrammarIR`.

The dialect (llama.cpp GBNF, also what SGLang / XGrammar users pass) — the JSON Schema compiler emits exactly
this, so keep the two in step:

    # a comment runs to the end of the line
    root   ::= "{" ws members? ws "}"          # a rule: NAME ::= expression; `root` is the start rule
    members ::= pair ( "," ws pair )*
    pair   ::= string ws ":" ws value
    string ::= "\\"" ( [^"\\\\\\x00-\\x1f] | "\\\\" escape )* "\\""
    digit  ::= [0-9]
    int    ::= "-"? ( "0" | [1-9] digit{0,15} )
    ws     ::= [ \\t\\n]*
    any    ::= .                               # any one Unicode character (newline included)
    date   ::= /[0-9]{4}-[0-9]{2}-[0-9]{2}/    # extension: a regex terminal (Python `re` syntax)

* Rule names: `[A-Za-z_][A-Za-z0-9_-]*`. A rule starts at `NAME ::=` and runs until the next `NAME ::=`
  (so rules may span lines). A rule defined twice is an error; so is a reference to an undefined rule.
  Left recursion (`expr ::= expr "+" term | term`) is allowed when it is direct; indirect left recursion is
  refused with `GrammarError`.
* Literals: `"..."` or `'...'`, UTF-8 text. Escapes: `\\n \\r \\t \\\\ \\" \\' \\[ \\] \\- \\/ \\xHH \\uHHHH
  \\UHHHHHHHH`. The empty literal `""` matches the empty string.
* Character classes: `[abc]`, ranges `[a-zA-Z0-9_]`, negation `[^"\\\\]` (any Unicode character except those),
  same escapes as literals. A class matches one Unicode character, encoded as exact UTF-8 bytes.
* `.` matches any one Unicode character.
* Regex terminals (extension, for JSON Schema `pattern` / `format`): `/.../` holds a Python `re` pattern that
  `interegular` supports, matched in full (no anchors needed; `^`/`$` not allowed); `\\/` escapes a slash.
  Lookarounds, backreferences and the like are refused with `GrammarError`.
* Token references (token_refs.py): `<[128010]>` (a token by id), `<[0-9,42]>` (any of these ids),
  `<|python_tag|>` / `<[TOOL_CALLS]>` (the token of that spelling; a GrammarError when the vocabulary has
  none), `<~"[TOOL_CALLS]">` (that token where the vocabulary has one, else the text): one token, never its
  spelling in text.
* Grouping `( ... )`, alternatives `a | b` (lowest precedence), sequence by juxtaposition, postfix
  `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}` (bind to the atom just before).
* An empty alternative is allowed: `ws ::= | " " ws`.
* Whitespace is never implicit: the grammar matches bytes exactly as written.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from radixgen.grammars.bytedfa import MAX_CODEPOINT, ByteDFA, dfa_from_bytes, dfa_from_char_set
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.ir import Alt, Expr, GrammarIR, Repeat, RuleRef, Seq, Terminal
from radixgen.grammars.regex import regex_to_dfa
from radixgen.grammars.token_refs import parse_token_ref, ref_end

Prebuilt = Callable[[str], ByteDFA | None]  # a regex terminal's text as written -> its DFA, if known

_NAME_START = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_NAME_CHARS = _NAME_START | set("0123456789-")
_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "0": "\0", "f": "\f", "v": "\v", "a": "\a", "b": "\b"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


@lru_cache(maxsize=4096)
def _literal_dfa(text: str) -> ByteDFA:
    return dfa_from_bytes(text.encode("utf-8"))


@lru_cache(maxsize=4096)
def _class_dfa(intervals: tuple[tuple[int, int], ...], negated: bool) -> ByteDFA:
    return dfa_from_char_set(intervals, negated)


class _Parser:
    """Recursive descent over the dialect in the module docstring."""

    def __init__(self, text: str, prebuilt: Prebuilt | None = None) -> None:
        self.text = text
        self.pos = 0
        self.prebuilt = prebuilt

    # -- lexical helpers -------------------------------------------------------------------------------------
    def error(self, message: str) -> GrammarError:
        line = self.text.count("\n", 0, self.pos) + 1
        col = self.pos - (self.text.rfind("\n", 0, self.pos) + 1) + 1
        return GrammarError(f"EBNF: {message} at line {line} column {col}")

    def skip_space(self) -> None:
        text, n = self.text, len(self.text)
        while self.pos < n:
            ch = text[self.pos]
            if ch in " \t\r\n":
                self.pos += 1
            elif ch == "#":
                end = text.find("\n", self.pos)
                self.pos = n if end < 0 else end + 1
            else:
                break

    def peek(self) -> str:
        self.skip_space()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def name_at(self, pos: int) -> str:
        end = pos
        if end < len(self.text) and self.text[end] in _NAME_START:
            while end < len(self.text) and self.text[end] in _NAME_CHARS:
                end += 1
        return self.text[pos:end]

    def at_rule_start(self) -> bool:
        """The next token is `NAME ::=` (so the current rule has ended)."""
        self.skip_space()
        name = self.name_at(self.pos)
        if not name:
            return False
        after = self.pos + len(name)
        while after < len(self.text) and self.text[after] in " \t\r\n":
            after += 1
        return self.text.startswith("::=", after)

    def read_name(self) -> str:
        self.skip_space()
        name = self.name_at(self.pos)
        if not name:
            raise self.error("expected a rule name")
        self.pos += len(name)
        return name

    def read_escape(self) -> str:
        """After a backslash: one escaped character."""
        if self.pos >= len(self.text):
            raise self.error("dangling backslash")
        ch = self.text[self.pos]
        self.pos += 1
        if ch in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[ch]
        if ch in _HEX_ESCAPES:
            digits = self.text[self.pos:self.pos + _HEX_ESCAPES[ch]]
            if len(digits) != _HEX_ESCAPES[ch] or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise self.error(f"bad \\{ch} escape")
            self.pos += len(digits)
            cp = int(digits, 16)
            if cp > MAX_CODEPOINT or 0xD800 <= cp <= 0xDFFF:
                raise self.error(f"escape \\{ch}{digits} is not a Unicode scalar value")
            return chr(cp)
        return ch

    # -- grammar ---------------------------------------------------------------------------------------------
    def parse(self, start: str) -> GrammarIR:
        rules: dict[str, Expr] = {}
        while self.peek():
            name = self.read_name()
            self.skip_space()
            if not self.text.startswith("::=", self.pos):
                raise self.error(f"expected '::=' after rule name {name!r}")
            self.pos += 3
            if name in rules:
                raise self.error(f"rule {name!r} defined twice")
            rules[name] = self.alternatives()
            if self.peek() and not self.at_rule_start():
                raise self.error(f"unexpected {self.peek()!r}")
        if not rules:
            raise GrammarError("EBNF: the grammar defines no rules")
        return GrammarIR(rules, start)

    def alternatives(self) -> Expr:
        options = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Expr:
        items: list[Expr] = []
        while True:
            ch = self.peek()
            if not ch or ch in "|)" or self.at_rule_start():
                break
            items.append(self.postfix(self.atom()))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def postfix(self, item: Expr) -> Expr:
        while True:
            ch = self.peek()
            if ch == "*":
                self.pos += 1
                item = Repeat(item, 0, None)
            elif ch == "+":
                self.pos += 1
                item = Repeat(item, 1, None)
            elif ch == "?":
                self.pos += 1
                item = Repeat(item, 0, 1)
            elif ch == "{":
                item = self.braces(item)
            else:
                return item

    def braces(self, item: Expr) -> Expr:
        end = self.text.find("}", self.pos)
        if end < 0:
            raise self.error("unclosed '{'")
        body = self.text[self.pos + 1:end].replace(" ", "")
        lo_text, comma, hi_text = body.partition(",")
        try:
            lo = int(lo_text)
            hi = None if (comma and not hi_text) else int(hi_text if comma else lo_text)
        except ValueError:
            raise self.error(f"bad repetition {{{body}}}") from None
        if hi is not None and hi < lo:
            raise self.error(f"bad repetition {{{body}}}: max < min")
        self.pos = end + 1
        return Repeat(item, lo, hi)

    def atom(self) -> Expr:
        ch = self.peek()
        if ch in "\"'":
            return self.literal(ch)
        if ch == "[":
            return self.char_class()
        if ch == ".":
            self.pos += 1
            return Terminal(_class_dfa(((0, MAX_CODEPOINT),), False), ".")
        if ch == "(":
            self.pos += 1
            inner = self.alternatives()
            if self.peek() != ")":
                raise self.error("expected ')'")
            self.pos += 1
            return inner
        if ch == "/":
            return self.regex()
        if ch == "<":
            return self.token_ref()
        if ch in _NAME_START:
            return RuleRef(self.read_name())
        raise self.error(f"unexpected {ch!r}")

    def token_ref(self) -> Expr:
        end = ref_end(self.text, self.pos)
        if end is None:
            raise self.error("'<' opens no token reference (<[id]>, <[a-b,c]>, <|name|>, <~\"text\">)")
        try:
            ref = parse_token_ref(self.text[self.pos:end])
        except GrammarError as exc:
            raise self.error(str(exc)) from None
        self.pos = end
        return ref

    def literal(self, quote: str) -> Expr:
        self.pos += 1
        out: list[str] = []
        while True:
            if self.pos >= len(self.text):
                raise self.error("unterminated string literal")
            ch = self.text[self.pos]
            self.pos += 1
            if ch == quote:
                break
            out.append(self.read_escape() if ch == "\\" else ch)
        text = "".join(out)
        return Terminal(_literal_dfa(text), repr(text))

    def char_class(self) -> Expr:
        start = self.pos
        self.pos += 1
        negated = self.text.startswith("^", self.pos)
        if negated:
            self.pos += 1
        intervals: list[tuple[int, int]] = []

        def char() -> str:
            if self.pos >= len(self.text):
                raise self.error("unterminated character class")
            ch = self.text[self.pos]
            self.pos += 1
            return self.read_escape() if ch == "\\" else ch

        while True:
            if self.pos >= len(self.text):
                raise self.error("unterminated character class")
            if self.text[self.pos] == "]":
                self.pos += 1
                break
            lo = char()
            if self.text.startswith("-", self.pos) and not self.text.startswith("-]", self.pos):
                self.pos += 1
                hi = char()
                if ord(hi) < ord(lo):
                    raise self.error(f"bad range {lo!r}-{hi!r}")
                intervals.append((ord(lo), ord(hi)))
            else:
                intervals.append((ord(lo), ord(lo)))
        return Terminal(_class_dfa(tuple(sorted(intervals)), negated), self.text[start:self.pos])

    def regex(self) -> Expr:
        begin = self.pos
        self.pos += 1
        out: list[str] = []
        while True:
            if self.pos >= len(self.text):
                raise self.error("unterminated /regex/")
            ch = self.text[self.pos]
            self.pos += 1
            if ch == "/":
                break
            if ch == "\\" and self.text.startswith("/", self.pos):
                out.append("/")
                self.pos += 1
            elif ch == "\\" and self.pos < len(self.text):
                out.append(ch + self.text[self.pos])
                self.pos += 1
            else:
                out.append(ch)
        pattern = "".join(out)
        if pattern.startswith("^") or (pattern.endswith("$") and not pattern.endswith("\\$")):
            raise self.error(f"regex terminal /{pattern}/ must not use ^ or $ (it is matched in full)")
        dfa = self.prebuilt(self.text[begin:self.pos]) if self.prebuilt is not None else None
        return Terminal(dfa if dfa is not None else regex_to_dfa(pattern), f"/{pattern}/")


def parse_ebnf(text: str, start: str = "root", prebuilt: Prebuilt | None = None) -> GrammarIR:
    """Parse EBNF/GBNF text into the grammar IR (not yet normalized); `GrammarError` on bad syntax. `prebuilt`:
    a `/regex/` terminal's byte DFA by its text as written (None: compile the regex), from a front end that has
    it already."""
    return _Parser(text, prebuilt).parse(start)
