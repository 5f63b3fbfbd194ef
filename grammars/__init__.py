"""radixgen.grammars: constraints (regex, EBNF/GBNF, Lark, JSON Schema) compiled to token masks.

    vocab = Vocabulary(token_bytes, eos_token_ids=[eos], special_ids=specials)
    grammar = compile_regex(r"\\d{3}-\\d{4}", vocab)         # or compile_grammar(text, vocab, syntax="ebnf")
    grammar = compile_constraint(Constraint("json_schema", schema_text), vocab)  # a request's constraint
    matcher = grammar.matcher()
    matcher.fill_mask(bitmask_row)                             # int32[ceil(V/32)], bit v = token v allowed
    matcher.advance(token_id); matcher.forced_suffix(); matcher.rollback(1)

Pipeline: front ends (regex.py, ebnf.py, lark_frontend.py, json_schema*.py -> EBNF) -> ir.py (references to
special/added tokens resolved against the vocabulary: token_refs.py) -> pda.py (a byte-level pushdown
automaton, big terminals shared, bounded repetitions fused: counted.py) -> automaton.py
(lazily determinized configurations) -> masks.py / token_walk.py (trie walks, cached per state) -> matcher.py
(per request); constraint.py is the one dispatch from a request's `Constraint` (kind, source) to its front
end; disk_cache.py keeps compiled grammars on disk; backend.py is the engine's protocol, which backends/ (XGrammar,
llguidance) also implement. The package depends on numpy, interegular and lark only (never on radixgen.runtime).
"""

from radixgen.grammars.builtin import builtin_grammar_names, load_builtin_grammar
from radixgen.grammars.constraint import (
    CONSTRAINT_KINDS,
    Constraint,
    ConstraintKind,
    compile,
    compile_constraint,
    json_schema_constraint,
)
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.grammar import Grammar, clear_cache, compile_grammar, compile_regex
from radixgen.grammars.json_schema import compile_json_schema, json_schema_to_ebnf
from radixgen.grammars.matcher import Matcher
from radixgen.grammars.vocabulary import Vocabulary, bitmask_words, pack_bitmask, unpack_bitmask

__all__ = [
    "CONSTRAINT_KINDS", "Constraint", "ConstraintKind", "Grammar", "GrammarError", "Matcher", "Vocabulary",
    "bitmask_words", "builtin_grammar_names", "clear_cache", "compile", "compile_constraint", "compile_grammar",
    "compile_json_schema", "compile_regex", "json_schema_constraint", "json_schema_to_ebnf", "load_builtin_grammar",
    "pack_bitmask", "unpack_bitmask",
]
