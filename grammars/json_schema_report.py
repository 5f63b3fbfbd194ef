"""What a JSON Schema conversion could not translate exactly, as it is found: relaxations (the grammar accepts
more than the schema) and narrowings (it accepts less), one message each, ending with the JSON pointer."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import GrammarError


class SchemaError(GrammarError):
    """A schema that is invalid, unsatisfiable or uses something we can neither enforce nor relax.

    The message starts with the JSON pointer of the offending subschema.
    """


@dataclass
class Report:
    relaxations: list[str] = field(default_factory=list)
    narrowings: list[str] = field(default_factory=list)

    def relax(self, ptr: str, message: str) -> None:
        self.relaxations.append(f"{message} at {ptr or '/'}")

    def narrow(self, ptr: str, message: str) -> None:
        self.narrowings.append(f"{message} at {ptr or '/'}")

    def final(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(relaxations, narrowings), each without repeats, in the order found."""
        return tuple(dict.fromkeys(self.relaxations)), tuple(dict.fromkeys(self.narrowings))
