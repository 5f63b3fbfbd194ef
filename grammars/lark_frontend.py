"""Lark grammar text -> grammar IR, through lark's own grammar loader.

Lark expands EBNF operators, templates, `?rule` / `_rule` inlining marks and `%import common.*` into plain
BNF rules and flattened terminal regexes; we take those as they are. Matching is lexerless and byte-level:
each terminal is a byte DFA matched in place, and `%ignore` terminals may appear (any number of times) before
every terminal and at the end of the text, as llguidance and XGrammar do. Unlike lark's standard lexer there
is no longest-match tokenization, so adjacent terminals need no separator (`lexer="dynamic_complete"` in lark
is the closest reference). Priorities and `%declare`d terminals are not supported. Token references
(token_refs.py: `<|python_tag|>`, `<[128010]>`) may stand in rules, as llguidance allows, not inside terminals.
"""

from __future__ import annotations

import re

from lark.exceptions import LarkError
from lark.lexer import PatternStr, TerminalDef
from lark.load_grammar import load_grammar

from radixgen.grammars.bytedfa import ByteDFA, dfa_from_bytes
from radixgen.grammars.errors import GrammarError
from radixgen.grammars.ir import Alt, Expr, GrammarIR, Graph, Repeat, RuleRef, Seq, Terminal, TokenRef
from radixgen.grammars.regex import regex_to_dfa
from radixgen.grammars.token_refs import replace_token_refs

# common.lark terminals written with lookbehind / lazy repetition, replaced by exact equivalents.
_EXACT_REPLACEMENTS = {
    r'".*?(?<!\\)(\\\\)*?"': r'"(?:[^"\\\n]|\\.)*"',  # ESCAPED_STRING
    "/\\*(.|\n)*?\\*/": r"/\*(?:[^*]|\*+[^*/])*\*+/",  # C_COMMENT (its regex holds a real newline)
}


def _terminal_dfa(term: TerminalDef) -> ByteDFA:
    pattern = term.pattern
    if isinstance(pattern, PatternStr) and not pattern.flags:
        return dfa_from_bytes(pattern.value.encode("utf-8"))
    regex = pattern.to_regexp()
    regex = _EXACT_REPLACEMENTS.get(regex, regex)
    try:
        return regex_to_dfa(regex)
    except GrammarError as exc:
        raise GrammarError(f"Lark terminal {term.name}: {exc}") from exc


def sequences_to_graph(seqs: list[tuple[Expr, ...]]) -> Expr:
    """Alternatives -> the smallest acyclic automaton reading them (common prefixes and suffixes shared).

    lark expands every `x?` into two alternatives, so a rule with n optional items arrives as 2**n
    sequences; as a graph it stays linear in n.
    """
    if len(seqs) == 1:
        return seqs[0][0] if len(seqs[0]) == 1 else Seq(seqs[0])
    # Trie of the sequences, then merge equal suffixes bottom-up (hash-consing by signature).
    children: list[dict[Expr, int]] = [{}]
    ends: list[bool] = [False]
    for seq in seqs:
        node = 0
        for item in seq:
            nxt = children[node].get(item)
            if nxt is None:
                nxt = len(children)
                children[node][item] = nxt
                children.append({})
                ends.append(False)
            node = nxt
        ends[node] = True
    canonical: dict[tuple[bool, frozenset[tuple[int, int]]], int] = {}
    item_ids: dict[Expr, int] = {}
    items: list[Expr] = []
    merged = [0] * len(children)
    # Trie children always have larger ids than their parent: visit in reverse for bottom-up order.
    for node in range(len(children) - 1, -1, -1):
        out = []
        for item, child in children[node].items():
            if item not in item_ids:
                item_ids[item] = len(items)
                items.append(item)
            out.append((item_ids[item], merged[child]))
        merged[node] = canonical.setdefault((ends[node], frozenset(out)), len(canonical))
    # Number graph nodes: the trie root is node 0, the exit is a fresh node after all others.
    root_sig = merged[0]
    order = {root_sig: 0}
    for sig in range(len(canonical)):
        if sig != root_sig:
            order[sig] = len(order)
    end = len(order)
    edges: list[tuple[int, Expr, int]] = []
    for (is_end, moves), sig in canonical.items():
        for item_id, child in moves:
            edges.append((order[sig], items[item_id], order[child]))
        if is_end:
            edges.append((order[sig], Seq(()), end))
    return Graph(tuple(edges), end)


