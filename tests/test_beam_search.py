"""Beam search in the engine equals transformers' `generate(num_beams=...)` token for token and in scores, holds
a prompt's KV once whatever num_beams, and leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from model_fixtures import write_tiny_checkpoint

from radixgen.runtime.beam_search import ngram_bans
from radixgen.runtime.engine import Engine
from radixgen.runtime.request import ReqState
from radixgen.runtime.sampling_params import SamplingParams, SamplingParamsError

transformers = pytest.importorskip("transformers")

TOKENIZER = Path(__file__).parent / "fixtures" / "tokenizers" / "smollm2-135m-instruct.tokenizer.gguf"
VOCAB = 49152
PROMPTS = [[1, 17, 200, 33, 5, 99, 250, 1000, 4000], [7, 7, 300, 12000, 45, 2, 810], [5, 4, 3]]
# (length_penalty, early_stopping, num_return_sequences, no_repeat_ngram_size)
SETTINGS = [(1.0, False, 2, 0), (0.5, True, 3, 0), (-1.0, "never", 4, 0), (1.0, False, 2, 2), (2.0, "never", 1, 0),
            (0.0, True, 4, 3)]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tiny(request, tmp_path_factory):
    folder = write_tiny_checkpoint(tmp_path_factory.mktemp(request.param), request.param, seed=1,
                                   overrides={"vocab_size": VOCAB})
    eng = Engine(str(folder), tokenizer_path=str(TOKENIZER), device="cpu", chunked_prefill_size=4,
                 max_prefill_tokens=16)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    yield eng, hf
    eng.shutdown()


def _stops(eng: Engine, prompt: list[int]) -> list[int]:
    """A token the random model often writes, to stop beams at (so hypotheses finish before the length limit)."""
    out = eng.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": 30})["output_ids"]
    values, counts = np.unique(out, return_counts=True)
    return [int(values[np.argmax(counts)])]


def _hf_beams(hf, prompt: list[int], eos: list[int], max_new: int, lp: float, es: bool | str, nrs: int, ngram: int,
              num_beams: int = 4):
    g = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                    num_beams=num_beams, do_sample=False, max_new_tokens=max_new, length_penalty=lp,
                    early_stopping=es, num_return_sequences=nrs, no_repeat_ngram_size=ngram or None,
                    eos_token_id=eos, pad_token_id=eos[0], output_scores=True, return_dict_in_generate=True)
    seqs = []
    for s in g.sequences.tolist():
        out = s[len(prompt):]
        for i, t in enumerate(out):  # transformers pads after a finished beam's stopping token
            if t in eos:
                out = out[: i + 1]
                break
        seqs.append(out)
    return seqs, g.sequences_scores.tolist()


@pytest.mark.parametrize("setting", SETTINGS)
def test_beam_search_equals_transformers(tiny, setting):
    eng, hf = tiny
    lp, es, nrs, ngram = setting
    prompt = PROMPTS[0]
    stops = _stops(eng, prompt)
    params = {"temperature": 0, "max_new_tokens": 24, "num_beams": 4, "length_penalty": lp, "early_stopping": es,
              "num_return_sequences": nrs, "no_repeat_ngram_size": ngram, "stop_token_ids": stops}
    ours = eng.generate(input_ids=prompt, sampling_params=params)
    ours = ours if isinstance(ours, list) else [ours]
    want, scores = _hf_beams(hf, prompt, list(eng.tokenizer.eos_token_ids) + stops, 24, lp, es, nrs, ngram)
    assert [o["output_ids"] for o in ours] == want
    assert [o["meta_info"]["beam_score"] for o in ours] == pytest.approx(scores, rel=1e-4, abs=1e-4)
    for o in ours:
        assert o["meta_info"]["cumulative_logprob"] <= 0
        assert [b["output_ids"] for b in o["meta_info"]["finished_beams"]] == want


def test_batched_beam_searches_equal_each_alone_beside_plain_requests(tiny):
    """Searches of different prompts and widths in one batch, with greedy requests beside them, each give what
    they give alone (and what transformers gives)."""
    eng, hf = tiny
    eos = list(eng.tokenizer.eos_token_ids)
    beams = [{"temperature": 0, "max_new_tokens": 12, "num_beams": nb, "num_return_sequences": 2} for nb in (2, 3, 4)]
    greedy = {"temperature": 0, "max_new_tokens": 12}
    alone = [eng.generate(input_ids=p, sampling_params=s) for p, s in zip(PROMPTS, beams)]
    plain = eng.generate(input_ids=PROMPTS, sampling_params=greedy)
    together = eng.generate(input_ids=PROMPTS + PROMPTS, sampling_params=beams + [greedy] * 3)
    assert [o["output_ids"] for o in together[:6]] == [o["output_ids"] for a in alone for o in a]
    assert [o["output_ids"] for o in together[6:]] == [o["output_ids"] for o in plain]
    for p, s, a in zip(PROMPTS, beams, alone):
        want, _ = _hf_beams(hf, p, eos, 12, 1.0, False, 2, 0, num_beams=s["num_beams"])
        assert [o["output_ids"] for o in a] == want


def test_searches_of_mixed_options_in_one_step_each_equal_transformers(tiny):
    """Searches of one width but different length penalties, early stopping, stopping tokens and limits share a
    step (one block of the batched choice): each equals transformers' search of its own."""
    eng, hf = tiny
    eos = list(eng.tokenizer.eos_token_ids)
    stops = [_stops(eng, p) for p in PROMPTS]  # as many stopping tokens each: one block, different ones
    settings = [(0.5, True, 14), (2.0, "never", 10), (-1.0, False, 12)]
    params = [{"temperature": 0, "max_new_tokens": n, "num_beams": 3, "length_penalty": lp, "early_stopping": es,
               "num_return_sequences": 2, "stop_token_ids": st} for (lp, es, n), st in zip(settings, stops)]
    together = eng.generate(input_ids=PROMPTS, sampling_params=params)
    for k, (prompt, (lp, es, n), st) in enumerate(zip(PROMPTS, settings, stops)):
        want, scores = _hf_beams(hf, prompt, eos + st, n, lp, es, 2, 0, num_beams=3)
        got = together[2 * k: 2 * k + 2]
        assert [o["output_ids"] for o in got] == want
        assert [o["meta_info"]["beam_score"] for o in got] == pytest.approx(scores, rel=1e-4, abs=1e-4)


