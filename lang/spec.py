"""What one `gen` asks of the model: sampling options plus at most one constraint, in SGLang's names.

`GenSpec` fields left as `None` inherit the defaults a program is run with (`fn.run(max_new_tokens=...,
temperature=...)`), then the engine's own defaults. `sampling_params()` renders the engine/server dict of
docs/engine_api.md.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

# Regexes used for dtype-typed gens (`gen(dtype=int)`, `gen_int`, `gen_string`); the text is converted after.
DTYPE_REGEX: dict[type, str] = {
    int: r"-?(0|[1-9][0-9]{0,17})",
    float: r"-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,8})?",
    bool: r"(True|False)",
    str: r"\"[^\"\\\n]{0,200}\"",
}

CONSTRAINT_KINDS = ("regex", "json_schema", "ebnf", "grammar")


@dataclass(frozen=True)
class Constraint:
    """One output constraint: `kind` is an engine sampling-params key, `source` its text."""

    kind: str
    source: str

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS:
            raise ValueError(f"constraint kind must be one of {CONSTRAINT_KINDS}, got {self.kind!r}")


def grammar_constraint(text: str) -> Constraint:
    """`gen(grammar=...)` accepts Lark or EBNF (GBNF) text; EBNF is recognised by its `::=` rules."""
    return Constraint("ebnf" if "::=" in text else "grammar", text)


@dataclass(frozen=True)
class GenSpec:
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    return_logprob: bool | None = None
    top_logprobs_num: int | None = None
    constraint: Constraint | None = None

    def with_defaults(self, defaults: GenSpec | None) -> GenSpec:
        """Fill unset fields from `defaults` (the run-level options)."""
        if defaults is None:
            return self
        filled = {f.name: getattr(defaults, f.name) for f in fields(self) if getattr(self, f.name) is None}
        return replace(self, **filled)

    def sampling_params(self) -> dict[str, Any]:
        """The engine's `sampling_params` dict; unset fields are left out so the engine's defaults apply."""
        params: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or f.name in ("return_logprob", "top_logprobs_num", "constraint"):
                continue
            params[f.name] = list(value) if isinstance(value, tuple) else value
        if self.constraint is not None:
            params[self.constraint.kind] = self.constraint.source
        return params


def make_spec(
    *,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    stop: str | list[str] | tuple[str, ...] | None = None,
    stop_token_ids: list[int] | tuple[int, ...] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    top_logprobs_num: int | None = None,
    constraint: Constraint | None = None,
) -> GenSpec:
    """Build a spec from SGLang-style keyword names (`max_tokens`, `min_tokens`, `stop` as str or list)."""
    if isinstance(stop, str):
        stop = (stop,)
    return GenSpec(
        max_new_tokens=max_tokens,
        min_new_tokens=min_tokens,
        stop=tuple(stop) if stop is not None else None,
        stop_token_ids=tuple(stop_token_ids) if stop_token_ids is not None else None,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        ignore_eos=ignore_eos,
        return_logprob=return_logprob,
        top_logprobs_num=top_logprobs_num,
        constraint=constraint,
    )


def convert_dtype(text: str, dtype: type | None) -> Any:
    """Turn the decoded text of a dtype-typed gen into its Python value."""
    if dtype is None:
        return text
    stripped = text.strip()
    if dtype is int:
        return int(stripped)
    if dtype is float:
        return float(stripped)
    if dtype is bool:
        return stripped == "True"
    if dtype is str:
        return stripped[1:-1] if len(stripped) >= 2 and stripped[0] == stripped[-1] == '"' else stripped
    raise TypeError(f"dtype must be int, float, bool or str, got {dtype!r}")
