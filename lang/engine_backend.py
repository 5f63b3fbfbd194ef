"""`EngineBackend`: programs on an in-process `radixgen.Engine` (docs/engine_api.md), no HTTP in between."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from radixgen.lang.backend import Backend, GenResult, ModelCallError, SelectRequest, SelectResult, StreamDelta
from radixgen.lang.chat_template import RoleTemplate, derive_role_template
from radixgen.lang.choices import check_method, decide, needs_unconditional, shared_prefix_len
from radixgen.lang.spec import GenSpec
from radixgen.runtime.sampling_params import SamplingParams

# Prompt tokens kept before a choice when scoring it "unconditionally" (SGLang scores choices after a short
# local context too): enough to seat the choice's first token, too little to carry the question.
UNCONDITIONAL_CONTEXT = 2
# Selects whose choice tokens start within this many tokens of each other are scored in one engine call, from
# the earliest start: a later one re-reads at most this many of its cached tokens, and they share a step.
SELECT_GROUP_SLACK = 16
PREFILL_ONLY = SamplingParams(max_new_tokens=0)  # read the prompt (cache it, score it), generate nothing


class EngineBackend(Backend):
    """Backend over a `radixgen.Engine` object; `role_template` overrides the one derived from the model."""

    def __init__(self, engine: Any, role_template: RoleTemplate | None = None) -> None:
        self.engine = engine
        self._template = role_template

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(self, prompt: str, spec: GenSpec) -> GenResult:
        out = self.engine.generate(
            prompt, spec.to_sampling_params(), return_logprob=bool(spec.return_logprob),
            top_logprobs_num=spec.top_logprobs_num or 0,
        )
        return GenResult(out["text"], out["meta_info"])

    def generate_batch(self, prompts: Sequence[str], specs: Sequence[GenSpec]) -> list[GenResult | Exception]:
        """One engine call for all prompts, so the scheduler sees them together (same step where they fit); one
        result per returned sequence, so a beam search returning several beams gives them all, best first."""
        if not prompts:
            return []
        logprob = any(s.return_logprob for s in specs)
        top = max((s.top_logprobs_num or 0) for s in specs)
        try:
            outs = self.engine.generate(list(prompts), [s.to_sampling_params() for s in specs],
                                        return_logprob=logprob, top_logprobs_num=top)
        except ValueError:
            return super().generate_batch(prompts, specs)  # isolate the invalid request(s)
        return [GenResult(o["text"], o["meta_info"]) for o in outs]

    def stream(self, prompt: str, spec: GenSpec) -> Iterator[StreamDelta]:
        chunks = self.engine.generate(
            prompt, spec.to_sampling_params(), return_logprob=bool(spec.return_logprob),
            top_logprobs_num=spec.top_logprobs_num or 0, stream=True,
        )
        for chunk in chunks:
            yield StreamDelta(chunk["text"], bool(chunk["finished"]), chunk.get("meta_info", {}))

    def cache_prefix(self, prompt: str) -> None:
        self.engine.generate(prompt, PREFILL_ONLY)

    def select(self, prompt: str, choices: Sequence[str], method: str, temperature: float = 0.0) -> SelectResult:
        """Score every `prompt + choice` in one batched prefill (max_new_tokens=0) that shares the prompt."""
        result = self.select_batch([SelectRequest(prompt, tuple(choices), method, temperature)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def select_batch(self, requests: Sequence[SelectRequest]) -> list[SelectResult | Exception]:
        """Score the choices of many selects together: all `prompt + choice` token lists of requests whose
        scoring windows open close to each other go into one engine call (see SELECT_GROUP_SLACK)."""
        encode = self.tokenizer.encode
        lists: list[list[int]] = []  # every choice of every request, in order
        starts: list[int] = []  # where its choice tokens begin
        wants_uncond: list[bool] = []
        for req in requests:
            check_method(req.method)
            full = [list(encode(req.prompt + c)) for c in req.choices]
            start = shared_prefix_len([list(encode(req.prompt)), *full])
            start = min(start, min(len(ids) for ids in full) - 1)  # every choice keeps at least one scored token
            lists += full
            starts += [start] * len(full)
            wants_uncond += [needs_unconditional(req.method)] * len(full)
        cond = self._score(lists, starts)
        uncond: list[tuple[list[float], dict[str, Any]] | Exception] = [ModelCallError("not scored")] * len(lists)
        need = [i for i, wanted in enumerate(wants_uncond) if wanted]
        if need:
            ctx = [min(UNCONDITIONAL_CONTEXT, starts[i]) for i in need]
            local = self._score([lists[i][starts[i] - c:] for i, c in zip(need, ctx)], ctx)
            for i, scored in zip(need, local):
                uncond[i] = scored
        results: list[SelectResult | Exception] = []
        pos = 0
        for req in requests:
            span = range(pos, pos + len(req.choices))
            pos += len(req.choices)
            try:
                results.append(self._decide(req, [cond[i] for i in span], [uncond[i] for i in span]))
            except ModelCallError as exc:
                results.append(exc)
        return results

    @staticmethod
    def _decide(req: SelectRequest, cond: list, uncond: list) -> SelectResult:
        for scored in cond + (uncond if needs_unconditional(req.method) else []):
            if isinstance(scored, Exception):
                raise scored
        uncond_lps = [u[0] for u in uncond] if needs_unconditional(req.method) else None
        scores = decide(req.method, [c[0] for c in cond], uncond_lps, req.temperature)
        meta = scores.meta_info()
        meta["prompt_tokens"] = [c[1].get("prompt_tokens") for c in cond]
        meta["cached_tokens"] = [c[1].get("cached_tokens") for c in cond]
        return SelectResult(req.choices[scores.index], meta)

    def _score(self, id_lists: list[list[int]], starts: list[int]
               ) -> list[tuple[list[float], dict[str, Any]] | Exception]:
        """Input-token logprobs of each list from its own start (prefill only), in as few engine calls as
        SELECT_GROUP_SLACK allows: a group is scored from its earliest start and each list sliced from its own."""
        order = sorted(range(len(id_lists)), key=lambda i: starts[i])
        groups: list[list[int]] = []
        for i in order:
            if groups and starts[i] - starts[groups[-1][0]] <= SELECT_GROUP_SLACK:
                groups[-1].append(i)
            else:
                groups.append([i])
        out: list[tuple[list[float], dict[str, Any]] | Exception] = [ModelCallError("not scored")] * len(id_lists)
        for group in groups:
            low = starts[group[0]]
            outs = self.engine.generate(input_ids=[id_lists[i] for i in group], sampling_params=PREFILL_ONLY,
                                        return_logprob=True, logprob_start_len=low)
            for i, o in zip(group, outs):
                meta = o["meta_info"]
                reason = meta.get("finish_reason") or {}
                if isinstance(reason, dict) and reason.get("type") == "abort":
                    out[i] = ModelCallError(f"scoring the choices failed: {reason.get('message')}")
                    continue
                pairs = meta["input_token_logprobs"][starts[i] - low:]
                out[i] = ([float(lp) for lp, _tok in pairs if lp is not None], meta)
        return out

    def role_template(self) -> RoleTemplate:
        if self._template is None:
            tok = self.tokenizer
            try:
                self._template = derive_role_template(
                    lambda messages, gen: tok.apply_chat_template(messages, add_generation_prompt=gen),
                    bos_text=getattr(tok, "bos_token", None) or "",
                    tokenizer_adds_bos=bool(getattr(tok, "add_bos_token", False)),
                )
            except Exception as exc:
                raise ModelCallError(
                    f"cannot render chat roles for this model ({exc}); pass role_template= (e.g. "
                    "radixgen.lang.chat_template.CHATML) to EngineBackend"
                ) from exc
        return self._template

    def get_stats(self) -> dict[str, Any]:
        return self.engine.get_stats()
