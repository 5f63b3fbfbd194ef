"""`Endpoint(url)`: programs on a radixgen server through its native API (docs/engine_api.md, SGLang's shape).

- `POST /generate` with `text` (one or a list) or `input_ids`, `sampling_params`, `return_logprob`,
  `logprob_start_len`, `top_logprobs_num`, `stream` with `stream_delta` (server-sent events of delta chunks,
  then `[DONE]`).
- Roles: the chat template is rendered here, from `GET /get_model_info`'s `chat_template` (with `bos_token` and
  `add_bos_token` when given): roles need per-role begin/end text, which a chat completion cannot give.
- `select`: the prompt alone is prefilled first (its `prompt_tokens` places the scoring window and it caches
  the shared prefix), then all `prompt + choice` are scored in one call from a few tokens before the choices;
  the choice tokens are those after the windows' common token prefix.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from radixgen.lang.backend import Backend, GenResult, ModelCallError, SelectResult, StreamDelta
from radixgen.lang.chat_template import RoleTemplate, derive_role_template, jinja_renderer
from radixgen.lang.choices import check_method, decide, needs_unconditional, shared_prefix_len
from radixgen.lang.http import HttpClient
from radixgen.lang.spec import GenSpec

# Tokens before the prompt's end at which the scoring window opens: covers a last prompt token that merges
# with a choice's first characters.
WINDOW_SLACK = 4
UNCONDITIONAL_CONTEXT = 2


class Endpoint(Backend):
    def __init__(self, url: str, api_key: str | None = None, role_template: RoleTemplate | None = None,
                 timeout: float = 600.0) -> None:
        self.http = HttpClient(url, api_key, timeout)
        self._template = role_template

    def _body(self, spec: GenSpec, **extra: Any) -> dict[str, Any]:
        body = {"sampling_params": spec.sampling_params(), "return_logprob": bool(spec.return_logprob),
                "top_logprobs_num": spec.top_logprobs_num or 0}
        body.update(extra)
        return body

    def generate(self, prompt: str, spec: GenSpec) -> GenResult:
        out = self.http.post("/generate", self._body(spec, text=prompt))
        return GenResult(out["text"], out.get("meta_info", {}))

    def generate_batch(self, prompts: Sequence[str], specs: Sequence[GenSpec]) -> list[GenResult | Exception]:
        if not prompts:
            return []
        body = {"text": list(prompts), "sampling_params": [s.sampling_params() for s in specs],
                "return_logprob": any(s.return_logprob for s in specs),
                "top_logprobs_num": max((s.top_logprobs_num or 0) for s in specs)}
        try:
            outs = self.http.post("/generate", body)
        except ModelCallError:
            return super().generate_batch(prompts, specs)  # isolate the request the server refused
        return [GenResult(o["text"], o.get("meta_info", {})) for o in outs]

    def stream(self, prompt: str, spec: GenSpec) -> Iterator[StreamDelta]:
        body = self._body(spec, text=prompt, stream=True, stream_delta=True)  # each event: its new text only
        for chunk in self.http.post_events("/generate", body):
            yield StreamDelta(chunk.get("text", ""), bool(chunk.get("finished")), chunk.get("meta_info", {}))

    def cache_prefix(self, prompt: str) -> None:
        self.http.post("/generate", {"text": prompt, "sampling_params": {"max_new_tokens": 0}})

    def select(self, prompt: str, choices: Sequence[str], method: str, temperature: float = 0.0) -> SelectResult:
        check_method(method)
        head = self.http.post("/generate", {"text": prompt, "sampling_params": {"max_new_tokens": 0}})
        start = max(int(head["meta_info"]["prompt_tokens"]) - WINDOW_SLACK, 0)
        outs = self.http.post("/generate", {
            "text": [prompt, *(prompt + c for c in choices)], "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True, "logprob_start_len": start,
        })
        windows = [o["meta_info"]["input_token_logprobs"] for o in outs]
        ids = [[tok for _lp, tok in w] for w in windows]
        common = shared_prefix_len(ids)
        common = min(common, min(len(w) for w in ids[1:]) - 1)
        cond = [[lp for lp, _tok in w[common:] if lp is not None] for w in windows[1:]]
        uncond = None
        if needs_unconditional(method):
            ctx = min(UNCONDITIONAL_CONTEXT, common)
            uouts = self.http.post("/generate", {
                "input_ids": [w[common - ctx:] for w in ids[1:]], "sampling_params": {"max_new_tokens": 0},
                "return_logprob": True, "logprob_start_len": ctx,
            })
            uncond = [[lp for lp, _tok in o["meta_info"]["input_token_logprobs"] if lp is not None] for o in uouts]
        scores = decide(method, cond, uncond, temperature)
        meta = scores.meta_info()
        meta["cached_tokens"] = [o["meta_info"].get("cached_tokens") for o in outs[1:]]
        return SelectResult(choices[scores.index], meta)

    def role_template(self) -> RoleTemplate:
        if self._template is None:
            info = self.http.get("/get_model_info")
            template = info.get("chat_template")
            if not template:
                raise ModelCallError(
                    "the server's /get_model_info gives no chat_template; pass role_template= to Endpoint "
                    "(e.g. radixgen.lang.chat_template.CHATML)"
                )
            bos = info.get("bos_token") or ""
            self._template = derive_role_template(
                jinja_renderer(template, bos, info.get("eos_token") or ""), bos, bool(info.get("add_bos_token"))
            )
        return self._template

    def get_stats(self) -> dict[str, Any]:
        info = self.http.get("/get_server_info")
        return info.get("stats", info) if isinstance(info, dict) else {}
