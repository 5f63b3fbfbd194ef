"""The engine on the real default model (CPU): batching equivalence, prefix caching, memory pressure,
sampling reproducibility, stop strings and abort. Counts and equalities only, never timings."""

from __future__ import annotations

import threading

import pytest

from radixgen.runtime.engine import Engine

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}

PROMPTS = [
    "The capital of France is",
    "The capital of France is Paris. The capital of Italy is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "1, 2, 3, 4,",
]


@pytest.fixture(scope="module")
def engine(default_model_path):
    eng = Engine(str(default_model_path), chunked_prefill_size=16, max_prefill_tokens=64)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def singles(engine):
    """Each prompt alone, greedy, on an empty cache: the reference outputs."""
    out = []
    for p in PROMPTS:
        engine.flush_cache()
        out.append(engine.generate(p, GREEDY)["output_ids"])
    return out


def test_batched_equals_one_at_a_time(engine, singles):
    engine.flush_cache()
    batched = engine.generate(PROMPTS, GREEDY)
    assert [r["output_ids"] for r in batched] == singles
    # Again with everything cached (shared prefixes read in place).
    again = engine.generate(PROMPTS, GREEDY)
    assert [r["output_ids"] for r in again] == singles
    assert all(r["meta_info"]["cached_tokens"] > 0 for r in again)


def test_sampling_params_object_equals_its_dict(engine, singles):
    from radixgen.runtime.sampling_params import SamplingParams

    params = SamplingParams.from_dict(GREEDY)
    assert engine.generate(PROMPTS[0], params)["output_ids"] == singles[0]
    assert [r["output_ids"] for r in engine.generate(PROMPTS[:2], [params, GREEDY])] == singles[:2]


def test_decode_kv_copies_are_carried_and_change_no_token(engine, singles):
    """CPU decode steps append to the batch's per-layer K/V copies (runtime/attention/decode_kv_copies.py) instead of
    gathering every context again; without the copies the engine gives the same tokens."""
    copies = getattr(engine.runner.attention, "decode_kv_copies", None)  # the CPU backend's
    if copies is None:
        pytest.skip("the engine runs on CUDA, where the decode kernel reads the pool in place")
    engine.flush_cache()
    before = copies.appended_rows
    assert [r["output_ids"] for r in engine.generate(PROMPTS, GREEDY)] == singles
    assert copies.appended_rows - before >= 8 * len(PROMPTS)  # 12 tokens each: most decode steps only appended
    engine.runner.attention.decode_kv_copies = None
    try:
        engine.flush_cache()
        assert [r["output_ids"] for r in engine.generate(PROMPTS, GREEDY)] == singles
    finally:
        engine.runner.attention.decode_kv_copies = copies


def test_decode_kv_copies_over_a_shared_prefix_and_the_next_turn_change_no_token(engine):
    """Three requests on a long shared prefix (the cascade reads it from the pool, the rows hold the rest), then
    each one's next turn (its row, left by the first turn, is taken back and only the new tokens filled): the
    same tokens as gathering every context at every step."""
    copies = getattr(engine.runner.attention, "decode_kv_copies", None)  # the CPU backend's
    if copies is None:
        pytest.skip("the engine runs on CUDA, where the decode kernel reads the pool in place")
    system = "You are a careful assistant who answers in one short sentence. " * 8
    firsts = [system + q for q in ("Q: Why is the sky blue? A:", "Q: What is rain? A:", "Q: Name a bird. A:")]

    def two_turns() -> list[list[int]]:
        engine.flush_cache()
        one = engine.generate(firsts, GREEDY)
        seconds = [p + r["text"] + " Q: And why? A:" for p, r in zip(firsts, one)]
        return [r["output_ids"] for r in one] + [r["output_ids"] for r in engine.generate(seconds, GREEDY)]

    reused = copies.reused_positions
    with_copies = two_turns()
    assert copies.reused_positions > reused  # the second turns found their first turns' rows
    engine.runner.attention.decode_kv_copies = None
    try:
        assert two_turns() == with_copies
    finally:
        engine.runner.attention.decode_kv_copies = copies


def test_unchunked_engine_gives_the_same_tokens(default_model_path, singles):
    with Engine(str(default_model_path), chunked_prefill_size=0, disable_radix_cache=True) as eng:
        outs = eng.generate(PROMPTS, GREEDY)
    assert [r["output_ids"] for r in outs] == singles


