"""The native API's request fields and SGLang's response shapes: what /generate accepts, refuses and answers.

`GENERATE_FIELDS` are the top-level fields /generate reads (the sampling keys are `SamplingParams`' fields).
`NOT_SUPPORTED` lists the fields SGLang's `GenerateReqInput` and `SamplingParams` have that radixgen does not
implement: sent with a value that turns them on they get a 400 saying so (not "unknown field"); sent as null,
false or empty (what SGLang's clients send when unused) they are dropped. Streaming follows SGLang: each event
carries the text and output ids so far and a `meta_info` (finish_reason None until the last); our own clients
ask for `stream_delta: true` and get each event's new text only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from radixgen.server.errors import bad_request

GENERATE_FIELDS = frozenset({"text", "input_ids", "sampling_params", "return_logprob", "top_logprobs_num",
                             "logprob_start_len", "return_text_in_logprobs", "stream", "stream_delta", "rid"})
# SGLang fields radixgen does not implement: request level, then inside sampling_params.
NOT_SUPPORTED = frozenset({
    "input_embeds", "image_data", "video_data", "audio_data", "modalities", "token_ids_logprob",
    "return_hidden_states", "session_params", "lora_path", "lora_id", "custom_logit_processor",
    "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key", "data_parallel_rank",
    "background", "conversation_id", "priority", "extra_key", "return_bytes", "return_entropy",
})
NOT_SUPPORTED_SAMPLING = frozenset({"structural_tag", "custom_params", "stream_interval", "sampling_seed"})
# SGLang fields that change nothing here and are accepted whatever their value.
IGNORED = frozenset({"log_metrics", "no_logs", "custom_labels", "validation_time"})
LOGPROB_KEYS = ("input_token_logprobs", "output_token_logprobs")
TOP_LOGPROB_KEYS = ("input_top_logprobs", "output_top_logprobs")


def _is_off(value: Any) -> bool:
    return value is None or value is False or value in ("", [], {})


def drop_not_supported(body: dict[str, Any], names: frozenset[str], where: str = "") -> dict[str, Any]:
    """`body` without the not-supported fields that are off (and without IGNORED ones); a 400 for one that is
    on."""
    for name in sorted(names & body.keys()):
        if not _is_off(body[name]):
            path = f"{where}.{name}" if where else name
            hint = " (use `seed`)" if name == "sampling_seed" else ""
            raise bad_request(path, f"not supported by radixgen{hint}")
    return {k: v for k, v in body.items() if k not in names and k not in IGNORED}


def token_ids_in(meta: dict[str, Any]) -> set[int]:
    """Every token id a meta_info's logprob lists name."""
    ids: set[int] = set()
    for key in LOGPROB_KEYS:
        ids.update(entry[1] for entry in meta.get(key) or ())
    for key in TOP_LOGPROB_KEYS:
        for row in meta.get(key) or ():
            ids.update(entry[1] for entry in row or ())
    return ids


def with_token_text(meta: dict[str, Any], text_of: Callable[[int], str]) -> dict[str, Any]:
    """`meta` with its logprob entries as SGLang's `[logprob, id, text]` triples (`return_text_in_logprobs`)."""
    out = dict(meta)
    for key in LOGPROB_KEYS:
        if out.get(key) is not None:
            out[key] = [[lp, tid, text_of(tid)] for lp, tid in out[key]]
    for key in TOP_LOGPROB_KEYS:
        if out.get(key) is not None:
            out[key] = [None if row is None else [[lp, tid, text_of(tid)] for lp, tid in row] for row in out[key]]
    return out


def token_texts(decode: Callable[[list[int]], str], ids: Iterable[int]) -> dict[int, str]:
    """Each token's own decoded text."""
    return {tid: decode([tid]) for tid in ids}


@dataclass
class StreamSoFar:
    """One sub-request's output so far, for SGLang's stream events (the text and ids so far in every event)."""

    text: str = ""
    output_ids: list[int] = field(default_factory=list)

    def add(self, chunk: dict[str, Any]) -> None:
        self.text += chunk["text"]
        self.output_ids.extend(chunk["output_ids"])

    def event(self, finished: bool, meta_info: dict[str, Any]) -> dict[str, Any]:
        """The event to send now (it shares `output_ids`: serialise it before the next `add`)."""
        return {"text": self.text, "output_ids": self.output_ids, "meta_info": meta_info, "finished": finished}
