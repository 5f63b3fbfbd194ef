"""Token masks of a compiled grammar's states, computed from the vocabulary trie and cached.

A regex state's mask is one trie walk over its DFA. A grammar configuration (a set of parser stacks) is the
union over its stacks, and a stack's mask is a chain of frame walks (`MaskCache._pda_mask`): the top frame
alone (a relative stack, walked at compile time), then, from the trie nodes where that frame's rule may end,
the frame below alone, and so on down to the root. Each walk is cached by (frame, start nodes), so positions
and nesting depths that share a frame share its walk (XGrammar's context-independent / dependent split, made
per frame). Frames are keyed by their lookahead representatives, so the positions of a long bounded
repetition share walks too, and the few tokens longer than that lookahead are decided per stack, frame by
frame, memoized (long_tokens.py). Walks inside a shared terminal (a JSON string, a number) are cached per
vocabulary and reused by every grammar (terminal_walks.py). A frame below a pop set steps the distinct
suffixes below those nodes, merged once per vocabulary (suffix_walks.py), not every subtree; below a pop set
near the root, it is derived from its walk below a nearby set (frame_bases.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from radixgen.grammars.automaton import (
    DEAD,
    MARK,
    ByteAutomaton,
    DfaAutomaton,
    PdaAutomaton,
)
from radixgen.grammars.bytedfa import start_distances
from radixgen.grammars.frame_bases import FrameBases
from radixgen.grammars.long_tokens import LongTokenReader
from radixgen.grammars.lookahead import lookahead_representatives
from radixgen.grammars.pda import PdaTables, called_states
from radixgen.grammars.suffix_walks import SuffixWalk, suffix_walk
from radixgen.grammars.terminal_walks import TerminalHandoff, sorted_unique, terminal_top_walk
from radixgen.grammars.token_refs import has_token_refs, token_ref_targets
from radixgen.grammars.token_walk import WalkResult, nodes_to_mask, walk_mask, walk_trie
from radixgen.grammars.vocabulary import Vocabulary


@dataclass(frozen=True)
class _FrameWalk:
    """One frame's part of a stack's mask (see `MaskCache._pda_mask`)."""

    packed: np.ndarray  # the tokens read without popping the frame (all of them for the root frame)
    pops: int | None  # id of the trie nodes where the frame's rule may end (`MaskCache._node_set`); None: none


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _warm(vocab: Vocabulary) -> None:
    """Build the vocabulary's derived tables that masks read (once per vocabulary, at compile time rather
    than inside the first mask that needs them)."""
    vocab.trie.lists()
    vocab.trie.token_ids()
    _ = vocab.long_token_witnesses, vocab.long_token_runs, vocab.long_token_paths, vocab.eos_mask
    _ = vocab.subtree_sizes


def _witnessed(vocab: Vocabulary, shared: np.ndarray) -> list[bool]:
    """Per long token (`Vocabulary.long_tokens` order): `shared` allows its witness, or it has none (one
    gather for all of them; the word and bit of each witness are cached on the vocabulary)."""
    found: tuple[np.ndarray, np.ndarray, np.ndarray] | None = vocab.__dict__.get("_witness_bits")
    if found is None:
        ids = [0 if w is None else w for w in vocab.long_token_witnesses]
        found = (np.array([i >> 5 for i in ids], dtype=np.int64), np.array([i & 31 for i in ids], dtype=np.uint32),
                 np.array([w is None for w in vocab.long_token_witnesses], dtype=bool))
        vocab.__dict__["_witness_bits"] = found
    words, shifts, unwitnessed = found
    allowed: list[bool] = (((shared.view(np.uint32)[words] >> shifts) & 1).astype(bool) | unwitnessed).tolist()
    return allowed


SUFFIX_TRIE_NODES = 4096  # pop sets whose subtrees hold at most this many trie nodes are walked by suffix
PRECOMPUTE_REGEX_BYTES = 16  # regex states with at most this many live bytes are walked at compile time


@dataclass(frozen=True)
class PrecomputedMasks:
    """What `MaskCache.precompute` computed, as plain arrays (the part of a compiled grammar the disk cache
    keeps): the top walks (row i: state `top_states[i]`, its packed tokens, index of its pop set or -1), the
    pop sets (set j is `pop_nodes[pop_start[j]:pop_start[j + 1]]`, sorted), the lookahead representatives
    (empty for a regex) and a regex's precomputed masks."""

    top_states: np.ndarray  # int64[T]
    top_packed: np.ndarray  # int32[T, W]
    top_pops: np.ndarray  # int64[T]
    pop_start: np.ndarray  # int64[P + 1]
    pop_nodes: np.ndarray  # int64[pop_start[-1]]
    representatives: np.ndarray  # int64[G] or int64[0]
    mask_states: np.ndarray  # int64[M]
    mask_packed: np.ndarray  # int32[M, W]


