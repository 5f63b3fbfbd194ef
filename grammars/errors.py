"""The one exception every grammar front end raises for a constraint it cannot compile exactly."""

from __future__ import annotations


class GrammarError(ValueError):
    """A constraint (regex, EBNF, Lark, JSON Schema) that is malformed or uses syntax we cannot enforce.

    A `ValueError`, so the engine's request validation reports it like any other bad argument.
    """
