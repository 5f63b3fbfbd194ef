"""SamplingParams: the per-request sampling and stopping options, with SGLang's names and defaults.

The dataclass is the one table of sampling options: their names, defaults and checks. The server's known keys,
the language's option passing and the engine's parsing all read it (`FIELD_NAMES`), and a request's options are
parsed into one SamplingParams that travels to the engine as the object.

Every instance is valid: `__post_init__` normalises (`stop` becomes a tuple of strings, `stop_token_ids` a
tuple of ints, `logit_bias` a dict with int keys) and refuses bad values with a `SamplingParamsError` (a
ValueError) whose message names the field. `from_dict` additionally refuses unknown keys. Checks that need the
vocabulary (token ids in range) live in `validate(vocab_size)`, which the engine calls once it knows the
tokenizer.

Semantics of the special values (kept from SGLang so user code ports unchanged):
    temperature == 0      greedy (argmax); so is any temperature below 1e-6
    top_k <= 0            no top-k truncation (SGLang's default is -1; 0 is accepted as "off" too)
    top_p == 1, min_p == 0  no truncation
    max_new_tokens None   no limit other than the context length
    best_of None          n samples, all returned (best_of > n: the n of highest cumulative logprob)
    num_beams > 1         beam search (transformers' semantics, greedy only); the `num_return_sequences` best
                          finished beams are returned (None: n of them)
    penalty_alpha > 0     contrastive search among the top_k candidates (top_k > 1, temperature 0)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import regex

from radixgen.grammars.constraint import CONSTRAINT_KINDS, Constraint, json_schema_constraint

GREEDY_TEMPERATURE = 1e-6  # temperatures below this decode greedily


class SamplingParamsError(ValueError):
    """An invalid sampling option; the message starts with (or names) the offending field."""


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()  # accepts str | list[str] | None; stored as a tuple
    stop_token_ids: tuple[int, ...] = ()  # accepts list[int] | None; stored as a tuple
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    seed: int | None = None
    n: int = 1
    # Samples generated per prompt, of which the n with the highest cumulative logprob are returned (None: n).
    best_of: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)  # accepts {int | "int": float} | None
    # The constraint fields, one per grammars.CONSTRAINT_KINDS (at most one is set).
    regex: str | None = None
    json_schema: str | dict[str, Any] | None = None
    ebnf: str | None = None
    grammar: str | None = None
    # JSON Schema: False compiles the exact language (no type inferred from a schema's keywords; grammars docs)
    json_schema_infer_types: bool = True
    no_stop_trim: bool = False
    # Regexes (Python `regex` syntax) matched against the output text; accepts str | list[str] | None.
    stop_regex: tuple[str, ...] = ()
    # Reasoning models: output tokens allowed before the thinking section closes (the output starts inside it, as
    # the template or the model opens it); when spent, the engine appends `</think>` itself (None: no budget).
    thinking_budget: int | None = None
    # Beam search (transformers' names and meanings): beams, length_penalty (finished scores are sum logprob /
    # length ** length_penalty), early_stopping (True | False | "never"), how many finished beams are returned
    # (None: n), and n-grams no beam may repeat (0: off).
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    num_return_sequences: int | None = None
    no_repeat_ngram_size: int = 0
    # Contrastive search (transformers' names): with penalty_alpha > 0 and top_k > 1, each step picks among the
    # top_k tokens the one maximising (1 - penalty_alpha) * p - penalty_alpha * (its hidden state's largest
    # cosine similarity to the earlier positions'); deterministic, so it needs temperature 0.
    penalty_alpha: float = 0.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise through object.__setattr__
        set_(self, "stop", _normalise_stop(self.stop))
        set_(self, "stop_regex", _normalise_stop_regex(self.stop_regex))
        set_(self, "stop_token_ids", _normalise_token_ids("stop_token_ids", self.stop_token_ids))
        set_(self, "logit_bias", _normalise_logit_bias(self.logit_bias))
        self._check_values()

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_dict(cls, d: dict[str, Any] | SamplingParams | None) -> SamplingParams:
        """Build from a request's `sampling_params` dict, refusing unknown keys (with the known ones listed);
        a SamplingParams is returned as it is.

        Keys whose value is None take the default, as in SGLang's JSON API.
        """
        if d is None:
            return cls()
        if isinstance(d, SamplingParams):
            return d
        if not isinstance(d, dict):
            raise SamplingParamsError(f"sampling_params must be a dict, got {type(d).__name__}")
        unknown = sorted(k for k in d if k not in FIELD_NAMES)
        if unknown:
            raise SamplingParamsError(f"sampling_params: unknown key(s) {unknown}; known keys: {sorted(FIELD_NAMES)}")
        kwargs = {k: v for k, v in d.items() if v is not None or k in _NONE_IS_A_VALUE}
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict that `from_dict` turns back into an equal SamplingParams."""
        out = dataclasses.asdict(self)
        out["stop"] = list(self.stop)
        out["stop_token_ids"] = list(self.stop_token_ids)
        out["stop_regex"] = list(self.stop_regex)
        return out

    def validate(self, vocab_size: int) -> None:
        """Checks that need the vocabulary: every token id named by the request is in [0, vocab_size)."""
        for tid in self.stop_token_ids:
            if tid >= vocab_size:
                raise SamplingParamsError(f"stop_token_ids: token id {tid} is out of range for vocab size {vocab_size}")
        for tid in self.logit_bias:
            if tid >= vocab_size:
                raise SamplingParamsError(f"logit_bias: token id {tid} is out of range for vocab size {vocab_size}")

    # ---------------------------------------------------------------- derived views

    @property
    def is_greedy(self) -> bool:
        """Argmax decoding: temperature 0 (or below 1e-6, which would overflow float32 logits / T; SGLang's
        rule), or top_k == 1."""
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def constraint(self) -> Constraint | None:
        """The structural constraint, if any (at most one is allowed); a JSON Schema dict as compact JSON text."""
        for kind in CONSTRAINT_KINDS:
            value = getattr(self, kind)
            if value is not None:
                if kind == "json_schema":
                    return json_schema_constraint(value, self.json_schema_infer_types)
                return Constraint(kind, value)
        return None

    @property
    def is_beam_search(self) -> bool:
        return self.num_beams > 1

    @property
    def is_contrastive(self) -> bool:
        return self.penalty_alpha > 0.0 and self.top_k > 1

    @property
    def search_width(self) -> int:
        """Engine requests a search runs for this one (its beams, or its contrastive candidates); 1 otherwise."""
        return self.num_beams if self.is_beam_search else self.top_k if self.is_contrastive else 1

    @property
    def beams_returned(self) -> int:
        """Finished beams a beam search returns: `num_return_sequences`, or `n` without it."""
        return self.n if self.num_return_sequences is None else self.num_return_sequences

    @property
    def num_samples(self) -> int:
        """Engine requests per prompt: one for a beam search (its beams are the engine's), else `best_of`, or
        `n` without it."""
        if self.is_beam_search:
            return 1
        return self.n if self.best_of is None else self.best_of

    @property
    def picks_best(self) -> bool:
        """Whether only the n best of more samples are returned (best_of > n)."""
        return self.num_samples > self.n

    def expand_n(self) -> list[SamplingParams]:
        """The `num_samples` single-sample requests this one stands for: sample i keeps the options, with n=1
        and, when seeded, seed + i (so the samples differ yet each stays reproducible)."""
        if self.is_beam_search:
            return [self]
        return [dataclasses.replace(self, n=1, best_of=None, seed=None if self.seed is None else self.seed + i)
                for i in range(self.num_samples)]

    @property
    def max_stop_len(self) -> int:
        """Length in characters of the longest stop string (0 without stop strings)."""
        return max((len(s) for s in self.stop), default=0)

    # ---------------------------------------------------------------- checks

    def _check_values(self) -> None:
        if self.thinking_budget is not None:
            _check_int("thinking_budget", self.thinking_budget, low=0)
        if self.max_new_tokens is not None:
            _check_int("max_new_tokens", self.max_new_tokens, low=0)
        _check_int("min_new_tokens", self.min_new_tokens, low=0)
        if self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise SamplingParamsError(f"min_new_tokens ({self.min_new_tokens}) must not exceed max_new_tokens "
                             f"({self.max_new_tokens})")
        _check_float("temperature", self.temperature)
        if self.temperature < 0:
            raise SamplingParamsError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        _check_float("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingParamsError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k, low=-1, hint="(-1 or 0 = off)")
        _check_float("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise SamplingParamsError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            _check_float(name, value)
            if not -2.0 <= value <= 2.0:
                raise SamplingParamsError(f"{name} must be in [-2, 2], got {value}")
        _check_float("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise SamplingParamsError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}")
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
                     "json_schema_infer_types"):
            if not isinstance(getattr(self, name), bool):
                raise SamplingParamsError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.seed is not None:
            _check_int("seed", self.seed)
        _check_int("n", self.n, low=1)
        if self.best_of is not None:
            self._check_best_of(self.best_of)
        for name in CONSTRAINT_KINDS:
            value = getattr(self, name)
            if name != "json_schema" and value is not None and not isinstance(value, str):
                raise SamplingParamsError(f"{name} must be a string, got {type(value).__name__}")
        if self.json_schema is not None and not isinstance(self.json_schema, (str, dict)):
            raise SamplingParamsError(f"json_schema must be a string or a dict, got {type(self.json_schema).__name__}")
        self._check_beam_search()
        self._check_contrastive()
        given = [k for k in CONSTRAINT_KINDS if getattr(self, k) is not None]
        if len(given) > 1:
            raise SamplingParamsError(f"{given[1]}: at most one constraint ({', '.join(CONSTRAINT_KINDS)}) per "
                                      f"request, got {given}")

    def _check_best_of(self, best_of: int) -> None:
        """vLLM's rules: best_of >= n, and 1 under greedy decoding (every sample would be the same)."""
        _check_int("best_of", best_of, low=1)
        if best_of < self.n:
            raise SamplingParamsError(f"best_of must be >= n, got n={self.n} and best_of={best_of}")
        if best_of > 1 and self.is_greedy:
            raise SamplingParamsError(f"best_of must be 1 with greedy decoding (temperature 0 or top_k 1), got "
                                      f"{best_of}: every sample would be the same")

    def _check_contrastive(self) -> None:
        """penalty_alpha's range, and what contrastive search cannot be combined with."""
        _check_float("penalty_alpha", self.penalty_alpha)
        if not 0.0 <= self.penalty_alpha <= 1.0:
            raise SamplingParamsError(f"penalty_alpha must be in [0, 1] (0 = off), got {self.penalty_alpha}")
        if self.penalty_alpha == 0.0:
            return
        if self.top_k <= 1:
            raise SamplingParamsError(f"penalty_alpha > 0 (contrastive search) needs top_k > 1 candidates, got "
                                      f"top_k={self.top_k}")
        if self.is_beam_search:
            raise SamplingParamsError("penalty_alpha (contrastive search) and num_beams > 1 (beam search) exclude "
                                      "each other")
        refused = [name for name, off in (("temperature", self.temperature < GREEDY_TEMPERATURE),
                                          ("n", self.n == 1), ("best_of", self.best_of is None),
                                          ("frequency_penalty", self.frequency_penalty == 0.0),
                                          ("presence_penalty", self.presence_penalty == 0.0),
                                          ("repetition_penalty", self.repetition_penalty == 1.0),
                                          ("logit_bias", not self.logit_bias),
                                          ("thinking_budget", self.thinking_budget is None)) if not off]
        if refused:
            raise SamplingParamsError(f"{refused[0]} is not supported with contrastive search (penalty_alpha > 0): "
                                      f"it is deterministic (temperature 0, one sequence) and ranks the model's "
                                      f"own probabilities")

    def _check_beam_search(self) -> None:
        """The beam options' values, and what beam search cannot be combined with (transformers' and vLLM's
        refusals: it is deterministic; it returns at most num_beams sequences)."""
        _check_int("num_beams", self.num_beams, low=1)
        _check_float("length_penalty", self.length_penalty)
        if self.early_stopping not in (True, False, "never"):
            raise SamplingParamsError(f"early_stopping must be true, false or \"never\", got {self.early_stopping!r}")
        _check_int("no_repeat_ngram_size", self.no_repeat_ngram_size, low=0)
        if self.num_return_sequences is not None:
            _check_int("num_return_sequences", self.num_return_sequences, low=1)
        if not self.is_beam_search:
            if self.num_return_sequences is not None and self.num_return_sequences != self.n:
                raise SamplingParamsError("num_return_sequences is for beam search (num_beams > 1); use n to ask "
                                          "for several samples")
            return
        returned = self.beams_returned
        if returned > self.num_beams:
            raise SamplingParamsError(f"beam search returns at most num_beams sequences: asked for {returned} "
                                      f"(n / num_return_sequences) with num_beams={self.num_beams}")
        if self.num_return_sequences is not None and self.n not in (1, self.num_return_sequences):
            raise SamplingParamsError(f"n ({self.n}) and num_return_sequences ({self.num_return_sequences}) "
                                      f"disagree: with beam search give one of them")
        if self.temperature >= GREEDY_TEMPERATURE:
            raise SamplingParamsError(f"num_beams > 1 needs temperature 0: beam search is deterministic, got "
                                      f"temperature {self.temperature}")
        refused = [name for name, off in (("best_of", self.best_of is None), ("stop", not self.stop),
                                          ("stop_regex", not self.stop_regex), ("logit_bias", not self.logit_bias),
                                          ("frequency_penalty", self.frequency_penalty == 0.0),
                                          ("presence_penalty", self.presence_penalty == 0.0),
                                          ("repetition_penalty", self.repetition_penalty == 1.0),
                                          ("thinking_budget", self.thinking_budget is None)) if not off]
        if refused:
            raise SamplingParamsError(f"{refused[0]} is not supported with beam search (num_beams > 1); beams stop "
                                      f"at EOS, stop_token_ids and max_new_tokens, and may use "
                                      f"no_repeat_ngram_size, min_new_tokens and a constraint")


FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(SamplingParams))
# SamplingParams field -> its name in OpenAI's request bodies, where the two differ.
OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
# Keys for which an explicit None means something other than "use the default".
_NONE_IS_A_VALUE = frozenset({"max_new_tokens"})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: Any, low: int | None = None, hint: str = "") -> None:
    if not _is_int(value):
        raise SamplingParamsError(f"{name} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise SamplingParamsError(f"{name} must be >= {low}{' ' + hint if hint else ''}, got {value}")


def _check_float(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplingParamsError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise SamplingParamsError(f"{name} must be finite, got {value}")


def _string_list(name: str, value: Any) -> tuple[str, ...]:
    """None, a string, or a list of strings, as a tuple of strings."""
    if value is None:
        return ()
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise SamplingParamsError(f"{name} must be a string or a list of strings, got {type(value).__name__}")
    for item in items:
        if not isinstance(item, str):
            raise SamplingParamsError(f"{name} must be a string or a list of strings, got an item {item!r}")
    return tuple(items)


def _normalise_stop(stop: Any) -> tuple[str, ...]:
    items = _string_list("stop", stop)
    if not all(items):
        raise SamplingParamsError("stop: stop strings must be non-empty")
    return items


def _normalise_stop_regex(patterns: Any) -> tuple[str, ...]:
    items = _string_list("stop_regex", patterns)
    for pattern in items:
        try:
            compiled = regex.compile(pattern)
        except regex.error as exc:
            raise SamplingParamsError(f"stop_regex: invalid regex {pattern!r}: {exc}") from None
        if compiled.fullmatch("") is not None:
            raise SamplingParamsError(f"stop_regex: {pattern!r} matches the empty string (it would stop at once)")
    return items


def _normalise_token_ids(name: str, ids: Any) -> tuple[int, ...]:
    if ids is None:
        return ()
    if not isinstance(ids, (list, tuple)):
        raise SamplingParamsError(f"{name} must be a list of token ids, got {type(ids).__name__}")
    for tid in ids:
        if not _is_int(tid) or tid < 0:
            raise SamplingParamsError(f"{name} must hold non-negative integer token ids, got {tid!r}")
    return tuple(ids)


def _normalise_logit_bias(bias: Any) -> dict[int, float]:
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise SamplingParamsError(f"logit_bias must be a dict {{token_id: bias}}, got {type(bias).__name__}")
    out: dict[int, float] = {}
    for key, value in bias.items():
        if _is_int(key):
            tid = key
        elif isinstance(key, str) and key.strip().lstrip("-").isdigit():  # JSON object keys are strings
            tid = int(key)
        else:
            raise SamplingParamsError(f"logit_bias keys must be integer token ids, got {key!r}")
        if tid < 0:
            raise SamplingParamsError(f"logit_bias keys must be non-negative token ids, got {key!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise SamplingParamsError(f"logit_bias values must be numbers, got {value!r} for token {key!r}")
        if math.isinf(value) and value > 0:
            raise SamplingParamsError(f"logit_bias values must be finite or -inf (a ban), got {value!r} "
                                      f"for token {key!r}")
        out[tid] = float(value)
    return out
