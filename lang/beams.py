"""`gen(num_beams=k, ...)`: beam search in a program, one model call whose returned beams, best first, are the
answers (the variable holds the best one's text, or with `num_return_sequences > 1` the list of them).

The beam options travel in the gen's spec as the `SamplingParams` fields of their names, so every backend sends
them as it sends any option (the engine's object, the native `sampling_params`, OpenAI's extra fields). They are
always set in a `BeamGenSpec`, never None: a run's defaults fill only unset fields, so they never touch them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from radixgen.lang.backend import GenResult, ModelCallError
from radixgen.lang.spec import GenSpec
from radixgen.runtime.sampling_params import GREEDY_TEMPERATURE


@dataclass(frozen=True)
class BeamGenSpec(GenSpec):
    """A gen's options with a beam search: `num_beams` (> 1) beams, `num_return_sequences` of them returned."""

    num_beams: int = 2
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    num_return_sequences: int = 1
    no_repeat_ngram_size: int = 0


@dataclass(frozen=True)
class BeamArgs:
    """gen()'s beam arguments as given (None: not given)."""

    num_beams: int | None = None
    length_penalty: float | None = None
    early_stopping: bool | str | None = None
    num_return_sequences: int | None = None
    no_repeat_ngram_size: int | None = None

    @property
    def searches(self) -> bool:
        return self.num_beams is not None and self.num_beams != 1


def beam_spec(spec: GenSpec, args: BeamArgs, n: int | None, best_of: int | None) -> BeamGenSpec:
    """The spec of a beam-search gen: `spec`'s options (temperature 0 unless given, and then it must be 0) and
    the beam options, checked against SamplingParams' rules now rather than at the model call. `n`, if given,
    is the number of returned beams, as `num_return_sequences` is."""
    if not isinstance(args.num_beams, int) or isinstance(args.num_beams, bool) or args.num_beams < 1:
        raise ValueError(f"gen(num_beams=...) must be a positive int, got {args.num_beams!r}")
    if best_of is not None:
        raise ValueError("gen(best_of=...) does not combine with num_beams: a beam search returns its best beams "
                         "(num_return_sequences=)")
    if spec.temperature is not None and spec.temperature >= GREEDY_TEMPERATURE:
        raise ValueError(f"gen(num_beams=...) needs temperature 0 (beam search is deterministic), got "
                         f"{spec.temperature}")
    if spec.return_logprob:
        raise ValueError("gen(num_beams=...) does not return token logprobs: each beam's meta info has its "
                         "beam_score and cumulative_logprob")
    returned = args.num_return_sequences if args.num_return_sequences is not None else (n or 1)
    if n is not None and args.num_return_sequences is not None and n != args.num_return_sequences:
        raise ValueError(f"gen(n={n}) and num_return_sequences={args.num_return_sequences} disagree: give one")
    given = {f.name: getattr(spec, f.name) for f in fields(GenSpec)}
    out = BeamGenSpec(**{**given, "temperature": 0.0}, num_beams=args.num_beams,
                      length_penalty=1.0 if args.length_penalty is None else args.length_penalty,
                      early_stopping=False if args.early_stopping is None else args.early_stopping,
                      num_return_sequences=returned,
                      no_repeat_ngram_size=args.no_repeat_ngram_size or 0)
    out.to_sampling_params()  # raises SamplingParamsError (a ValueError) naming the field
    return out


def check_no_beam_args(args: BeamArgs) -> None:
    """Beam options without a beam search (num_beams > 1) would change nothing: refused, naming the first."""
    for f in fields(BeamArgs):
        if f.name != "num_beams" and getattr(args, f.name) is not None:
            raise ValueError(f"gen({f.name}=...) is a beam search option: give num_beams > 1 too")


def beam_answers(results: Sequence[GenResult | Exception], expected: int) -> list[GenResult]:
    """A beam search's answers from the backend's one call (one result per returned beam, best first)."""
    for result in results:
        if isinstance(result, Exception):
            raise result
    answers = [r for r in results if isinstance(r, GenResult)]
    if len(answers) != expected:
        raise ModelCallError(f"the backend returned {len(answers)} answers for a beam search returning {expected}")
    return answers
