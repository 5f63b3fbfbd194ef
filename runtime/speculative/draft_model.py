"""Drafts from a smaller model with the same tokenizer, run by its own ModelRunner (its own KV pool, request
rows and CUDA graphs) beside the target's.

Per speculating request the draft keeps the KV of the tokens it has seen; each proposal first catches up on the
tokens the target added since (the accepted drafts and the target's own token: the first time, the whole
prompt), in one forward for every request, then runs k - 1 decode steps feeding its own greedy tokens. The
greedy drafts are deterministic proposals, so the verify step's acceptance rule is exact for them
(runtime/speculative/acceptance.py). Rejected drafts' KV is dropped at the next proposal, by comparing the
tokens the draft holds with the request's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from radixgen.runtime.forward_batch import assemble_forward_batch
from radixgen.runtime.slot_buffer import SlotBuffer
from radixgen.runtime.speculative.drafter import TokenIds

if TYPE_CHECKING:
    from radixgen.runtime.engine_config import EngineConfig
    from radixgen.runtime.model_runner import ModelRunner
    from radixgen.runtime.request import Req

_NONE = np.zeros(0, dtype=np.int64)


@dataclass
class _DraftSeq:
    """One request as the draft model holds it: its table row, the slot of each held position, and the token
    each held position holds."""

    row: int
    slots: SlotBuffer
    ids: TokenIds


class DraftModelDrafter:
    """A second model proposes each request's next k tokens greedily; `release` frees what a request held."""

    def __init__(self, config: EngineConfig, target: ModelRunner) -> None:
        from radixgen.runtime.model_runner import ModelRunner

        assert config.draft_model_path is not None, "checked by EngineConfig.validate"
        draft_config = dataclasses.replace(
            # the draft loads no tokenizer: the target's stands in for the check that one exists
            config, model_path=config.draft_model_path, device=str(target.device),
            tokenizer_path=config.tokenizer_path or (str(target.model_path) if target.model_path else None),
            speculative_algorithm=None, draft_model_path=None, max_total_tokens=target.max_total_tokens,
            cuda_graph_max_bs=min(config.cuda_graph_max_bs, config.speculative_max_batch),
            context_length=target.context_length)
        self.runner = ModelRunner(draft_config)
        self.vocab_size = target.model_config.vocab_size
        drafted = self.runner.model_config.vocab_size
        if drafted != self.vocab_size:
            raise ValueError(f"the draft model {config.draft_model_path} has a vocabulary of {drafted} tokens and the "
                             f"target {self.vocab_size}: a draft model must share the target's tokenizer")
        self.seqs: dict[str, _DraftSeq] = {}

    def propose(self, reqs: Sequence[Req], k: int) -> list[TokenIds]:
        out = [_NONE] * len(reqs)
        picked: list[tuple[int, _DraftSeq, TokenIds, int, np.ndarray]] = []  # (index, seq, new ids, held, slots)
        for i, req in enumerate(reqs):
            seq = self._seq(req.rid)
            if seq is None:
                continue
            fill = req.fill_ids()
            held = min(_common_prefix(seq.ids, fill), len(fill) - 1)  # compute at least the last token
            self._truncate(seq, held)
            new = fill[held:]
            slots = self.runner.slot_allocator.alloc(len(new) + k - 1)
            if slots is None:  # the draft's pool is full: this request decodes without drafts this step
                continue
            picked.append((i, seq, new, held, slots))
        if not picked:
            return out
        drafts = self._run(picked, k)
        for (i, seq, new, held, slots), draft in zip(picked, drafts):
            seq.slots.extend(slots)
            seq.ids = np.concatenate([seq.ids[:held], new, draft[: k - 1]])
            out[i] = draft
        return out

    @torch.inference_mode()
    def _run(self, picked: list[tuple[int, _DraftSeq, TokenIds, int, np.ndarray]], k: int) -> list[TokenIds]:
        """The catch-up forward then k - 1 greedy decode steps, all requests together; the drafts go to the host
        once, at the end."""
        runner = self.runner
        table = runner.req_to_token_pool.req_to_token
        rows = np.array([seq.row for _, seq, _, _, _ in picked], dtype=np.int64)
        held = np.array([h for _, _, _, h, _ in picked], dtype=np.int64)
        news = [new for _, _, new, _, _ in picked]
        lens = np.array([len(n) for n in news], dtype=np.int64)
        slots = [s for _, _, _, _, s in picked]
        # Every position's slot goes into the table now (catch-up and draft positions): the decode steps write none.
        total = lens + k - 1
        write_rows = np.repeat(rows, total)
        write_cols = np.repeat(held - (np.cumsum(total) - total), total) + np.arange(int(total.sum()))
        out_loc = np.concatenate([s[:n] for s, n in zip(slots, lens)])
        fb = assemble_forward_batch(np.concatenate(news), held, lens, rows, out_loc, table,
                                    table_writes=(write_rows, write_cols, np.concatenate(slots)))
        tokens = [self._greedy(runner.forward(fb))]
        ones = np.ones(len(picked), dtype=np.int64)
        for j in range(1, k):
            loc = np.array([s[n + j - 1] for s, n in zip(slots, lens)], dtype=np.int64)
            fb = assemble_forward_batch(_NONE, held + lens + j - 1, ones, rows, loc, table, device_ids=tokens[-1])
            tokens.append(self._greedy(runner.forward(fb)))
        drafts = torch.stack(tokens, dim=1).cpu().numpy().astype(np.int64)
        return list(drafts)

    def _greedy(self, logits: torch.Tensor) -> torch.Tensor:
        return logits[:, : self.vocab_size].argmax(dim=-1)

    def _seq(self, rid: str) -> _DraftSeq | None:
        seq = self.seqs.get(rid)
        if seq is None:
            row = self.runner.req_to_token_pool.alloc()
            if row is None:
                return None
            seq = self.seqs[rid] = _DraftSeq(row, SlotBuffer(), _NONE)
        return seq

    def _truncate(self, seq: _DraftSeq, held: int) -> None:
        dropped = seq.slots.view(held).copy()
        if len(dropped):
            self.runner.slot_allocator.free(dropped)
        seq.slots.truncate(held)
        seq.ids = seq.ids[:held]

    def release(self, rid: str) -> None:
        seq = self.seqs.pop(rid, None)
        if seq is None:
            return
        self._truncate(seq, 0)
        self.runner.req_to_token_pool.free(seq.row)


def _common_prefix(a: TokenIds, b: TokenIds) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
