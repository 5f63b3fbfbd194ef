"""`OpenAICompatible(base_url, model)`: programs on any server speaking OpenAI's `/v1/completions`.

The program's text is sent as a raw completion prompt, so chat roles need the model's role text: give
`role_template=` (e.g. `chat_template.CHATML`); there is no portable way to ask an OpenAI server for it.
Constraints travel as extra body fields (`regex`, `json_schema`, `ebnf`, `grammar`), which radixgen, SGLang and
vLLM servers accept; others answer with an error, reported as such. `select` needs `echo` with `logprobs`
(prompt-token logprobs); servers without it get a clear error. There is no cache to prefill. A beam search
(`gen(num_beams=...)`) goes in vLLM's form, `use_beam_search` with `n` and `best_of` (`_beam_fields`); its beams
come back as the choices, without scores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixgen.lang.backend import Backend, GenResult, ModelCallError, SelectResult, StreamDelta
from radixgen.lang.chat_template import RoleTemplate
from radixgen.lang.choices import check_method, decide, needs_unconditional
from radixgen.lang.http import HttpClient
from radixgen.lang.spec import GenSpec
from radixgen.runtime.sampling_params import OPENAI_NAMES


def _beam_fields(options: dict[str, Any]) -> dict[str, Any]:
    """Takes the beam options out of `options` and gives their OpenAI-server form: vLLM's `use_beam_search`, `n`
    beams returned of `best_of` (the width; left out when every beam is returned, the width current vLLM takes
    from `n`), `length_penalty` and `early_stopping` when not the defaults, and radixgen's
    `no_repeat_ngram_size` when set. Empty without a beam search."""
    width = options.pop("num_beams", 1)
    returned = options.pop("num_return_sequences", None) or 1
    length_penalty = options.pop("length_penalty", 1.0)
    early_stopping = options.pop("early_stopping", False)
    ngram = options.pop("no_repeat_ngram_size", 0)
    if width <= 1:
        return {}
    fields: dict[str, Any] = {"use_beam_search": True, "n": returned}
    if width != returned:
        fields["best_of"] = width
    if length_penalty != 1.0:
        fields["length_penalty"] = length_penalty
    if early_stopping is not False:
        fields["early_stopping"] = early_stopping
    if ngram:
        fields["no_repeat_ngram_size"] = ngram
    return fields


class OpenAICompatible(Backend):
    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 role_template: RoleTemplate | None = None, timeout: float = 600.0) -> None:
        self.http = HttpClient(base_url, api_key, timeout)
        self.model = model
        self._template = role_template

    def _body(self, prompt: str | list[str], spec: GenSpec) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "prompt": prompt}
        options = spec.sampling_params()
        beams = _beam_fields(options)
        for key, value in options.items():
            if key == "json_schema" and isinstance(value, str):
                value = json.loads(value)
            body[OPENAI_NAMES.get(key, key)] = value  # the rest go as the same-named extra fields
        body.update(beams)
        if spec.return_logprob:
            body["logprobs"] = max(1, spec.top_logprobs_num or 0)
        return body

    @staticmethod
    def _meta(choice: dict[str, Any], usage: dict[str, Any] | None) -> dict[str, Any]:
        usage = usage or {}
        details = usage.get("prompt_tokens_details") or {}
        return {
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "cached_tokens": details.get("cached_tokens"),
            "finish_reason": {"type": choice.get("finish_reason") or "stop"},
            "logprobs": choice.get("logprobs"),
        }

    def generate(self, prompt: str, spec: GenSpec) -> GenResult:
        return self._choices(prompt, spec)[0]

    def generate_batch(self, prompts: Sequence[str], specs: Sequence[GenSpec]) -> list[GenResult | Exception]:
        """One result per returned choice, prompt after prompt (a beam search returning several beams gives them
        all, best first); a failed request is its exception, in place."""
        def one(i: int) -> list[GenResult | Exception]:
            try:
                return list(self._choices(prompts[i], specs[i]))
            except ModelCallError as exc:
                return [exc]

        with ThreadPoolExecutor(max_workers=max(1, min(32, len(prompts)))) as pool:
            return [result for results in pool.map(one, range(len(prompts))) for result in results]

    def _choices(self, prompt: str, spec: GenSpec) -> list[GenResult]:
        """Every choice of one completion, in index order."""
        out = self.http.post("/completions", self._body(prompt, spec))
        choices = sorted(out["choices"], key=lambda c: c.get("index", 0))
        return [GenResult(c["text"], self._meta(c, out.get("usage"))) for c in choices]

    def stream(self, prompt: str, spec: GenSpec) -> Iterator[StreamDelta]:
        body = self._body(prompt, spec)
        body.update(stream=True, stream_options={"include_usage": True})
        usage, last_choice = None, {}
        for event in self.http.post_events("/completions", body):
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                last_choice = choice
                if choice.get("text"):
                    yield StreamDelta(choice["text"])
        yield StreamDelta("", True, self._meta(last_choice, usage))

    def _prompt_logprobs(self, prompts: list[str], offsets: list[int]) -> list[list[float]]:
        """Logprobs of each prompt's tokens that end after character `offsets[i]` (echo + logprobs, no output)."""
        body = {"model": self.model, "prompt": prompts, "max_tokens": 0, "echo": True, "logprobs": 1}
        try:
            out = self.http.post("/completions", body)
        except ModelCallError as exc:
            raise ModelCallError(
                f"select needs prompt logprobs (echo=true with logprobs, max_tokens=0), which this server refused: "
                f"{exc}"
            ) from None
        result: list[list[float]] = [[] for _ in prompts]
        for choice in out["choices"]:
            lp = choice.get("logprobs") or {}
            tokens, values, starts = lp.get("tokens"), lp.get("token_logprobs"), lp.get("text_offset")
            if tokens is None or values is None or starts is None:
                raise ModelCallError("select needs token_logprobs and text_offset in echoed logprobs; "
                                     "this server does not return them")
            i = choice.get("index", 0)
            result[i] = [v for t, v, s in zip(tokens, values, starts)
                         if v is not None and s + len(t) > offsets[i]]
        return result

    def select(self, prompt: str, choices: Sequence[str], method: str, temperature: float = 0.0) -> SelectResult:
        check_method(method)
        cond = self._prompt_logprobs([prompt + c for c in choices], [len(prompt)] * len(choices))
        uncond = self._prompt_logprobs(list(choices), [0] * len(choices)) if needs_unconditional(method) else None
        if uncond is not None:  # the first token of a bare choice has no logprob: compare the rest
            cond_tail = [c[len(c) - len(u):] if u else c for c, u in zip(cond, uncond)]
            scores = decide(method, cond_tail, [u or [0.0] * len(c) for u, c in zip(uncond, cond_tail)], temperature)
        else:
            scores = decide(method, cond, None, temperature)
        return SelectResult(choices[scores.index], scores.meta_info())

    def role_template(self) -> RoleTemplate:
        if self._template is None:
            raise ModelCallError(
                "OpenAICompatible sends raw completion prompts, so chat roles need the model's role text: pass "
                "role_template= (e.g. radixgen.lang.chat_template.CHATML for ChatML models)"
            )
        return self._template
