"""The byte DFAs the JSON Schema compiler builds straight from its string-body DFAs are the languages of the
regex text it writes for them (what the grammar's compile built from that text before), and the conversion hands
the grammar's compile the body DFAs of its terminals."""

from __future__ import annotations

import numpy as np
import pytest

from radixgen.grammars.bytedfa import ByteDFA
from radixgen.grammars.json_schema import json_schema_to_ebnf
from radixgen.grammars.json_schema_dfa import canonical_body, dfa_of, literal_dfa, subtract
from radixgen.grammars.json_schema_dfa_bytes import quoted_byte_dfa
from radixgen.grammars.json_schema_dfa_regex import to_regex
from radixgen.grammars.json_schema_keys import body_of, string_body
from radixgen.grammars.regex import regex_to_dfa


def equivalent(a: ByteDFA, b: ByteDFA) -> bool:
    """Whether two pruned byte DFAs (every state reaches acceptance) accept the same strings."""
    seen = {(0, 0)}
    todo = [(0, 0)]
    while todo:
        sa, sb = todo.pop()
        if a.accepting[sa] != b.accepting[sb]:
            return False
        ta, tb = a.trans[sa], b.trans[sb]
        if not np.array_equal(ta < 0, tb < 0):
            return False
        for x, y in zip(ta[ta >= 0].tolist(), tb[tb >= 0].tolist()):
            if (x, y) not in seen:
                seen.add((x, y))
                todo.append((x, y))
    return True


BODIES = [
    string_body({}, 0, None),
    string_body({}, 2, 5),
    string_body({"pattern": ["^[a-z]+[0-9]?$"]}, 0, 8),
    string_body({"format": "date"}, 0, None),
    string_body({"enum": ["a\"b", "é", "x\\y", "\n"]}, 0, None),
    subtract(canonical_body(), literal_dfa([body_of(n) for n in ["name", "names", "age", "ünï"]])),
    subtract(canonical_body(), dfa_of("[a-c]+")),
]


@pytest.mark.parametrize("index", range(len(BODIES)))
def test_quoted_body_dfa_is_the_language_of_its_regex_text(index: int) -> None:
    machine = BODIES[index]
    built = quoted_byte_dfa(machine)
    assert built is not None
    assert equivalent(built, regex_to_dfa('"' + to_regex(machine) + '"'))
    assert not equivalent(built, regex_to_dfa('"' + to_regex(string_body({}, 0, 1)) + '"'))  # the check can fail


def test_key_regions_and_bodies_reach_the_grammar_prebuilt() -> None:
    schema = {"type": "object", "properties": {"export": {"type": "string"}, "exports": {"type": "integer"}},
              "patternProperties": {"^x-": {"type": "string", "pattern": "^[0-9]+$", "maxLength": 6}}}
    conversion = json_schema_to_ebnf(schema)
    assert conversion.terminals  # the key regions (and the bounded pattern string) come with their DFAs
    for text, machine in conversion.terminals.items():
        assert text in conversion.ebnf
        dfa = quoted_byte_dfa(machine)
        assert dfa is not None and equivalent(dfa, regex_to_dfa(text[1:-1].replace("\\/", "/")))


def test_a_body_that_may_go_on_with_a_raw_quote_is_left_to_the_regex() -> None:
    loose = dfa_of('[a"]*')  # not a canonical body: a raw quote may follow where the body could end
    assert quoted_byte_dfa(loose) is None
