"""The primitives a program appends: `gen`, `gen_int`, `gen_string`, `select`, and the chat roles.

Names and arguments follow SGLang's frontend language, so `import radixgen as sgl` runs programs written for
it; `grammar=` (Lark or EBNF text) is radixgen's addition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from radixgen.grammars.constraint import Constraint
from radixgen.lang.beams import BeamArgs, beam_spec, check_no_beam_args
from radixgen.lang.choices import check_method
from radixgen.lang.expr import Expr, ExprList, Gen, RoleBegin, RoleEnd, Select, check_choices, role_expr
from radixgen.lang.schema import schema_text
from radixgen.lang.spec import DTYPE_NAMES, DTYPE_REGEX, GenSpec, grammar_constraint, stop_strings, token_ids
from radixgen.lang.tools import GenTools, ToolLike, tools_constraint


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | str | None = None,
    choices: Sequence[str] | None = None,
    choices_method: str | None = None,
    regex: str | None = None,
    json_schema: Any | None = None,
    grammar: str | None = None,
    tools: Sequence[ToolLike] | None = None,
    tool_choice: str | Mapping[str, Any] = "auto",
    tool_format: str = "hermes",
    parallel_tool_calls: bool = True,
    best_of: int | None = None,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    early_stopping: bool | str | None = None,
    num_return_sequences: int | None = None,
    no_repeat_ngram_size: int | None = None,
    penalty_alpha: float | None = None,
    json_schema_infer_types: bool = True,
) -> Expr:
    """Generate a span named `name`. With `choices` it is a `select`; at most one of regex / json_schema /
    grammar / dtype constrains the output. `n > 1` samples n answers after the same text: the variable holds
    the list, the text continues with the first; `best_of > n` samples best_of answers and keeps the n of
    highest cumulative logprob, best first (vLLM's `best_of`). `num_beams > 1` runs a beam search
    (transformers' `length_penalty`, `early_stopping`, `no_repeat_ngram_size`; temperature 0): the variable holds
    the best beam's text, or with `num_return_sequences` (or `n`) > 1 the list of the best beams, best first, the
    text continuing with the best. `penalty_alpha > 0` with `top_k > 1` runs a contrastive search (temperature
    0 unless given). `json_schema_infer_types=False` compiles `json_schema` as its exact language (no type
    inferred for a schema without `type`). `logprob_start_len` and `return_text_in_logprobs`
    are accepted so that SGLang programs run unchanged; a gen's logprobs always start at its first generated
    token.

    With `tools` (FunctionSpecs or OpenAI tool dicts) the output is constrained to calls of them in
    `tool_format` once it opens a call (`tool_choice` "auto"), or at once ("required", or a function's name);
    `s.get_meta_info(name)` then holds `tool_calls` ([{name, arguments}]) and `content`."""
    if choices is not None:
        return select(name, choices, temperature or 0.0, choices_method or "token_length_normalized")
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ValueError(f"gen(n=...) must be a positive int, got {n!r}")
    if best_of is not None and (not isinstance(best_of, int) or best_of < (n or 1)):
        raise ValueError(f"gen(best_of=...) must be an int >= n ({n or 1}), got {best_of!r}")
    if isinstance(dtype, str):
        if dtype not in DTYPE_NAMES:
            raise TypeError(f"dtype must be one of {sorted(DTYPE_NAMES)}; got {dtype!r}")
        dtype = DTYPE_NAMES[dtype]
    given = [k for k, v in (("regex", regex), ("json_schema", json_schema), ("grammar", grammar),
                            ("dtype", dtype), ("tools", tools)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"gen takes at most one of regex/json_schema/grammar/dtype/tools, got {given}")
    if not json_schema_infer_types and json_schema is None:
        raise ValueError("gen(json_schema_infer_types=False) applies to a json_schema constraint, and none is given")
    constraint: Constraint | None = None
    gen_tools: GenTools | None = None
    if tools is not None:
        constraint, gen_tools = tools_constraint(tools, tool_choice, tool_format, parallel_tool_calls)
    elif regex is not None:
        constraint = Constraint("regex", regex)
    elif json_schema is not None:
        constraint = Constraint("json_schema", schema_text(json_schema), infer_types=json_schema_infer_types)
    elif grammar is not None:
        constraint = grammar_constraint(grammar)
    elif dtype is not None:
        if dtype not in DTYPE_REGEX:
            raise TypeError(f"dtype must be one of int, float, bool, str; got {dtype!r}")
        constraint = Constraint("regex", DTYPE_REGEX[dtype])
    if penalty_alpha and temperature is None:
        temperature = 0.0  # contrastive search is deterministic: a run's default temperature does not apply
    spec = GenSpec(
        max_new_tokens=max_tokens, min_new_tokens=min_tokens, stop=stop_strings(stop),
        stop_token_ids=token_ids(stop_token_ids), temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, ignore_eos=ignore_eos,
        return_logprob=return_logprob, top_logprobs_num=top_logprobs_num, constraint=constraint,
        penalty_alpha=penalty_alpha,
    )
    beams = BeamArgs(num_beams, length_penalty, early_stopping, num_return_sequences, no_repeat_ngram_size)
    if beams.searches:
        beam = beam_spec(spec, beams, n, best_of)
        return Gen(name, beam, dtype, beam.num_return_sequences, gen_tools)
    check_no_beam_args(beams)
    return Gen(name, spec, dtype, n or 1, gen_tools, best_of)


def gen_int(name: str | None = None, **kwargs: Any) -> Expr:
    """An integer (decoded under an integer regex, stored as `int`)."""
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> Expr:
    """A double-quoted string of letters, digits and whitespace, SGLang's REGEX_STR (stored without the quotes)."""
    return gen(name, dtype=str, **kwargs)


def select(
    name: str | None = None,
    choices: Sequence[str] | None = None,
    temperature: float = 0.0,
    choices_method: str = "token_length_normalized",
) -> Expr:
    """Choose among `choices` by scoring each after the current text, in one batched prefill."""
    return Select(name, check_choices(choices), float(temperature), check_method(choices_method))


def system(expr: Any | None = None) -> ExprList:
    return role_expr("system", expr)


def user(expr: Any | None = None) -> ExprList:
    return role_expr("user", expr)


def assistant(expr: Any | None = None) -> ExprList:
    return role_expr("assistant", expr)


def system_begin() -> Expr:
    return RoleBegin("system")


def system_end() -> Expr:
    return RoleEnd("system")


def user_begin() -> Expr:
    return RoleBegin("user")


def user_end() -> Expr:
    return RoleEnd("user")


def assistant_begin() -> Expr:
    return RoleBegin("assistant")


def assistant_end() -> Expr:
    return RoleEnd("assistant")


def image(_path: Any) -> Expr:
    """SGLang's `sgl.image`: refused, radixgen runs text-only models."""
    raise NotImplementedError("sgl.image is not supported: radixgen runs text-only models")


def video(_path: Any, _num_frames: int = 0) -> Expr:
    """SGLang's `sgl.video`: refused, radixgen runs text-only models."""
    raise NotImplementedError("sgl.video is not supported: radixgen runs text-only models")
