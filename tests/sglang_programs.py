"""SGLang's own frontend test file (`sglang/test/test_programs.py` of the sglang 0.4.10.post2 wheel, a dev
dependency) as two test modules use it: which of its functions run, which are skipped and why, and how one is
called. test_sglang_programs.py runs them against `import radixgen as sgl` in process; test_sglang_endpoint.py
runs them with SGLang's own `RuntimeEndpoint` (CappedEndpoint) against a radixgen server, in process for the
installed 0.4.10 and through `outcome` in a subprocess for the 0.5 wheel.
"""

from __future__ import annotations

import inspect
import types
import warnings

import pytest

sglang = pytest.importorskip("sglang", reason="the sglang frontend (dev extra) is missing")
programs = pytest.importorskip("sglang.test.test_programs", reason="the sglang frontend (dev extra) is missing")

SKIPPED = {  # skipped by both modules (docs/language.md's compatibility table says the same)
    "test_image_qa": "needs an image (radixgen runs text-only models; sgl.image refuses)",
    "test_hellaswag_select": "downloads a data set",
    "test_gen_min_new_tokens": "needs SGLang's runtime (sglang.srt) for its tokenizer",
    "test_completion_speculative": "API speculative execution (num_api_spec_tokens) for OpenAI backends only",
}
# These assert answers the default 135M model gets wrong ("New York", "24000...", "linux"): a failure of that
# function's own assert statement is expected of them (an xfail); any other error still fails.
WRONG_ANSWERS = frozenset({"test_few_shot_qa", "test_decode_int", "test_react"})
ENDPOINT_SKIPPED = {  # skipped where SGLang's own RuntimeEndpoint is the backend
    **SKIPPED,
    "test_chat_completion_speculative": "SGLang's RuntimeEndpoint cannot run API speculative execution itself "
                                        "(its interpreter reads backend.is_chat_model, which only OpenAI has)",
}
ENDPOINT_MAX_TOKENS = 8  # enough for test_tool_use's expression ("257*983") and the dtype/regex gens to close
# SGLang's interpreter reports an error inside a program as this warning and goes on (the variable is then
# missing); a run that emits it fails with the warning's text.
EXECUTOR_ERROR = "Error in stream_executor"


def selected(skipped: dict[str, str]) -> list[str]:
    """The test functions of SGLang's file that are not in `skipped`, sorted by name."""
    assert set(skipped) <= set(vars(programs)), "a skipped name is not in SGLang's test file"
    return sorted(name for name, fn in vars(programs).items()
                  if name.startswith("test_") and inspect.isfunction(fn) and name not in skipped)


def _fails_its_own_assert(name: str, exc: AssertionError) -> bool:
    """Whether `exc` was raised by an assert statement in the body of SGLang's test function `name`."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_name == name and \
        tb.tb_frame.f_code.co_filename == programs.__file__


def run_program(module: types.ModuleType, name: str) -> None:
    """Call SGLang's test function `name` of `module` (`check_answer=False` where it has that flag); an xfail
    when a WRONG_ANSWERS function fails its own answer assert, a failure when SGLang's interpreter reported an
    error it swallowed."""
    fn = getattr(module, name)
    kwargs = {"check_answer": False} if "check_answer" in inspect.signature(fn).parameters else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn(**kwargs)
            error: Exception | None = None
        except Exception as exc:
            error = exc
    swallowed = [str(w.message) for w in caught if EXECUTOR_ERROR in str(w.message)]
    if swallowed:
        pytest.fail(f"SGLang's interpreter reported: {swallowed[0]}\nthen: {error!r}", pytrace=False)
    if isinstance(error, AssertionError) and name in WRONG_ANSWERS and _fails_its_own_assert(name, error):
        first_line = str(error).partition("\n")[0]
        pytest.xfail(f"asserts an answer the default 135M model gets wrong: {first_line}")
    if error is not None:
        raise error


def outcome(name: str) -> str:
    """"passed", "xfailed" or "failed: <why>" of SGLang's test function `name`, for a run outside pytest."""
    try:
        run_program(programs, name)
    except pytest.xfail.Exception:
        return "xfailed"
    except BaseException as exc:  # pytest.fail's exception is a BaseException
        return f"failed: {type(exc).__name__}: {exc}"[:3000]
    return "passed"


class CappedEndpoint(sglang.RuntimeEndpoint):
    """SGLang's RuntimeEndpoint with every generation's `max_new_tokens` (an SglSamplingParams field) capped at
    ENDPOINT_MAX_TOKENS, so the programs' 128- and 512-token gens stay quick."""

    def generate(self, s, sampling_params):
        return super().generate(s, self._capped(sampling_params))

    def generate_stream(self, s, sampling_params):
        return super().generate_stream(s, self._capped(sampling_params))

    @staticmethod
    def _capped(params):
        params.max_new_tokens = min(params.max_new_tokens or ENDPOINT_MAX_TOKENS, ENDPOINT_MAX_TOKENS)
        return params
