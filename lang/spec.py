"""What one `gen` asks of the model: sampling options plus at most one constraint, in SGLang's names.

`GenSpec` fields left as `None` inherit the defaults a program is run with (`fn.run(max_new_tokens=...,
temperature=...)`), then the engine's own defaults. Its sampling fields are `SamplingParams` fields (the one
table of options); `to_sampling_params()` builds the engine's object, `sampling_params()` the JSON dict of
docs/engine_api.md that the HTTP backends send.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from radixgen.grammars.constraint import Constraint
from radixgen.runtime.sampling_params import FIELD_NAMES, SamplingParams

# Regexes of dtype-typed gens (`gen(dtype=int)`, `gen_int`, `gen_string`), SGLang's REGEX_INT/FLOAT/BOOL/STR
# exactly, so a program decodes the same language under both; the text is converted after.
DTYPE_REGEX: dict[type, str] = {
    int: r"[-+]?[0-9]+[ \n]*",
    float: r"[-+]?[0-9]*\.?[0-9]+[ \n]*",
    bool: r"(True|False)",
    str: r"\"[\w\d\s]*\"",
}
# SGLang also spells a dtype by its name.
DTYPE_NAMES: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}


def grammar_constraint(text: str) -> Constraint:
    """`gen(grammar=...)` accepts Lark or EBNF (GBNF) text; EBNF is recognised by its `::=` rules."""
    return Constraint("ebnf" if "::=" in text else "grammar", text)


def stop_strings(stop: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """SGLang's `stop` (one string or several) as a tuple; None stays unset."""
    if stop is None:
        return None
    return (stop,) if isinstance(stop, str) else tuple(stop)


def token_ids(ids: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if ids is None else tuple(ids)


@dataclass(frozen=True)
class GenSpec:
    """Every field but `return_logprob`, `top_logprobs_num` and `constraint` is the `SamplingParams` field of
    that name (None: unset)."""

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
    penalty_alpha: float | None = None
    return_logprob: bool | None = None
    top_logprobs_num: int | None = None
    constraint: Constraint | None = None

    def with_defaults(self, defaults: GenSpec | None) -> GenSpec:
        """Fill unset fields from `defaults` (the run-level options)."""
        if defaults is None:
            return self
        filled = {f.name: getattr(defaults, f.name) for f in fields(self) if getattr(self, f.name) is None}
        return replace(self, **filled)

    def _options(self) -> dict[str, Any]:
        """The set sampling options and the constraint, by SamplingParams field name."""
        options = {f.name: getattr(self, f.name) for f in fields(self)
                   if f.name in FIELD_NAMES and getattr(self, f.name) is not None}
        if self.constraint is not None:
            options[self.constraint.kind] = self.constraint.source
            if not self.constraint.infer_types:
                options["json_schema_infer_types"] = False
        return options

    def to_sampling_params(self) -> SamplingParams:
        """The engine's options: those set here over SamplingParams' defaults (raises SamplingParamsError)."""
        return SamplingParams(**self._options())

    def sampling_params(self) -> dict[str, Any]:
        """The `sampling_params` dict an HTTP backend sends; unset fields are left out so the server's defaults
        apply."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self._options().items()}


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
        return stripped.removeprefix('"').removesuffix('"')  # a span cut open by max_tokens has no closing quote
    raise TypeError(f"dtype must be int, float, bool or str, got {dtype!r}")
