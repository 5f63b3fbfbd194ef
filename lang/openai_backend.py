"""`OpenAICompatible(base_url, model)`: programs on any server speaking OpenAI's `/v1/completions`.

The program's text is sent as a raw completion prompt, so chat roles need the model's role text: give
`role_template=` (e.g. `chat_template.CHATML`); there is no portable way to ask an OpenAI server for it.
Constraints travel as extra body fields (`regex`, `json_schema`, `ebnf`, `grammar`), which radixgen, SGLang and
vLLM servers accept; others answer with an error, reported as such. `select` needs `echo` with `logprobs`
(prompt-token logprobs); servers without it get a clear error. There is no cache to prefill.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from radixgen.lang.backend import Backend, GenResult, ModelCallError, SelectResult, StreamDelta
from radixgen.lang.chat_template import RoleTemplate
from radixgen.lang.choices import check_method, decide, needs_unconditional
from radixgen.lang.http import HttpClient
from radixgen.lang.spec import GenSpec
from radixgen.runtime.sampling_params import OPENAI_NAMES


class OpenAICompatible(Backend):
    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 role_template: RoleTemplate | None = None, timeout: float = 600.0) -> None:
        self.http = HttpClient(base_url, api_key, timeout)
        self.model = model
        self._template = role_template

    def _body(self, prompt: str | list[str], spec: GenSpec) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "prompt": prompt}
        for key, value in spec.sampling_params().items():
            if key == "json_schema" and isinstance(value, str):
                value = json.loads(value)
            body[OPENAI_NAMES.get(key, key)] = value  # the rest go as the same-named extra fields
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
        out = self.http.post("/completions", self._body(prompt, spec))
        choice = out["choices"][0]
        return GenResult(choice["text"], self._meta(choice, out.get("usage")))

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