def test_beams_hold_the_prompt_once_and_release_everything(tiny):
    """While a search runs, its beams' rows point at one copy of the prompt's slots and at most one slot per
    beam per generated position; when it ends, every slot is free or cached."""
    eng, _ = tiny
    core = eng.core
    prompt = list(range(100, 140))  # 40 tokens
    seen = []

    def look(batch):
        beams = [it.req for it in batch.items if it.req.beam_group is not None]
        if len(beams) == 6:
            held = [core.scheduler.slot_view(r, 0, r.kv_len) for r in beams]
            generated = beams[0].kv_len - len(prompt)
            prompt_slots = {tuple(h[: len(prompt)]) for h in held}
            distinct = len(np.unique(np.concatenate(held)))
            seen.append((len(prompt_slots), distinct, generated))

    core.on_step = look
    try:
        before = eng.get_stats()
        eng.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": 16, "num_beams": 6,
                                                        "ignore_eos": True})
    finally:
        core.on_step = None
    assert seen, "the search ran with all of its beams"
    for copies, distinct, generated in seen:
        assert copies == 1
        assert distinct <= len(prompt) + 6 * generated
    after = eng.get_stats()
    assert after["running"] == 0 and after["kv_slots_free"] + after["kv_slots_cached"] == after["kv_slots_total"]
    assert before["kv_slots_cached"] <= after["kv_slots_cached"]
    assert not core.beams.runs and not core.scheduler.beam_refs.any()


def test_beam_search_under_memory_pressure_and_chunked_prefill(tmp_path):
    """A small pool: plain requests beside the searches are preempted and resumed, beams never are, and every
    output equals the one from a roomy engine."""
    folder = write_tiny_checkpoint(tmp_path / "m", "llama", seed=2, overrides={"vocab_size": VOCAB})
    prompts = [list(range(10 + i, 60 + i)) for i in range(4)]
    params = [{"temperature": 0, "max_new_tokens": 20, "num_beams": 3, "ignore_eos": True},
              {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}] * 2
    with Engine(str(folder), tokenizer_path=str(TOKENIZER), device="cpu") as roomy:
        want = roomy.generate(input_ids=prompts, sampling_params=params)
    with Engine(str(folder), tokenizer_path=str(TOKENIZER), device="cpu", max_total_tokens=260,
                chunked_prefill_size=8, max_prefill_tokens=16, disable_radix_cache=True) as tight:
        got = tight.generate(input_ids=prompts, sampling_params=params)
        stats = tight.get_stats()
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    assert stats["preemptions"] > 0, "the pool was small enough to preempt"
    assert stats["kv_slots_free"] == stats["kv_slots_total"]


def test_constrained_beams_follow_their_grammar(tiny):
    eng, _ = tiny
    out = eng.generate(input_ids=PROMPTS[1], sampling_params={
        "temperature": 0, "max_new_tokens": 12, "num_beams": 3, "num_return_sequences": 3, "regex": "(yes|no|maybe)!"})
    texts = [o["text"] for o in out]
    assert all(t in ("yes!", "no!", "maybe!") for t in texts), texts
    assert len({tuple(o["output_ids"]) for o in out}) == 3  # three different finished beams (maybe as spellings)