def test_multi_turn_chat_reuses_the_whole_previous_context(engine):
    engine.flush_cache()
    tok = engine.tokenizer
    ids: list[int] = tok.encode("System: you are terse.\nUser: hello\nAssistant:")
    prev_context = 0
    for turn in range(4):
        before = engine.get_stats()["forward_tokens"]
        out = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 6,
                                                               "ignore_eos": True})
        computed = engine.get_stats()["forward_tokens"] - before
        cached = out["meta_info"]["cached_tokens"]
        if turn == 0:
            assert cached == 0
        else:
            # Everything but the previous turn's last sampled token (never fed through the model) is cached.
            assert cached == prev_context - 1
        # The model computed only the uncached prompt tokens plus one per decode step.
        assert computed == (len(ids) - cached) + (len(out["output_ids"]) - 1)
        prev_context = len(ids) + len(out["output_ids"])
        ids = ids + out["output_ids"] + tok.encode(f"\nUser: tell me more ({turn})\nAssistant:")


def test_cache_off_caches_nothing(default_model_path):
    with Engine(str(default_model_path), disable_radix_cache=True) as eng:
        a = eng.generate("Hello there, how are", GREEDY)
        b = eng.generate("Hello there, how are", GREEDY)
        assert a["meta_info"]["cached_tokens"] == b["meta_info"]["cached_tokens"] == 0
        assert a["output_ids"] == b["output_ids"]


def test_small_kv_pool_evicts_and_preempts_with_same_outputs(default_model_path, singles):
    with Engine(str(default_model_path), max_total_tokens=96, chunked_prefill_size=16,
                max_prefill_tokens=32) as eng:
        outs = eng.generate(PROMPTS * 2, GREEDY)
        stats = eng.get_stats()
        assert [r["output_ids"] for r in outs] == singles * 2
        assert stats["preemptions"] > 0 or stats["kv_slots_cached"] < 96
        assert eng.flush_cache()
        stats = eng.get_stats()
        assert stats["kv_slots_free"] == stats["kv_slots_total"]  # no leak


def test_seeded_sampling_is_reproducible_across_batches(engine):
    params = {"temperature": 0.9, "top_p": 0.95, "max_new_tokens": 10, "seed": 1234, "ignore_eos": True}
    alone = engine.generate(PROMPTS[0], params)["output_ids"]
    mixed = engine.generate([PROMPTS[3], PROMPTS[0], PROMPTS[2]],
                            [GREEDY, params, {"temperature": 1.0, "max_new_tokens": 5}])
    assert mixed[1]["output_ids"] == alone
    other_seed = engine.generate(PROMPTS[0], {**params, "seed": 99})["output_ids"]
    assert other_seed != alone  # different seed, (overwhelmingly likely) different draw


