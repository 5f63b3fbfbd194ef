"""Expressions a program appends to its state: text, gen, select, role and variable-scope markers.

`s += "Q: " + gen("a")` builds an `ExprList` of plain values; the executor interprets them in order. Expressions
are immutable descriptions; they carry no state, so one expression may be appended to many states.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from radixgen.lang.spec import GenSpec
from radixgen.lang.tools import GenTools

ROLES = ("system", "user", "assistant")


class Expr:
    """Base of everything that can be appended to a state; `+` concatenates into an `ExprList`."""

    def __add__(self, other: Any) -> ExprList:
        return ExprList.of(self, other)

    def __radd__(self, other: Any) -> ExprList:
        return ExprList.of(other, self)


@dataclass(frozen=True, eq=False)
class Text(Expr):
    value: str


@dataclass(frozen=True, eq=False)
class Gen(Expr):
    """Generate a span; `dtype` converts the text (int/float/bool/str) after decoding. With `n > 1` the model
    samples `n` answers: the variable holds all of them, the text continues with the first. With `best_of > n`
    it samples `best_of` and keeps the `n` of highest cumulative logprob, best first."""

    name: str | None
    spec: GenSpec
    dtype: type | None = None
    n: int = 1
    tools: GenTools | None = None  # gen(tools=...): calls are read back into the meta info
    best_of: int | None = None  # samples drawn, of which the n best are kept (None: n)

    @property
    def num_samples(self) -> int:
        return self.n if self.best_of is None else self.best_of


@dataclass(frozen=True, eq=False)
class Select(Expr):
    """Choose one of `choices` by its likelihood under the model (scored, not sampled, unless temperature>0)."""

    name: str | None
    choices: tuple[str, ...]
    temperature: float = 0.0
    method: str = "token_length_normalized"


@dataclass(frozen=True, eq=False)
class RoleBegin(Expr):
    role: str


@dataclass(frozen=True, eq=False)
class RoleEnd(Expr):
    role: str


@dataclass(frozen=True, eq=False)
class VarScopeBegin(Expr):
    name: str


@dataclass(frozen=True, eq=False)
class VarScopeEnd(Expr):
    name: str


@dataclass(frozen=True, eq=False)
class ExprList(Expr):
    items: tuple[Expr, ...]

    @staticmethod
    def of(*parts: Any) -> ExprList:
        return ExprList(tuple(flatten(parts)))


def to_expr(value: Any) -> Expr:
    """Wrap a Python value as an expression: strings become `Text`; other values are refused with a hint."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Text(value)
    as_expr = getattr(value, "__radixgen_expr__", None)
    if as_expr is not None:
        return as_expr()
    raise TypeError(
        f"cannot append a {type(value).__name__} to a program state; append text (s += str(value)) "
        "or an expression such as gen(...), select(...), user(...)"
    )


def flatten(parts: Iterable[Any]) -> list[Expr]:
    out: list[Expr] = []
    for part in parts:
        expr = to_expr(part)
        if isinstance(expr, ExprList):
            out.extend(expr.items)
        else:
            out.append(expr)
    return out


def role_expr(role: str, content: Any | None) -> ExprList:
    """`user("hi")` -> begin, content, end; `user()` -> an empty turn."""
    parts: list[Any] = [RoleBegin(role)]
    if content is not None:
        parts.append(content)
    parts.append(RoleEnd(role))
    return ExprList.of(*parts)


def check_choices(choices: Sequence[str] | None) -> tuple[str, ...]:
    if not choices:
        raise ValueError("select needs a non-empty list of choices, e.g. select('answer', choices=['yes', 'no'])")
    if not all(isinstance(c, str) for c in choices):
        raise TypeError("select choices must all be strings")
    return tuple(choices)
