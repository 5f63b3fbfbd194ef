"""EBNF/GBNF front end: (grammar, text, accepted) tables over a byte-level vocabulary, and refusals."""

from __future__ import annotations

import pytest

from radixgen.grammars import GrammarError, Vocabulary, compile_grammar

BYTES_VOCAB = Vocabulary([bytes([b]) for b in range(256)] + [b"<eos>"], eos_token_ids=[256])

JSON_GBNF = r'''
# JSON in llama.cpp's GBNF
root   ::= value
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ws ":" ws value ws ("," ws string ws ":" ws value ws)* )? "}"
array  ::= "[" ws ( value ws ("," ws value ws)* )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\""
number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
ws     ::= [ \t\n]*
'''

# A GBNF grammar in the layout llama.cpp users write: rules over several lines, comments, {m,n}, an empty
# alternative, whitespace owned by the rule that precedes it.
MULTILINE_GBNF = r'''
root ::= obj

obj ::=
  "{" sp (
      key ":" sp val
      ( "," sp key ":" sp val )*
  )? "}" sp

arr ::= "[" sp ( val ( "," sp val )* )? "]" sp

val ::= obj | arr | key | num | ( "true" | "false" | "null" ) sp

# strings: no raw control characters, the usual escapes
key ::=
  "\"" (
      [^"\\\x7F\x00-\x1F]
    | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
  )* "\"" sp

num ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]{1,4} )? sp

sp ::= | " " | "\n" [ \t]{0,16}
'''

CASES = [
    (MULTILINE_GBNF, '{"a": [1, 2.5, "x\\n"], "b": {"c": null}}', True),
    (MULTILINE_GBNF, '{"a" : 1}\n', True),
    (MULTILINE_GBNF, "[1]", False),
    (JSON_GBNF, '{"a": [1, -2.5e3, true, null, {"b": "x\\"y\\u00e9"}]}', True),
    (JSON_GBNF, '{ }', True),
    (JSON_GBNF, '"héllo 😀"', True),
    (JSON_GBNF, '{"a" 1}', False),
    (JSON_GBNF, '[1,]', False),
    (JSON_GBNF, '01', False),
    (JSON_GBNF, '"tab\there"', False),
    ('root ::= "a" | "b" "c"', "a", True),
    ('root ::= "a" | "b" "c"', "bc", True),
    ('root ::= "a" | "b" "c"', "ac", False),
    ("root ::= [a-c]{2,3}", "ab", True),
    ("root ::= [a-c]{2,3}", "abca", False),
    ("root ::= [a-c]{2,}", "abcabc", True),
    ("root ::= [a-c]{2}", "a", False),
    ("root ::= [^a-c]+", "xé😀", True),
    ("root ::= [^a-c]+", "xa", False),
    ("root ::= . . .", "a😀\n", True),
    ("root ::= 'single' \"double\"", "singledouble", True),
    ('root ::= "\\x41\\u00e9\\n"', "Aé\n", True),
    ("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]+", "1+22+3", True),  # direct left rec.
    ("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]+", "1++2", False),
    ("root ::= item+ # trailing comment\nitem ::= \"x\" | \"y\"", "xyyx", True),
    ("root ::= ( \"a\" | ) \"b\"", "b", True),
    ("root ::= date \"T\"\ndate ::= /[0-9]{4}-[0-9]{2}-[0-9]{2}/", "2024-01-31T", True),
    ("root ::= date \"T\"\ndate ::= /[0-9]{4}-[0-9]{2}-[0-9]{2}/", "2024-1-31T", False),
    ("root ::= /a\\/b/", "a/b", True),
    ("root ::= paren\nparen ::= \"(\" paren* \")\"", "(()(()))", True),
    ("root ::= paren\nparen ::= \"(\" paren* \")\"", "(()", False),
    ("root-rule ::= my-rule\nmy-rule ::= \"ok\"", "ok", True),
]


def accepts(grammar_text: str, text: str, start: str | None = None) -> bool:
    m = compile_grammar(grammar_text, BYTES_VOCAB, syntax="ebnf", start=start).matcher()
    return m.advance_bytes(text.encode()) and m.is_accepting()


@pytest.mark.parametrize(("grammar_text", "text", "accepted"), CASES)
def test_ebnf_table(grammar_text: str, text: str, accepted: bool) -> None:
    start = "root-rule" if grammar_text.startswith("root-rule") else None
    assert accepts(grammar_text, text, start) == accepted


@pytest.mark.parametrize("grammar_text", [
    'root ::= missing',
    'root ::= "a"\nroot ::= "b"',
    'root ::= "unterminated',
    'root ::= [a-',
    'root ::= ( "a"',
    'root ::= "a"{3,1}',
    'root ::= a\na ::= b "x"\nb ::= a "y" | "z"',  # indirect left recursion
    'root ::= root "a"',  # left recursion with no base case
    'root ::= /(?<=a)b/',
    'root ::= /^a/',
    'root ::= [a-z]{0,1000000}',  # one state per count: refused, not built for a minute
    'other ::= "a"',  # no root rule
    '',
])
def test_ebnf_errors_are_grammar_errors(grammar_text: str) -> None:
    with pytest.raises(GrammarError):
        compile_grammar(grammar_text, BYTES_VOCAB, syntax="ebnf")


def test_error_message_has_position() -> None:
    with pytest.raises(GrammarError, match="line 2"):
        compile_grammar('root ::= "a"\n  x ::= ]', BYTES_VOCAB, syntax="ebnf")
