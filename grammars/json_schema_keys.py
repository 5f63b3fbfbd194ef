"""Languages of strings for the JSON Schema compiler, as DFAs over the text between the quotes: a string
schema's body (patterns, format, length, excluded values), and the keys of an object's extra properties split
into regions by the `patternProperties` they match (json_schema_dfa.py does the set operations).

Each region is the set of keys matching exactly one subset of the patterns, minus the declared names, within
`propertyNames`; a key of the region must satisfy the schemas of those patterns (or `additionalProperties` when
it matches none), so every key is checked against exactly what JSON Schema applies to it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from itertools import combinations
from typing import Any

from .json_schema_charset import ANY_JSON_CHAR
from .json_schema_dfa import (
    Dfa,
    TooComplex,
    canonical_body,
    dfa_of,
    intersect,
    is_empty,
    literal_dfa,
    subtract,
    unite,
)
from .json_schema_formats import FORMATS
from .json_schema_merge import NOT_ENUM, NOT_PATTERNS
from .json_schema_regex import pattern_to_regex

MAX_REGION_PATTERNS = 5  # 2**5 pattern subsets
MAX_COUNTED_LENGTH = 64  # length bounds intersected with a pattern as a DFA (one state per count)


def body_of(value: str) -> str:
    """The canonical JSON spelling of a string, without its quotes."""
    return json.dumps(value, ensure_ascii=False)[1:-1]


def string_body(s: dict[str, Any], min_len: int, max_len: int | None) -> Dfa:
    """The bodies of the strings `s` allows (its string keywords: `pattern`s, asserted `format`, length,
    `enum` / excluded strings), canonically spelled. `UnsupportedPattern` / `TooComplex` when it cannot."""
    machine = canonical_body()
    if "enum" in s:
        machine = intersect(machine, literal_dfa([body_of(v) for v in s["enum"] if isinstance(v, str)]))
    for pattern in s.get("pattern", ()):
        machine = intersect(machine, dfa_of(pattern_to_regex(pattern)))
    fmt = s.get("format")
    if fmt in FORMATS:
        machine = intersect(machine, dfa_of(FORMATS[fmt]))
    if min_len > 0 or max_len is not None:
        if max(min_len, max_len or 0) > MAX_COUNTED_LENGTH:
            raise TooComplex("length bound too large to intersect")
        upper = "" if max_len is None else str(max_len)
        machine = intersect(machine, dfa_of(f"{ANY_JSON_CHAR}{{{min_len},{upper}}}"))
    for pattern in s.get(NOT_PATTERNS, ()):
        machine = subtract(machine, dfa_of(pattern_to_regex(pattern)))
    excluded = [body_of(v) for v in s.get(NOT_ENUM, ()) if isinstance(v, str)]
    if excluded:
        machine = subtract(machine, literal_dfa(excluded))
    return machine


def key_regions(
    declared: list[str], patterns: list[str], names: Dfa | None, group: Callable[[frozenset[int]], Hashable | None]
) -> list[tuple[Hashable, Dfa]]:
    """The non-empty key regions, merged by `group(indices of the patterns matched)` (None: keys of that region
    are not allowed). Raises `UnsupportedPattern` or `TooComplex`."""
    if len(patterns) > MAX_REGION_PATTERNS:
        raise TooComplex(f"{len(patterns)} patternProperties")
    base = canonical_body()
    if declared:
        base = subtract(base, literal_dfa([body_of(n) for n in declared]))
    if names is not None:
        base = intersect(base, names)
    machines = [dfa_of(pattern_to_regex(p)) for p in patterns]
    groups: dict[Hashable, Dfa] = {}
    indices = range(len(patterns))
    for size in range(len(patterns) + 1):
        for subset in combinations(indices, size):
            key = group(frozenset(subset))
            if key is None:
                continue
            region = base
            for i in indices:
                region = intersect(region, machines[i]) if i in subset else subtract(region, machines[i])
            if is_empty(region):
                continue
            groups[key] = unite(groups[key], region) if key in groups else region
    return list(groups.items())