class MaskCache:
    """Packed masks per automaton state (EOS set iff accepting), computed on first use, thread-safe."""

    def __init__(self, vocab: Vocabulary, automaton: ByteAutomaton) -> None:
        self.vocab = vocab
        self.automaton = automaton
        self._masks: dict[int, np.ndarray] = {}
        self._tops: dict[int, _FrameWalk] = {}  # stage 1 by top PDA state
        self._frames: dict[tuple[int, int, bool], _FrameWalk] = {}  # later stages by (frame, pops, root)
        self._roots: dict[int, np.ndarray] = {}  # packed masks of one-frame stacks by frame (`_root_walk`)
        self._node_ids: dict[bytes, int] = {}  # see `_node_set`
        self._node_sets: list[np.ndarray] = []
        self._pops_on_long: dict[int, bool] = {}  # see `_on_long_tokens`
        self._pops_merge: dict[int, bool] = {}  # see `_merges_well`
        self._suffix_pop_ids: dict[tuple[int, tuple[int, ...]], int | None] = {}  # see `_suffix_pops`
        self._lock = threading.Lock()
        self._representatives: list[int] | None = None  # per PDA state, see `_lookahead`
        self._restored: PrecomputedMasks | None = None  # see `restore`
        self._restored_rows: dict[int, int] = {}
        self._handoff = TerminalHandoff(vocab, automaton) if isinstance(automaton, PdaAutomaton) else None
        self._token_refs = has_token_refs(automaton)  # some state reads a token by id (token_refs.py)
        self._long: LongTokenReader | None = None  # see `_fix_long_tokens`
        self._bases = FrameBases(vocab)  # see `_wide_frame_walk`

    def precompute(self) -> None:
        """Walk the trie from every grammar position (each PDA state with bytes, as a relative top frame)
        now, at compile time, so the first mask at a position costs only the frames below it.

        Within the vocabulary's `precompute_s` of CPU time, so a huge grammar compiles in bounded time and
        leaves its remaining positions for first use (the results are the same either way, only cached
        earlier). Only states of called rules (`called_states`: the start rule's states only ever sit in root
        frames, met once at the start), in `_precompute_order`. Wide regex states are left for first use."""
        automaton = self.automaton
        _warm(self.vocab)
        if isinstance(automaton, DfaAutomaton):
            # A regex: narrow states' masks are cheap to walk now; wide ones are walked on first use.
            narrow = (automaton.table >= 0).sum(axis=1) <= PRECOMPUTE_REGEX_BYTES
            deadline = time.thread_time() + self.vocab.precompute_s
            for q in np.flatnonzero(narrow).tolist():
                if time.thread_time() > deadline:
                    break
                self.mask(q)
            return
        if not isinstance(automaton, PdaAutomaton):
            return
        pda = automaton.pda
        automaton.fill_relative_tops()
        representatives = np.asarray(self._lookahead(automaton))
        candidates = np.unique(representatives[pda.has_bytes & called_states(pda)])  # of possible top frames
        deadline = time.thread_time() + self.vocab.precompute_s
        for g in self._precompute_order(pda, candidates):
            if time.thread_time() > deadline:
                break
            self._top_walk(automaton, g)

    def _precompute_order(self, pda: PdaTables, candidates: np.ndarray) -> list[int]:
        """Top frames to walk at compile time, cheapest and likeliest first: states inside shared terminals
        whose walk another grammar already cached (a lookup each), then rule states (narrowest first), then
        the other terminal states, nearest their terminal's start first (a value's first bytes are read far
        more often than its thousandth)."""
        terminal_of = pda.terminal_of if pda.terminal_of is not None else np.full(pda.num_states, -1)
        rules = candidates[terminal_of[candidates] < 0]
        live_bytes = (pda.trans[rules] >= 0).sum(axis=1)
        cached: list[int] = []
        fresh: list[tuple[int, int]] = []
        for g in candidates[terminal_of[candidates] >= 0].tolist():
            offset, dfa = pda.terminals[int(terminal_of[g])]
            if self.vocab.terminal_walks.get((dfa.digest, g - offset, "top")) is not None:
                cached.append(g)
            else:
                fresh.append((int(start_distances(dfa)[g - offset]), g))
        narrowest: list[int] = rules[np.argsort(live_bytes, kind="stable")].tolist()
        return cached + narrowest + [g for _, g in sorted(fresh)]

    def precomputed(self) -> PrecomputedMasks:
        """The walks `precompute` did, as arrays (call it right after `precompute`, before any mask)."""
        words = self.vocab.mask_words
        tops = sorted(self._tops.items())
        used = sorted({entry.pops for _, entry in tops if entry.pops is not None})
        index = {pops: i for i, pops in enumerate(used)}
        sets = [self._node_sets[pops] for pops in used]
        masks = sorted(self._masks.items())
        return PrecomputedMasks(
            top_states=np.array([g for g, _ in tops], dtype=np.int64),
            top_packed=np.array([e.packed for _, e in tops], dtype=np.int32).reshape(len(tops), words),
            top_pops=np.array([-1 if e.pops is None else index[e.pops] for _, e in tops], dtype=np.int64),
            pop_start=np.cumsum([0] + [s.shape[0] for s in sets], dtype=np.int64),
            pop_nodes=np.concatenate(sets).astype(np.int64) if sets else np.zeros(0, dtype=np.int64),
            representatives=np.asarray(self._representatives or [], dtype=np.int64),
            mask_states=np.array([q for q, _ in masks], dtype=np.int64),
            mask_packed=np.array([m for _, m in masks], dtype=np.int32).reshape(len(masks), words))

    def restore(self, done: PrecomputedMasks) -> None:
        """Take the results of an earlier `precompute` of the same grammar and vocabulary (`precomputed`)
        instead of computing them; the arrays are used as they are (read-only). A top walk is unpacked when
        first used (`_restored_top`), so restoring costs the same for a grammar of any size."""
        self._restored = done
        self._restored_rows = dict(zip(done.top_states.tolist(), range(done.top_states.shape[0])))
        for q, row in zip(done.mask_states.tolist(), done.mask_packed):
            self._masks[q] = row
        if done.representatives.size:
            self._representatives = done.representatives.tolist()
        _warm(self.vocab)

    def _restored_top(self, top: int) -> _FrameWalk | None:
        """The restored top walk of `top` (see `restore`), or None when it was not precomputed."""
        row = self._restored_rows.get(top)
        if row is None or self._restored is None:
            return None
        done = self._restored
        pops = int(done.top_pops[row])
        if pops >= 0:
            nodes = done.pop_nodes[int(done.pop_start[pops]):int(done.pop_start[pops + 1])]
        entry = _FrameWalk(done.top_packed[row], None if pops < 0 else self._node_set_sorted(nodes))
        with self._lock:
            return self._tops.setdefault(top, entry)

    def __len__(self) -> int:
        return len(self._masks)

    def __contains__(self, state: int) -> bool:
        return state in self._masks

    def mask(self, state: int) -> np.ndarray:
        """Packed allowed-token row for `state` (EOS set iff accepting, and the tokens it reads as token
        references). Read-only; shared."""
        found = self._masks.get(state)
        if found is not None:
            return found
        if isinstance(self.automaton, PdaAutomaton):
            packed = self._pda_mask(self.automaton, state)
        else:
            packed = nodes_to_mask(self.vocab, walk_trie(self.automaton, state, self.vocab.trie).alive_nodes)
        if self.automaton.accepting(state):
            packed |= self.vocab.eos_mask
        if self._token_refs:  # the tokens this state reads by id (token_refs.py)
            for tid, _ in token_ref_targets(self.automaton, state):
                packed[tid >> 5] |= np.int32(np.uint32(1 << (tid & 31)).view(np.int32))
        packed.flags.writeable = False
        with self._lock:
            self._masks.setdefault(state, packed)
        return packed

    def _lookahead(self, automaton: PdaAutomaton) -> list[int]:
        """Per PDA state, the representative of the states that read the same strings of up to the
        vocabulary's split length (see `Vocabulary.long_tokens`): computed once per grammar.

        Frame walks are keyed by representatives: positions of a bounded repetition (a string's maxLength)
        more than the split length from its end share one walk. That walk is exact for every token but the
        few longer than the split, which `_fix_long_tokens` checks one by one instead."""
        found = self._representatives
        if found is None:
            split = self.vocab.long_tokens[0]
            found = self._representatives = lookahead_representatives(automaton.pda, split).tolist()
        return found

    def _fix_long_tokens(self, automaton: PdaAutomaton, state: int, shared: np.ndarray) -> np.ndarray:
        """`shared` (exact for tokens of at most the split length) with the bits of the few longer tokens
        (`Vocabulary.long_tokens`) made exact: refused where `shared` refuses their witness prefix, else read
        by the configuration's stacks, frame by frame (long_tokens.py, memoized per frame)."""
        vocab = self.vocab
        _, entries, bits = vocab.long_tokens
        out: np.ndarray = shared & ~bits
        wanted = sum(1 << i for i, ok in enumerate(_witnessed(vocab, shared)) if ok)
        if not wanted:
            return out
        if self._long is None:
            self._long = LongTokenReader(vocab, automaton)
        readable = 0
        for stack in automaton.stacks(state):
            readable |= self._long.readable(stack, wanted & ~readable)
            if readable == wanted:
                break
        ids = [tid for i, (tid, _, _) in enumerate(entries) if readable >> i & 1]
        if ids:
            found = np.array(ids, dtype=np.int64)
            np.bitwise_or.at(out.view(np.uint32), found >> 5,
                             np.left_shift(np.uint32(1), (found & 31).astype(np.uint32)))
        return out

    def _pda_mask(self, automaton: PdaAutomaton, state: int) -> np.ndarray:
        """Packed mask (no EOS) of a grammar configuration: the union over its stacks.

        A token is readable from a stack `(f_d, ..., f_1)` (top last) when some path reads it, and every path
        reads a part in the top frame's rule, then, where that rule ends (a pop), a part from the frame below,
        and so on. So the stack's mask is a chain of frame walks, each cached and shared by every stack with
        that frame at that point, whatever lies above or below it:
        1. The top frame alone (the relative stack `(MARK, f_1)`, walked at compile time; inside a shared
           terminal, from the terminal's walk cached per vocabulary): every token that never pops `f_1`,
           and the trie nodes where `f_1`'s rule may end (its pops).
        k. From those pops, frame `f_k` alone: `(MARK, f_k)` closed, walked from each pop node on (over the
           merged suffixes below the pops where their subtrees are small, `_merges_well`). Its key is
           (frame, pop nodes), so deep stacks and different paths that reach the same frame with the same
           pops share it. The root frame `f_d` is walked as itself (no MARK): that walk is exact.
        Most tokens pop a frame or two at most, so the chain is short. A stack that is one root frame is its
        top walk and the tokens ending where that frame's rule may end (`_root_walk`).
        Every frame is replaced by its representative (`_lookahead`). Where a replaced frame can be reached
        by a token longer than the split length (it is the top, or the pops above it lie on such a token's
        path), those few tokens are stepped from the real configuration.
        """
        out = np.zeros(self.vocab.mask_words, dtype=np.int32)
        representatives = self._lookahead(automaton)
        replaced = False
        for real in automaton.stacks(state):
            stack = tuple(representatives[frame] for frame in real)
            replaced = replaced or stack[-1] != real[-1]
            if len(stack) == 1:
                out |= self._root_walk(automaton, stack[0])
                continue
            entry = self._top_walk(automaton, stack[-1])
            out |= entry.packed
            long_reach = True  # a long token may reach the current frame
            below = len(stack) - 2
            while entry.pops is not None:
                long_reach = long_reach and self._on_long_tokens(entry.pops)
                replaced = replaced or (long_reach and stack[below] != real[below])
                entry = self._frame_walk(automaton, stack[below], entry.pops, root=below == 0)
                out |= entry.packed
                below -= 1
        if replaced:
            out = self._fix_long_tokens(automaton, state, out)
        return out

    def _top_walk(self, automaton: PdaAutomaton, top: int) -> _FrameWalk:
        """Stage 1 for a stack whose top frame is PDA state `top`."""
        found = self._tops.get(top) or self._restored_top(top)
        if found is not None:
            return found
        pda = automaton.pda
        term = int(pda.terminal_of[top]) if pda.terminal_of is not None else -1
        if term >= 0:
            # Inside a shared terminal: the terminal alone, cached per vocabulary.
            offset, dfa = pda.terminals[term]
            packed, pops = terminal_top_walk(self.vocab, dfa, top - offset)
            entry = _FrameWalk(packed, self._node_set(pops))
        else:
            sub = automaton.intern_stacks(((MARK, top),))
            entry = self._entry(walk_trie(automaton, sub, self.vocab.trie, escapes=True, handoff=self._handoff,
                                          past_escapes=True))
        with self._lock:
            return self._tops.setdefault(top, entry)

    def _root_walk(self, automaton: PdaAutomaton, frame: int) -> np.ndarray:
        """The mask of a stack that is one root frame: what its top walk reads without popping the frame, and
        the tokens ending where the frame's rule may end (the text is then complete: nothing may follow)."""
        found = self._roots.get(frame)
        if found is None:
            entry = self._top_walk(automaton, frame)
            packed = entry.packed
            if entry.pops is not None:
                packed = packed | nodes_to_mask(self.vocab, self._node_sets[entry.pops])
            with self._lock:
                found = self._roots.setdefault(frame, _frozen(packed))
        return found

    def _frame_walk(self, automaton: PdaAutomaton, frame: int, pops: int, root: bool) -> _FrameWalk:
        """Stage k: frame `frame` (a return state) resumes at the pop nodes `pops` of the stage above it."""
        key = (frame, pops, root)
        found = self._frames.get(key)
        if found is not None:
            return found
        start = automaton.closed_state((frame,) if root else (MARK, frame))
        if start == DEAD:
            entry = _FrameWalk(_frozen(np.zeros(self.vocab.mask_words, dtype=np.int32)), None)
        else:
            nodes = self._node_sets[pops]
            if self._merges_well(pops):
                walk = suffix_walk(self.vocab, automaton, start, nodes, not root, self._handoff)
                entry = _FrameWalk(_frozen(walk.packed), self._suffix_pops(pops, walk))
            else:
                entry = self._wide_frame_walk(automaton, frame, start, nodes, root)
        with self._lock:
            return self._frames.setdefault(key, entry)

    def _wide_frame_walk(self, automaton: PdaAutomaton, frame: int, start: int, nodes: np.ndarray,
                         root: bool) -> _FrameWalk:
        """`_frame_walk` below pop nodes with large subtrees: derived from the frame's walk below a nearby set
        where there is one (frame_bases.py), else walked level by level (and offered as a base)."""
        def below(some: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            starts = np.full(some.shape[0], start, dtype=np.int64)
            walk = walk_trie(automaton, starts, self.vocab.trie, some, escapes=not root, handoff=self._handoff,
                             start_parents=starts, past_escapes=True)
            return walk_mask(self.vocab, walk), walk.escape_nodes

        derived = self._bases.derive(frame, root, nodes, below)
        if derived is None:
            derived = below(nodes)
            self._bases.offer(frame, root, nodes, derived)
        return _FrameWalk(_frozen(derived[0]), self._node_set(derived[1]))

    def _suffix_pops(self, pops: int, walk: SuffixWalk) -> int | None:
        """`_node_set` of a suffix walk's escape nodes, looked up by the suffixes they stand for where it can be
        (walks of different frames below one pop set mostly escape at the same suffixes)."""
        if walk.escape_suffixes is None:
            return self._node_set(walk.escape_nodes)
        key = (pops, walk.escape_suffixes)
        if key not in self._suffix_pop_ids:
            self._suffix_pop_ids[key] = self._node_set(walk.escape_nodes)
        return self._suffix_pop_ids[key]

    def _merges_well(self, pops: int) -> bool:
        """The subtrees below the pop nodes `pops` are small enough to merge by suffix (suffix_walks.py); larger
        ones (a pop near the root) are walked level by level instead."""
        found = self._pops_merge.get(pops)
        if found is None:
            total = int(self.vocab.subtree_sizes[self._node_sets[pops]].sum())
            found = self._pops_merge[pops] = total <= SUFFIX_TRIE_NODES
        return found

    def _on_long_tokens(self, pops: int) -> bool:
        """Some of the pop nodes `pops` lie on the path of a token longer than the split length."""
        found = self._pops_on_long.get(pops)
        if found is None:
            found = self._pops_on_long[pops] = bool(self.vocab.long_token_paths[self._node_sets[pops]].any())
        return found

    def _entry(self, walk: WalkResult) -> _FrameWalk:
        return _FrameWalk(_frozen(walk_mask(self.vocab, walk)), self._node_set(walk.escape_nodes))

    def _node_set(self, nodes: np.ndarray) -> int | None:
        """Interned id of a set of trie nodes (None for the empty set): equal sets get one id."""
        if nodes.size == 0:
            return None
        return self._node_set_sorted(sorted_unique(nodes))

    def _node_set_sorted(self, unique: np.ndarray) -> int:
        """`_node_set` of nodes already sorted and distinct."""
        key = unique.tobytes()
        with self._lock:
            found = self._node_ids.get(key)
            if found is None:
                found = self._node_ids[key] = len(self._node_sets)
                self._node_sets.append(unique)
            return found
