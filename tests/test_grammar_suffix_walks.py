"""Frame walks over merged suffixes (grammars/suffix_walks.py) against the level-by-level trie walk they replace,
on random grammars and states; and the masks they build against one plain walk of the whole configuration."""

from __future__ import annotations

import numpy as np
import pytest
from grammar_vocabs import VOCABS

from radixgen.grammars import Grammar, clear_cache, compile_grammar
from radixgen.grammars.automaton import DEAD, MARK, PdaAutomaton
from radixgen.grammars.json_schema import compile_json_schema
from radixgen.grammars.suffix_walks import suffix_trie, suffix_walk
from radixgen.grammars.terminal_walks import sorted_unique
from radixgen.grammars.token_walk import nodes_to_mask, walk_mask, walk_trie


def plain_mask(grammar: Grammar, state: int) -> np.ndarray:
    vocab = grammar.vocab
    out = nodes_to_mask(vocab, walk_trie(grammar.automaton, state, vocab.trie).alive_nodes)
    if grammar.automaton.accepting(state):
        out |= vocab.eos_mask
    return out


def random_schema(rng: np.random.Generator, depth: int = 0) -> dict:
    kinds = ["string", "integer", "number", "boolean", "enum", "bounded"] + (["object", "array"] if depth < 3 else [])
    kind = kinds[int(rng.integers(len(kinds)))]
    if kind == "enum":
        return {"enum": ["a", "bc", 3, None][: int(rng.integers(1, 5))]}
    if kind == "bounded":
        return {"type": "string", "maxLength": int(rng.integers(1, 6))}
    if kind == "object":
        names = ["id", "name", "n", "value", "x_y"][: int(rng.integers(1, 6))]
        props = {name: random_schema(rng, depth + 1) for name in names}
        return {"type": "object", "properties": props, "required": names[: int(rng.integers(len(names) + 1))],
                "additionalProperties": bool(rng.integers(2))}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1), "maxItems": int(rng.integers(1, 4))}
    return {"type": kind}


def check_frame_walks(grammar: Grammar) -> int:
    """Every frame walk the grammar's masks did, walked again both ways; returns how many."""
    masks, vocab, automaton = grammar._masks, grammar.vocab, grammar.automaton
    assert isinstance(automaton, PdaAutomaton)
    checked = 0
    for frame, pops, root in list(masks._frames):
        start = automaton.closed_state((frame,) if root else (MARK, frame))
        if start == DEAD:
            continue
        nodes = masks._node_sets[pops]
        starts = np.full(nodes.shape[0], start, dtype=np.int64)
        reference = walk_trie(automaton, starts, vocab.trie, nodes, escapes=not root, handoff=masks._handoff,
                              start_parents=starts, past_escapes=True)
        merged = suffix_walk(vocab, automaton, start, nodes, not root, masks._handoff)
        np.testing.assert_array_equal(merged.packed, walk_mask(vocab, reference))
        np.testing.assert_array_equal(np.unique(merged.escape_nodes), sorted_unique(np.unique(reference.escape_nodes)))
        checked += 1
    return checked


@pytest.mark.parametrize("name", ["gpt2", "qwen3"])
def test_suffix_walks_equal_trie_walks_on_random_schemas(name: str) -> None:
    vocab, _ = VOCABS[name]()
    rng = np.random.default_rng(21)
    eos = set(vocab.eos_token_ids)
    checked = 0
    for _ in range(6):
        clear_cache()
        properties = {"a": random_schema(rng), "b": {"type": "array", "items": random_schema(rng)}}
        schema = {"type": "object", "properties": properties, "required": ["a", "b"]}
        grammar = compile_json_schema(schema, vocab)
        for _ in range(3):
            m = grammar.matcher()
            for _ in range(25):
                np.testing.assert_array_equal(grammar.mask(m.state), plain_mask(grammar, m.state))
                choices = [t for t in m.allowed_token_ids().tolist() if t not in eos]
                if not choices:
                    break
                assert m.advance(int(rng.choice(choices)))
        checked += check_frame_walks(grammar)
    assert checked > 0


def test_suffix_walks_equal_trie_walks_on_nested_rules() -> None:
    """Frames below pops of ordinary rules (not terminals), nested and recursive."""
    vocab, encode = VOCABS["gpt2"]()
    clear_cache()
    grammar = compile_grammar('root ::= "[" items "]"\nitems ::= item (", " items)?\n'
                              'item ::= [a-z]+ | "\\"" [a-z ]* "\\"" | "[" items "]" | "{" item ": " item "}"',
                              vocab, syntax="ebnf")
    m = grammar.matcher()
    for tid in encode('[ab, "c d", [e, {f: "g"}], {"h": [i]}]'):
        np.testing.assert_array_equal(grammar.mask(m.state), plain_mask(grammar, m.state))
        assert m.advance(tid)
    assert check_frame_walks(grammar) > 0


def test_a_suffix_trie_holds_every_token_below_its_pops_once_per_suffix() -> None:
    vocab, _ = VOCABS["gpt2"]()
    trie = vocab.trie
    # the tokens ending in their only quote (`abc"`, `."`): no pop lies below another
    pops = np.unique(trie.token_node[[t for t, b in enumerate(vocab.token_bytes) if b.endswith(b'"') and
                                      b.count(b'"') == 1 and t not in vocab.special_ids]])
    assert pops.size > 20
    merged = suffix_trie(vocab, pops)
    assert suffix_trie(vocab, pops).nodes[0] is merged.nodes[0]  # cached per vocabulary
    np.testing.assert_array_equal(merged.nodes[0], pops)
    below = np.concatenate(merged.nodes)
    # the subtrees below the pops, each node under the suffix that leads to it
    expected = set(pops.tolist())
    frontier = pops.tolist()
    while frontier:
        frontier = [c for n in frontier for c in range(int(trie.child_start[n]), int(trie.child_start[n] +
                                                                                      trie.child_count[n]))]
        expected.update(frontier)
    assert sorted(below.tolist()) == sorted(expected)
    for suffix, nodes in enumerate(merged.nodes):
        assert sorted(merged.tokens[suffix].tolist()) == sorted(trie.node_tokens(nodes).tolist())
        for byte, child in merged.children[suffix]:
            assert set(trie.node_parent[merged.nodes[child]].tolist()) <= set(nodes.tolist())
            assert (trie.node_byte[merged.nodes[child]] == byte).all()
    assert len(merged.nodes) < below.shape[0]  # suffixes repeat below the pops of a string