def test_stop_string_spanning_tokens_is_trimmed(engine):
    full = engine.generate(PROMPTS[4], GREEDY)
    text = full["text"]
    assert len(text) > 6
    stop = text[3:6]  # a stop string that likely straddles token boundaries
    out = engine.generate(PROMPTS[4], {**GREEDY, "stop": [stop]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == text[: text.index(stop)]


def test_stop_token_ids_and_length(engine):
    full = engine.generate(PROMPTS[2], GREEDY)
    target = full["output_ids"][4]
    out = engine.generate(PROMPTS[2], {**GREEDY, "stop_token_ids": [target]})
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    assert out["meta_info"]["finish_reason"]["matched"] == target
    assert full["meta_info"]["finish_reason"]["type"] == "length"


def test_abort_midway_releases_everything(engine):
    engine.flush_cache()
    chunks = []
    stream = engine.generate(PROMPTS[3], {**GREEDY, "max_new_tokens": 200}, stream=True)
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 3:
            engine.abort(_rid_of(engine))
            break
    stream.close()
    _wait_idle(engine)
    assert engine.flush_cache()
    stats = engine.get_stats()
    assert stats["kv_slots_free"] == stats["kv_slots_total"]


def test_streaming_concatenates_to_the_full_text(engine):
    full = engine.generate(PROMPTS[1], GREEDY)
    chunks = list(engine.generate(PROMPTS[1], GREEDY, stream=True))
    assert "".join(c["text"] for c in chunks) == full["text"]
    assert chunks[-1]["finished"] and chunks[-1]["meta_info"]["completion_tokens"] == 12


def test_decode_forward_seconds_count_only_decode_steps(engine):
    assert engine.flush_cache()  # a fully cached prompt would prefill its one last token as a decode-like step
    before = engine.get_stats()
    engine.generate(PROMPTS[1], GREEDY)  # 12 tokens: one prefill step, then decode steps
    after = engine.get_stats()
    decode_s = after["decode_forward_seconds"] - before["decode_forward_seconds"]
    assert after["decode_steps"] - before["decode_steps"] >= 10
    assert 0 < decode_s < after["forward_seconds"] - before["forward_seconds"]  # the prefill step is not in it


def test_invalid_parameters_are_refused_with_the_field_name(engine):
    with pytest.raises(ValueError, match="temperature"):
        engine.generate("hi", {"temperature": -1})
    with pytest.raises(ValueError, match="top_p"):
        engine.generate("hi", {"top_p": 0})
    with pytest.raises(ValueError, match="context"):
        engine.generate(input_ids=[1] * (engine.context_length + 5), sampling_params=GREEDY)


def test_prompt_logprobs_score_the_continuation(engine):
    tok = engine.tokenizer
    prefix = tok.encode("The capital of France is")
    good = engine.generate(input_ids=prefix + tok.encode(" Paris", add_special_tokens=False),
                           sampling_params={"max_new_tokens": 0}, logprob_start_len=len(prefix))
    bad = engine.generate(input_ids=prefix + tok.encode(" Banana", add_special_tokens=False),
                          sampling_params={"max_new_tokens": 0}, logprob_start_len=len(prefix))
    lp_good = sum(x[0] for x in good["meta_info"]["input_token_logprobs"] if x[0] is not None)
    lp_bad = sum(x[0] for x in bad["meta_info"]["input_token_logprobs"] if x[0] is not None)
    assert lp_good > lp_bad


def _rid_of(engine):
    running = engine.core.call(lambda: [r.rid for r in engine.core.scheduler.running])
    return running[0]


def _wait_idle(engine, timeout=30.0):
    done = threading.Event()
    for _ in range(int(timeout * 10)):
        s = engine.get_stats()
        if s["running"] == 0 and s["waiting"] == 0:
            return
        done.wait(0.1)
    raise AssertionError("engine did not become idle")


def test_cache_namespaces_keep_prefixes_apart(engine):
    engine.flush_cache()
    prompt = PROMPTS[3]
    engine.generate(prompt, GREEDY, cache_namespace="tenant-a")
    other = engine.generate(prompt, GREEDY, cache_namespace="tenant-b")
    same = engine.generate(prompt, GREEDY, cache_namespace="tenant-a")
    assert other["meta_info"]["cached_tokens"] == 0
    assert same["meta_info"]["cached_tokens"] > 0
    assert other["output_ids"] == same["output_ids"]


def test_whole_utf8_prefix_cuts_only_an_incomplete_tail():
    from radixgen.runtime.speculative.grammar_drafts import whole_utf8_prefix as _whole_utf8_prefix

    euro = "€".encode()
    assert _whole_utf8_prefix(b'{"a": ' + euro) == b'{"a": ' + euro
    assert _whole_utf8_prefix(b'{"a": ' + euro[:2]) == b'{"a": '
    assert _whole_utf8_prefix(euro[:1]) == b""


def test_jump_forward_retokenizes_the_boundary_and_saves_steps(engine):
    import json

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer"}}, "required": ["name", "age"]}
    out = engine.generate("Extract: John is 31.\nJSON:", {"temperature": 0, "max_new_tokens": 48,
                                                           "json_schema": json.dumps(schema)})
    obj = json.loads(out["text"])
    assert set(obj) == {"name", "age"}
    assert out["meta_info"]["decode_steps_saved"] > 0
    # Forced text is re-tokenized with the token before it, so the output is tokenized as the tokenizer would
    # tokenize its text (token-by-token masked sampling of the same text is not: it splits `"age":` oddly).
    assert out["output_ids"] == engine.tokenizer.encode(out["text"], add_special_tokens=False)


def test_overlap_schedule_delivers_what_the_synchronous_loop_does(default_model_path, engine):
    """The overlapped loop (each decode step launched before the previous step's tokens are delivered) returns
    exactly the synchronous loop's outputs, for requests that end by length, EOS, stop strings and stop ids,
    with logprobs, penalties and seeds; and it really overlaps."""
    chat = "<|im_start|>user\nSay hello in three words.<|im_end|>\n<|im_start|>assistant\n"
    prompts = PROMPTS + [chat, chat]
    params = [
        GREEDY,
        {**GREEDY, "stop": ["Rome", " is"]},
        GREEDY,
        {"temperature": 0.8, "top_p": 0.9, "seed": 7, "max_new_tokens": 9, "frequency_penalty": 0.5},
        {**GREEDY, "max_new_tokens": 3},
        {"temperature": 0, "max_new_tokens": 40},  # ends with EOS
        {"temperature": 0, "max_new_tokens": 40, "min_new_tokens": 20, "repetition_penalty": 1.2},
    ]
    full = engine.generate(prompts[2], GREEDY)["output_ids"]
    params[2] = {**params[2], "stop_token_ids": [full[6]]}
    before = engine.get_stats()["overlapped_steps"]
    overlapped = engine.generate(prompts, params, return_logprob=True, top_logprobs_num=3)
    assert engine.get_stats()["overlapped_steps"] > before
    with Engine(str(default_model_path), chunked_prefill_size=16, max_prefill_tokens=64,
                disable_overlap_schedule=True) as sync:
        reference = sync.generate(prompts, params, return_logprob=True, top_logprobs_num=3)
        assert sync.get_stats()["overlapped_steps"] == 0
    reasons = {r["meta_info"]["finish_reason"]["type"] for r in reference}
    assert reasons == {"length", "stop"}
    assert reference[5]["meta_info"]["finish_reason"]["matched"] is not None  # EOS
    for got, want in zip(overlapped, reference):
        assert got["output_ids"] == want["output_ids"]
        assert got["text"] == want["text"]
        assert got["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"]
        for key in ("output_token_logprobs", "output_top_logprobs"):
            assert _flat(got["meta_info"][key]) == pytest.approx(_flat(want["meta_info"][key]), rel=1e-4, abs=1e-4)
    assert engine.flush_cache()
    stats = engine.get_stats()
    assert stats["kv_slots_free"] == stats["kv_slots_total"]  # the wasted in-flight positions were returned


def test_constrained_requests_overlap_and_deliver_what_the_synchronous_loop_does(default_model_path, engine):
    """Constrained requests in the overlapped loop (the CUDA default; forced here on the CPU): each step's
    matchers see the in-flight tokens after the next forward is launched, before it samples. Jump-forward that
    replaces an already computed token rewinds it; outputs equal the synchronous loop's, and every KV slot
    comes back."""
    import json

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 130},
                                               "pets": {"type": "boolean"}}, "required": ["name", "age", "pets"],
              "additionalProperties": False}
    prompts = [f"Extract: {who} is {age}.\nJSON:" for who, age in (("John", 31), ("Ada", 36), ("Li", 7))]
    params = [{"temperature": 0, "max_new_tokens": 48, "json_schema": json.dumps(schema)},
              {"temperature": 0, "max_new_tokens": 48, "json_schema": json.dumps(schema)},
              {"temperature": 0, "max_new_tokens": 24, "regex": r"(yes|no), because [a-z ]{1,30}\."},
              GREEDY]
    prompts.append("The capital of France is")
    engine.core.scheduler.limits.overlap_constrained = True
    try:
        before = engine.get_stats()
        overlapped = engine.generate(prompts, params)
        after = engine.get_stats()
    finally:
        engine.core.scheduler.limits.overlap_constrained = False
    assert after["overlapped_steps"] > before["overlapped_steps"]
    assert after["jump_forward_tokens"] > before["jump_forward_tokens"]
    with Engine(str(default_model_path), chunked_prefill_size=16, max_prefill_tokens=64,
                disable_overlap_schedule=True) as sync:
        reference = sync.generate(prompts, params)
    for got, want in zip(overlapped, reference):
        assert got["output_ids"] == want["output_ids"]
        assert got["text"] == want["text"]
    for out in overlapped[:2]:
        assert set(json.loads(out["text"])) == {"name", "age", "pets"}
    assert engine.flush_cache()
    stats = engine.get_stats()
    assert stats["kv_slots_free"] == stats["kv_slots_total"]


