"""Token masks of a compiled grammar's states, computed from the vocabulary trie and cached.

A regex state's mask is one trie walk over its DFA. A grammar configuration (a set of parser stacks) is split
by the frames below each stack's top: the walk from the top frames alone (a relative configuration) is exact
for every token that never pops below them and is shared across nesting depths; only the subtrees where it
pops are walked again from the real configuration (XGrammar's context-independent / dependent split). Walks
inside a shared terminal (a JSON string, a number) are cached per vocabulary and reused by every grammar.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
from radixgen.grammars.automaton import MARK, ByteAutomaton, DfaAutomaton, DfaEscapes, PdaAutomaton
from radixgen.grammars.bytedfa import ByteDFA
from radixgen.grammars.lookahead import lookahead_representatives
from radixgen.grammars.token_walk import WalkResult, nodes_to_mask, walk_trie
from radixgen.grammars.vocabulary import Vocabulary


@dataclass(frozen=True)
class _RelativeWalk:
    packed: np.ndarray  # exact part of the mask
    escape_nodes: np.ndarray  # trie nodes where the walk popped into the frames it did not hold
    escape_parent_states: np.ndarray  # automaton states (relative configurations) at their parents


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


PRECOMPUTE_TERMINAL_BYTES = 16  # terminal states with at most this many live bytes are walked at compile time
PRECOMPUTE_BUDGET_S = 0.05  # CPU time the compile step spends on precomputing masks (narrowest states first)


class MaskCache:
    """Packed masks per automaton state (EOS set iff accepting), computed on first use, thread-safe."""

    def __init__(self, vocab: Vocabulary, automaton: ByteAutomaton) -> None:
        self.vocab = vocab
        self.automaton = automaton
        self._masks: dict[int, np.ndarray] = {}
        self._relative: dict[int, _RelativeWalk] = {}  # stage 1 walks by relative state
        self._stages: dict[tuple[tuple[int, ...], bool], _RelativeWalk] = {}  # later stages by known frames
        self._lock = threading.Lock()
        self._representatives: list[int] | None = None  # per PDA state, see `_shared_pda_mask`
        self._first_of_key: dict[frozenset, int] = {}  # type: ignore[type-arg]  # see `_shared_pda_mask`

    def precompute(self) -> None:
        """Walk the trie from every grammar position (each PDA state with bytes, as a relative top frame)
        now, at compile time, so the first mask at a position costs only its context-dependent part.
        States inside wide shared terminals and wide regex states are left for first use."""
        automaton = self.automaton
        if isinstance(automaton, DfaAutomaton):
            # A regex: narrow states' masks are cheap to walk now; wide ones are walked on first use.
            narrow = (automaton.table >= 0).sum(axis=1) <= PRECOMPUTE_TERMINAL_BYTES
            deadline = time.thread_time() + PRECOMPUTE_BUDGET_S
            for q in np.flatnonzero(narrow).tolist():
                if time.thread_time() > deadline:
                    break
                self.mask(q)
            return
        if not isinstance(automaton, PdaAutomaton):
            return
        pda = automaton.pda
        self._lookahead(automaton)
        live_bytes = (pda.trans >= 0).sum(axis=1)
        in_terminal = pda.terminal_of >= 0 if pda.terminal_of is not None else np.zeros_like(pda.has_bytes)
        # Wide shared-terminal states (inside a string) are walked lazily and cached per vocabulary. The rest
        # go narrowest first, within a time budget: a huge grammar compiles in bounded time and leaves its
        # remaining positions for first use (the results are the same either way, only cached earlier).
        candidates = np.flatnonzero(pda.has_bytes & ~(in_terminal & (live_bytes > PRECOMPUTE_TERMINAL_BYTES)))
        deadline = time.thread_time() + PRECOMPUTE_BUDGET_S
        for g in candidates[np.argsort(live_bytes[candidates], kind="stable")].tolist():
            if time.thread_time() > deadline:
                break
            self._top_walk(automaton, g)

    def __len__(self) -> int:
        return len(self._masks)

    def __contains__(self, state: int) -> bool:
        return state in self._masks

    def mask(self, state: int) -> np.ndarray:
        """Packed allowed-token row for `state` (EOS set iff accepting). Read-only; shared."""
        found = self._masks.get(state)
        if found is not None:
            return found
        if isinstance(self.automaton, PdaAutomaton):
            packed = self._shared_pda_mask(self.automaton, state)
        else:
            packed = nodes_to_mask(self.vocab, walk_trie(self.automaton, state, self.vocab.trie).alive_nodes)
        if self.automaton.accepting(state):
            packed |= self.vocab.eos_mask
        packed.flags.writeable = False
        with self._lock:
            self._masks.setdefault(state, packed)
        return packed

    def _lookahead(self, automaton: PdaAutomaton) -> list[int]:
        """Per PDA state, the representative of the states that read the same strings of up to the
        vocabulary's split length (see `Vocabulary.long_tokens`): computed once per grammar."""
        found = self._representatives
        if found is None:
            split = self.vocab.long_tokens[0]
            found = self._representatives = lookahead_representatives(automaton.pda, split).tolist()
        return found

    def _shared_pda_mask(self, automaton: PdaAutomaton, state: int) -> np.ndarray:
        """`_pda_mask`, shared between configurations that read the same strings of up to the split length.

        The key replaces every frame by its representative: positions of a bounded repetition (a string's
        maxLength) more than the split length from its end get one key. The first configuration of a key
        walks the trie; later ones take its mask for every token but the few long ones, which they step."""
        representatives = self._lookahead(automaton)
        key = frozenset(tuple(representatives[frame] for frame in stack) for stack in automaton.stacks(state))
        first = self._first_of_key.get(key)
        if first is not None and first in self._masks:
            return (self._masks[first] & ~self.vocab.long_tokens[2]) | self._long_token_mask(automaton, state)
        with self._lock:
            self._first_of_key.setdefault(key, state)
        return self._pda_mask(automaton, state).copy()

    def _long_token_mask(self, automaton: PdaAutomaton, state: int) -> np.ndarray:
        """Packed bits of the few longest tokens (`Vocabulary.long_tokens`) readable from `state`, stepped
        one by one (from the state after a long token that is their prefix, when there is one)."""
        out = np.zeros(self.vocab.mask_words, dtype=np.int32)
        reached: list[int] = []
        for tid, data, prefix in self.vocab.long_tokens[1]:
            if prefix < 0:
                current = automaton.read(state, data)
            else:
                current = reached[prefix]
                if current >= 0:
                    current = automaton.read(current, data[len(self.vocab.long_tokens[1][prefix][1]):])
            reached.append(current)
            if current >= 0:
                out[tid >> 5] |= np.int32(np.uint32(1 << (tid & 31)).view(np.int32))
        return out

    def _pda_mask(self, automaton: PdaAutomaton, state: int) -> np.ndarray:
        """Packed mask (no EOS) of a grammar configuration: the union over its stacks.

        For one stack, the frames are revealed from the top down, one per stage:
        1. Walk the trie from the top frame alone (a relative configuration, precomputed at compile time;
           inside a shared terminal, cached per vocabulary across grammars): exact for every token that never
           pops below that frame; the walk stops at the nodes where it would (escape nodes).
        k. Below the previous stage's escape nodes, walk again with one more frame revealed. Each stage is
           cached by the frames it knows, so it is shared by every position and depth with those top frames;
           most tokens pop one or two frames at most, so few stages run. The last stage knows the whole
           stack and is exact.
        Root-only stacks (nothing below) are walked whole.
        """
        out = np.zeros(self.vocab.mask_words, dtype=np.int32)
        roots: list[tuple[int, ...]] = []
        for stack in automaton.stacks(state):
            if len(stack) == 1:
                roots.append(stack)
                continue
            entry = self._top_walk(automaton, stack[-1])
            out |= entry.packed
            known = 1
            while entry.escape_nodes.size:
                known += 1
                entry = self._stage(automaton, entry, stack[-known:], whole=known == len(stack))
                out |= entry.packed
        if roots:
            sub = automaton.intern_stacks(frozenset(roots))
            entry = self._relative.get(sub)
            if entry is None:
                walk = walk_trie(automaton, sub, self.vocab.trie, handoff=self._handoff)
                entry = self._relative.setdefault(sub, _RelativeWalk(
                    _frozen(nodes_to_mask(self.vocab, walk.alive_nodes)), walk.escape_nodes,
                    walk.escape_parent_states))
            out |= entry.packed
        return out

    def _top_walk(self, automaton: PdaAutomaton, top: int) -> _RelativeWalk:
        """Stage 1 for a stack whose top frame is PDA state `top`."""
        stacks = frozenset({(MARK, top)})
        sub = automaton.intern_stacks(stacks)
        entry = self._relative.get(sub)
        if entry is None:
            entry = self._relative_walk(automaton, stacks, sub, escapes=True)
            with self._lock:
                entry = self._relative.setdefault(sub, entry)
        return entry

    def _stage(self, automaton: PdaAutomaton, previous: _RelativeWalk, frames: tuple[int, ...],
               whole: bool) -> _RelativeWalk:
        """Walk below `previous`'s escape nodes knowing the top `frames` (all of the stack when `whole`)."""
        key = (frames, whole)
        found = self._stages.get(key)
        if found is not None:
            return found
        revealed: tuple[int, ...] = (frames[0],) if whole else (MARK, frames[0])
        parents = previous.escape_parent_states
        extended = np.empty_like(parents)
        for parent in np.unique(parents).tolist():
            stacks = frozenset(revealed + st[1:] if st[0] == MARK else st for st in automaton.stacks(parent))
            extended[parents == parent] = automaton.intern_stacks(stacks)
        trie = self.vocab.trie
        automaton.ensure_rows(extended)
        starts = automaton.table[extended, trie.node_byte[previous.escape_nodes]].astype(np.int64)
        live = starts >= 0
        walk = walk_trie(automaton, starts[live], trie, previous.escape_nodes[live], escapes=not whole,
                         handoff=self._handoff, start_parents=extended[live])
        entry = _RelativeWalk(_frozen(nodes_to_mask(self.vocab, walk.alive_nodes)), walk.escape_nodes,
                              walk.escape_parent_states)
        with self._lock:
            return self._stages.setdefault(key, entry)

    def _relative_walk(self, automaton: PdaAutomaton, stacks: frozenset, sub: int,  # type: ignore[type-arg]
                       escapes: bool) -> _RelativeWalk:
        pda = automaton.pda
        if escapes and len(stacks) == 1 and pda.terminal_of is not None:
            (stack,) = stacks
            term = int(pda.terminal_of[stack[-1]]) if len(stack) == 2 else -1
            if term >= 0:
                offset, dfa = pda.terminals[term]
                found, packed = self._terminal_entry(dfa, stack[-1] - offset, 0)
                parents = found.escape_parent_states
                states = np.empty_like(parents)
                for q in np.unique(parents).tolist():
                    states[parents == q] = automaton.intern_stacks(frozenset({(MARK, offset + q)}))
                return _RelativeWalk(packed, found.escape_nodes, states)
        result = walk_trie(automaton, sub, self.vocab.trie, escapes=escapes, handoff=self._handoff)
        return _RelativeWalk(_frozen(nodes_to_mask(self.vocab, result.alive_nodes)), result.escape_nodes,
                             result.escape_parent_states)

    def _terminal_walk(self, dfa: ByteDFA, q: int, node: int) -> WalkResult:
        """Walk of a shared terminal's DFA from state `q` below trie `node`, cached per vocabulary."""
        return self._terminal_entry(dfa, q, node)[0]

    def _terminal_entry(self, dfa: ByteDFA, q: int, node: int) -> tuple[WalkResult, np.ndarray]:
        """The cached terminal walk and its packed mask."""
        per_dfa = self.vocab.terminal_walks.setdefault(dfa, {})
        found = per_dfa.get((q, node))
        if found is None:
            walk = walk_trie(DfaEscapes(dfa), q, self.vocab.trie, node, escapes=True)
            packed = _frozen(nodes_to_mask(self.vocab, walk.alive_nodes))
            found = per_dfa.setdefault((q, node), (walk, packed))
        return found

    def _handoff(self, nodes: np.ndarray, states: np.ndarray, escapes: bool) -> WalkResult:
        """Subtrees below configurations that are one stack inside a shared terminal: the terminal's cached
        walk, then (where the terminal may end) the configuration's own walk again from there."""
        automaton = self.automaton
        assert isinstance(automaton, PdaAutomaton)
        pda = automaton.pda
        alive: list[np.ndarray] = []
        cont_nodes: list[np.ndarray] = []
        cont_parents: list[np.ndarray] = []
        for node, state in zip(nodes.tolist(), states.tolist()):
            (stack,) = automaton.stacks(state)
            offset, dfa = pda.terminals[int(pda.terminal_of[stack[-1]])]
            walk = self._terminal_walk(dfa, stack[-1] - offset, node)
            alive.append(walk.alive_nodes)
            if walk.escape_nodes.size == 0:
                continue
            prefix = stack[:-1]
            parents = walk.escape_parent_states
            configs = np.empty_like(parents)
            for q in np.unique(parents).tolist():
                configs[parents == q] = automaton.intern_stacks(frozenset({prefix + (offset + q,)}))
            cont_nodes.append(walk.escape_nodes)
            cont_parents.append(configs)
        empty = np.zeros(0, dtype=np.int64)
        if not cont_nodes:
            return WalkResult(np.concatenate(alive) if alive else empty, empty, empty)
        starts_at = np.concatenate(cont_nodes)
        parents = np.concatenate(cont_parents)
        automaton.ensure_rows(parents)
        starts = automaton.table[parents, self.vocab.trie.node_byte[starts_at]].astype(np.int64)
        live = starts >= 0
        below = walk_trie(automaton, starts[live], self.vocab.trie, starts_at[live], escapes=escapes,
                          handoff=self._handoff, start_parents=parents[live])
        return WalkResult(np.concatenate(alive + [below.alive_nodes]), below.escape_nodes,
                          below.escape_parent_states)

