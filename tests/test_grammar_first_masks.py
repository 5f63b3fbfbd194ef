"""What keeps a grammar's first mask at a new position cheap, checked for exactness against plain walks:
tail calls keep parser stacks as deep as the text's nesting; a one-frame stack's mask comes from its top walk;
a terminal's top walks are the DFA's alone, shared by every grammar; terminal walks of node sets near an
earlier set of their size reuse it, whatever smaller sets were walked in between.
"""

from __future__ import annotations

import numpy as np
from grammar_vocabs import VOCABS

from radixgen.grammars import Grammar, clear_cache, compile_grammar
from radixgen.grammars.automaton import DfaEscapes, PdaAutomaton
from radixgen.grammars.json_schema import compile_json_schema
from radixgen.grammars.regex import regex_to_dfa
from radixgen.grammars.terminal_walks import terminal_top_walk, terminal_walk
from radixgen.grammars.token_walk import nodes_to_mask, walk_trie

STRING = r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt])*"'


def plain_mask(grammar: Grammar, state: int) -> np.ndarray:
    """The reference: one walk of the trie from the whole configuration, EOS where accepting."""
    vocab = grammar.vocab
    out = nodes_to_mask(vocab, walk_trie(grammar.automaton, state, vocab.trie).alive_nodes)
    if grammar.automaton.accepting(state):
        out |= vocab.eos_mask
    return out


def test_tail_calls_keep_stacks_flat() -> None:
    """A right-recursive list pushes no frame per item: after 60 items the stacks are as shallow as after
    one, and every mask on the way equals the plain walk."""
    vocab, encode = VOCABS["gpt2"]()
    clear_cache()
    grammar = compile_grammar('root ::= "[" items "]"\nitems ::= item ("," items)?\nitem ::= [a-z]+ | "[" items "]"',
                              vocab, syntax="ebnf")
    automaton = grammar.automaton
    assert isinstance(automaton, PdaAutomaton)
    text = "[" + ",".join(["ab", "[c,[d]]", "e"] * 20) + "]"
    m = grammar.matcher()
    depths = []
    for tid in encode(text):
        np.testing.assert_array_equal(grammar.mask(m.state), plain_mask(grammar, m.state))
        assert m.advance(tid)
        depths.append(max(len(s) for s in automaton.stacks(m.state)))
    # As deep as the nesting of "[c,[d]]" (and its rules), the same at the 60th item as at the third.
    assert m.is_accepting() and max(depths) == max(depths[: len(depths) // 10]) <= 8


def test_one_frame_stacks_on_instances_and_random_walks() -> None:
    """Schemas whose top-level object is the only frame (a tail call from the root): their masks come from
    top walks plus the tokens ending where the frame may end."""
    vocab, encode = VOCABS["gpt2"]()
    clear_cache()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "yz"]}},
              "required": ["a"], "additionalProperties": False}
    grammar = compile_json_schema(schema, vocab)
    rng = np.random.default_rng(3)
    eos = set(vocab.eos_token_ids)
    for text in ('{"a": 12, "b": "yz"}', '{"a": -3}'):
        m = grammar.matcher()
        for tid in encode(text):
            np.testing.assert_array_equal(grammar.mask(m.state), plain_mask(grammar, m.state))
            assert m.advance(tid)
    for _ in range(3):
        m = grammar.matcher()
        for _ in range(30):
            np.testing.assert_array_equal(grammar.mask(m.state), plain_mask(grammar, m.state))
            choices = [t for t in m.allowed_token_ids().tolist() if t not in eos]
            if not choices:
                break
            assert m.advance(int(rng.choice(choices)))


def test_terminal_top_walks_are_the_dfas_alone() -> None:
    """The top walk of a state inside a terminal is cached per vocabulary (the same arrays for every grammar)
    and equals the DFA's own walk past its accepting states: tokens read inside, nodes where it may end."""
    vocab, _ = VOCABS["gpt2"]()
    dfa = regex_to_dfa(STRING)
    for q in range(min(dfa.num_states, 4)):
        packed, pops = terminal_top_walk(vocab, dfa, q)
        again, again_pops = terminal_top_walk(vocab, dfa, q)
        assert again is packed and again_pops is pops and not packed.flags.writeable
        walk = walk_trie(DfaEscapes(dfa), q, vocab.trie, escapes=True, past_escapes=True)
        np.testing.assert_array_equal(packed, nodes_to_mask(vocab, walk.alive_nodes))
        np.testing.assert_array_equal(pops, np.unique(walk.escape_nodes))


def test_near_node_sets_reuse_a_base_of_their_size() -> None:
    """Large sets that differ by a node or two, with small sets walked in between, give the walk of each
    set exactly (a base is kept per size, so the small ones do not displace the large one)."""
    vocab, _ = VOCABS["gpt2"]()
    dfa = regex_to_dfa(r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt])*"')  # a string's rest after its opening quote
    trie = vocab.trie
    level = np.arange(int(trie.level_start[1]), int(trie.level_start[2]), dtype=np.int64)  # one-byte prefixes
    printable = level[(trie.node_byte[level] >= 0x20) & (trie.node_byte[level] < 0x7F)
                      & (trie.node_byte[level] != ord('"')) & (trie.node_byte[level] != ord("\\"))]
    sets = [printable, printable[:40], np.delete(printable, 5), printable[10:70], np.delete(printable, [3, 50])]
    for nodes in sets:
        got = terminal_walk(vocab, dfa, 0, nodes)
        walk = walk_trie(DfaEscapes(dfa), np.zeros(nodes.shape[0], dtype=np.int64), trie, nodes, escapes=True)
        np.testing.assert_array_equal(got.packed, nodes_to_mask(vocab, walk.alive_nodes))
        assert sorted(got.exit_nodes.tolist()) == sorted(walk.escape_nodes.tolist())