def _flat(nested) -> list[float]:
    """Every number in nested lists/tuples of logprob entries, in order."""
    if isinstance(nested, (list, tuple)):
        return [x for item in nested for x in _flat(item)]
    return [float(nested)]


def test_the_engine_is_built_on_a_short_lived_thread():
    """Model building runs parallel torch ops; on the caller's thread its OpenMP team would outlive it and
    throttle the loop thread's (runtime/engine.py `_on_own_thread`). Errors still reach the caller."""
    import threading

    from radixgen.runtime.engine import _on_own_thread

    seen = []
    _on_own_thread(lambda: seen.append(threading.current_thread()))
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()
    with pytest.raises(ValueError, match="boom"):
        _on_own_thread(lambda: (_ for _ in ()).throw(ValueError("boom")))


def test_a_failing_grammar_ends_only_its_request(engine, monkeypatch):
    """A matcher that cannot build its mask aborts that request with the reason; the batch's others finish."""
    from radixgen.grammars.matcher import Matcher

    def broken(self, row):
        raise ValueError("mask row of the wrong size")

    monkeypatch.setattr(Matcher, "fill_mask", broken)
    free, constrained = engine.generate(
        ["The capital of France is", "Answer yes or no:"],
        [{"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
         {"max_new_tokens": 8, "temperature": 0, "regex": "(yes|no)"}])
    assert free["meta_info"]["finish_reason"]["type"] == "length" and len(free["output_ids"]) == 8
    reason = constrained["meta_info"]["finish_reason"]
    assert reason["type"] == "abort"
    assert "constraint failed: ValueError: mask row of the wrong size" in reason["message"]
    monkeypatch.undo()
    again = engine.generate("Answer yes or no:", {"max_new_tokens": 8, "temperature": 0, "regex": "(yes|no)"})
    assert again["text"] in ("yes", "no")  # the engine goes on serving constrained requests