_REF_NAME = "RADIXGEN_TOKEN_REF_{}"
_REF_MARK = "\ue000radixgentokenref"  # starts a placeholder terminal's text (found where lark inlines it)


def _placeholders(text: str) -> tuple[str, dict[str, TokenRef]]:
    """`text` with every token reference replaced by a placeholder terminal lark can read (defined at the
    end), and the reference of each placeholder's name."""
    refs: dict[str, TokenRef] = {}
    names: dict[str, str] = {}

    def name_of(ref: TokenRef) -> str:
        found = names.get(ref.written)
        if found is None:
            found = names[ref.written] = _REF_NAME.format(len(refs))
            refs[found] = ref
        return f" {found} "

    replaced = replace_token_refs(text, "lark", name_of)
    if not refs:
        return text, refs
    defined = "".join(f'\n{name}: "{_REF_MARK}{i}\ue000"' for i, name in enumerate(refs))
    return replaced + defined + "\n", refs


def parse_lark(text: str, start: str = "start") -> GrammarIR:
    """Parse Lark grammar text into the grammar IR (not yet normalized); `GrammarError` on failure."""
    text, refs = _placeholders(text)
    try:
        grammar, _ = load_grammar(text, "<grammar>", [], False)
        terminals, rules, ignore = grammar.compile([start], set())
    except LarkError as exc:
        raise GrammarError(f"Lark grammar: {exc}") from exc
    except KeyError as exc:  # lark raises KeyError for an unknown start rule
        raise GrammarError(f"Lark grammar: unknown rule {exc}") from exc

    by_name = {t.name: t for t in terminals}
    term_exprs: dict[str, Expr] = {}
    for name, term in by_name.items():
        if name in refs:
            term_exprs[name] = refs[name]
            continue
        if re.fullmatch(r"__.*", name) is None and term.pattern is None:  # pragma: no cover - %declare
            raise GrammarError(f"Lark terminal {name} has no pattern (%declare is not supported)")
        if refs and _REF_MARK in term.pattern.value:
            raise GrammarError(f"Lark terminal {name}: a token reference cannot be used inside a terminal, only "
                               f"in rules")
        term_exprs[name] = Terminal(_terminal_dfa(term), name)

    ignored: Expr | None = None
    if ignore:
        missing = [n for n in ignore if n not in term_exprs]
        if missing:
            raise GrammarError(f"Lark grammar: %ignore names unknown terminals {missing}")
        options = tuple(term_exprs[n] for n in ignore)
        ignored = Repeat(options[0] if len(options) == 1 else Alt(options), 0, None)

    def symbol(sym) -> Expr:  # type: ignore[no-untyped-def]
        if not sym.is_term:
            return RuleRef(sym.name)
        if sym.name not in term_exprs:
            raise GrammarError(f"Lark grammar: unknown terminal {sym.name}")
        term = term_exprs[sym.name]
        return term if ignored is None else Seq((ignored, term))

    alternatives: dict[str, list[tuple[Expr, ...]]] = {}
    for rule in rules:
        alternatives.setdefault(rule.origin.name, []).append(tuple(symbol(s) for s in rule.expansion))
    if start not in alternatives:
        raise GrammarError(f"Lark grammar has no rule {start!r}")
    bodies: dict[str, Expr] = {}
    for name, seqs in alternatives.items():
        # lark writes `A: A x | y` for repetitions: read it as y x* (no left recursion for the matcher).
        recursive = [seq[1:] for seq in seqs if seq and seq[0] == RuleRef(name)]
        base = [seq for seq in seqs if not (seq and seq[0] == RuleRef(name))]
        if not base:
            raise GrammarError(f"Lark rule {name!r} is left-recursive with no non-recursive alternative")
        body = sequences_to_graph(base)
        bodies[name] = Seq((body, Repeat(sequences_to_graph(recursive), 0, None))) if recursive else body
    root = "__radixgen_root__"
    bodies[root] = Seq((RuleRef(start), ignored)) if ignored is not None else RuleRef(start)
    return GrammarIR(bodies, root)