def test_abort_ends_a_search_and_frees_its_beams(tiny):
    eng, _ = tiny
    core = eng.core
    aborted = []

    def abort_midway(batch):
        beams = [it.req for it in batch.items if it.req.beam_group is not None]
        if beams and len(beams[0].output_ids) == 5 and not aborted:
            aborted.append(beams[0].beam_group)
            core.abort(beams[0].beam_group)  # handled between steps, as a client's abort is

    core.on_step = abort_midway
    try:
        out = eng.generate(input_ids=PROMPTS[0], sampling_params={"temperature": 0, "max_new_tokens": 30,
                                                                  "num_beams": 4, "ignore_eos": True})
    finally:
        core.on_step = None
    assert aborted and out["meta_info"]["finish_reason"]["type"] == "abort"
    stats = eng.get_stats()
    assert stats["running"] == 0 and stats["kv_slots_free"] + stats["kv_slots_cached"] == stats["kv_slots_total"]
    assert not core.beams.runs and not any(r.state is ReqState.BEAMS for r in core.reqs.values())


def test_ngram_bans_equal_a_brute_force_scan():
    rng = np.random.default_rng(0)
    for _ in range(200):
        ids = rng.integers(0, 5, size=int(rng.integers(0, 30)))
        n = int(rng.integers(1, 5))
        want = set()
        if len(ids) + 1 >= n:
            last = tuple(ids[len(ids) - (n - 1):]) if n > 1 else ()
            for i in range(len(ids) - n + 1):
                if tuple(ids[i : i + n - 1]) == last:
                    want.add(int(ids[i + n - 1]))
        assert set(ngram_bans(ids.astype(np.int64), n).tolist()) == want


@pytest.mark.parametrize("options, message", [
    ({"num_beams": 4}, "temperature 0"),
    ({"num_beams": 2, "temperature": 0, "n": 3}, "at most num_beams"),
    ({"num_beams": 2, "temperature": 0, "stop": "x"}, "stop is not supported"),
    ({"num_beams": 2, "temperature": 0, "repetition_penalty": 1.2}, "repetition_penalty"),
    ({"num_beams": 2, "temperature": 0, "early_stopping": "sometimes"}, "early_stopping"),
    ({"num_return_sequences": 2}, "num_beams > 1"),
])
def test_beam_options_are_refused_where_they_make_no_sense(options, message):
    with pytest.raises(SamplingParamsError, match=message):
        SamplingParams(**options)


def test_engine_refuses_streaming_logprobs_and_too_many_beams(tiny):
    eng, _ = tiny
    with pytest.raises(ValueError, match="stream"):
        eng.generate(input_ids=PROMPTS[0], sampling_params={"temperature": 0, "num_beams": 2}, stream=True)
    with pytest.raises(ValueError, match="return_logprob"):
        eng.generate(input_ids=PROMPTS[0], sampling_params={"temperature": 0, "num_beams": 2}, return_logprob=True)
    with pytest.raises(ValueError, match="max_running_requests"):
        eng.generate(input_ids=PROMPTS[0], sampling_params={"temperature": 0, "num_beams": 10_000})


@pytest.mark.slow
def test_beam_search_equals_transformers_on_the_default_model(default_model_path):
    """The real model (GGUF, dequantized to float32 by both sides)."""
    gguf = next(Path(default_model_path).glob("*.gguf")) if Path(default_model_path).is_dir() else default_model_path
    folder, name = str(Path(gguf).parent), Path(gguf).name
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    with Engine(str(default_model_path), device="cpu") as eng:
        prompt = eng.tokenizer.encode("The three most important rivers of Europe are")
        eos = list(eng.tokenizer.eos_token_ids)
        for lp, es in [(1.0, False), (0.6, True), (1.5, "never")]:
            ours = eng.generate(input_ids=prompt, sampling_params={
                "temperature": 0, "max_new_tokens": 20, "num_beams": 4, "length_penalty": lp, "early_stopping": es,
                "num_return_sequences": 2})
            want, scores = _hf_beams(hf, prompt, eos, 20, lp, es, 2, 0)
            assert [o["output_ids"] for o in ours] == want
            assert [o["meta_info"]["beam_score"] for o in ours] == pytest.approx(scores, rel=1e-4, abs=1e-4)


@pytest.mark.gpu
def test_beam_search_on_cuda_with_graphs_equals_transformers(tmp_path):
    """On the GPU (fp32, Triton kernels, decode steps from CUDA graphs), batched searches equal transformers."""
    folder = write_tiny_checkpoint(tmp_path / "m", "llama", seed=1, overrides={"vocab_size": VOCAB})
    params = {"temperature": 0, "max_new_tokens": 16, "num_beams": 4, "num_return_sequences": 2}
    with Engine(str(folder), tokenizer_path=str(TOKENIZER), device="cuda", dtype="float32") as eng:
        ours = eng.generate(input_ids=PROMPTS, sampling_params=params)
        eos = list(eng.tokenizer.eos_token_ids)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    want = [ids for p in PROMPTS for ids in _hf_beams(hf, p, eos, 16, 1.0, False, 2, 0)[0]]
    assert [o["output_ids"] for o in ours] == want
