"""Frame walks from large pop sets derived from a nearby set's walk (grammars/frame_bases.py) equal the walks
they replace, and the masks built from them equal one plain walk of the whole configuration."""

from __future__ import annotations

import json

import numpy as np
import pytest
from grammar_vocabs import VOCABS

from radixgen.grammars import clear_cache
from radixgen.grammars.automaton import DEAD, MARK, PdaAutomaton
from radixgen.grammars.frame_bases import FrameBases
from radixgen.grammars.json_schema import compile_json_schema
from radixgen.grammars.token_walk import nodes_to_mask, walk_mask, walk_trie

# Extra keys are allowed (the default), so every character of a key excludes the declared names' next characters:
# pop sets of one character each, near the root, that differ by a node or two from position to position.
SCHEMA = {"type": "object", "properties": {"calories_burned": {"type": "number"}, "calories": {"type": "number"},
                                           "category": {"type": "string"}, "name": {"type": "string"},
                                           "notes": {"type": "array", "items": {"type": "string"}}}}
# (declared properties first, in order: the grammar's narrowing; extra keys after them)
INSTANCES = [{"calories": 3, "category": "a", "cat": "x", "nom": 1, "zz": [1, {"k": "v"}]},
             {"name": "n", "notes": ["a"], "nam": 2, "calories_burne": 4, "ñ": None, "categoryX": 0}]


@pytest.mark.parametrize("name", ["gpt2", "qwen3"])
def test_derived_frame_walks_equal_plain_walks(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    vocab, encode = VOCABS[name]()
    clear_cache()
    derived = []
    original = FrameBases.derive

    def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        found = original(self, *args, **kwargs)
        derived.append(found is not None)
        return found

    monkeypatch.setattr(FrameBases, "derive", counting)
    grammar = compile_json_schema(SCHEMA, vocab)
    automaton = grammar.automaton
    assert isinstance(automaton, PdaAutomaton)
    for instance in INSTANCES:
        m = grammar.matcher()
        for tid in encode(json.dumps(instance, ensure_ascii=False)) + [None]:
            plain = nodes_to_mask(vocab, walk_trie(automaton, m.state, vocab.trie).alive_nodes)
            if automaton.accepting(m.state):
                plain |= vocab.eos_mask
            np.testing.assert_array_equal(grammar.mask(m.state), plain)
            if tid is not None:
                assert m.advance(tid)
    if name == "gpt2":  # (Qwen3's one-character sets are past BASE_MAX_NODES: walked, never derived)
        assert sum(derived) >= 3
    masks = grammar._masks
    checked = 0
    for (frame, pops, root), entry in list(masks._frames.items()):
        if masks._merges_well(pops):
            continue
        start = automaton.closed_state((frame,) if root else (MARK, frame))
        assert start != DEAD
        nodes = masks._node_sets[pops]
        starts = np.full(nodes.shape[0], start, dtype=np.int64)
        walk = walk_trie(automaton, starts, vocab.trie, nodes, escapes=not root, handoff=masks._handoff,
                         start_parents=starts, past_escapes=True)
        np.testing.assert_array_equal(entry.packed, walk_mask(vocab, walk))
        escapes = np.zeros(0, dtype=np.int64) if entry.pops is None else masks._node_sets[entry.pops]
        np.testing.assert_array_equal(escapes, np.unique(walk.escape_nodes))
        checked += 1
    assert checked >= 4
