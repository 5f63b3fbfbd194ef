"""Contrastive search in the engine equals a plain implementation written from the paper (one request at a time,
every step recomputed from scratch with transformers' model), holds its candidates as forks and leaves nothing
behind."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_fixtures import write_tiny_checkpoint

from radixgen.runtime.engine import Engine
from radixgen.runtime.sampling_params import SamplingParams, SamplingParamsError

transformers = pytest.importorskip("transformers")

TOKENIZER = Path(__file__).parent / "fixtures" / "tokenizers" / "smollm2-135m-instruct.tokenizer.gguf"
VOCAB = 49152
PROMPTS = [[1, 17, 200, 33, 5, 99, 250, 1000, 4000], [7, 7, 300, 12000, 45, 2, 810], [5, 4, 3]]


@torch.no_grad()
def reference(hf, prompt: list[int], top_k: int, alpha: float, max_new: int, eos: set[int]) -> list[int]:
    """Su et al. 2022, greedy contrastive search: among the top_k next tokens, the one maximising
    (1 - alpha) * p - alpha * max cosine(h(candidate), h(every earlier position)), h the final hidden state."""
    ids = list(prompt)
    hidden = hf.model(torch.tensor([ids])).last_hidden_state[0]
    logits = hf.lm_head(hidden[-1])
    history = hidden / hidden.norm(dim=-1, keepdim=True)
    out: list[int] = []
    for _ in range(max_new):
        probs, top = torch.softmax(logits, -1).topk(top_k)
        states, nexts = [], []
        for t in top.tolist():
            h = hf.model(torch.tensor([ids + [t]])).last_hidden_state[0, -1]
            states.append(h / h.norm())
            nexts.append(hf.lm_head(h))
        h = torch.stack(states)
        score = (1 - alpha) * probs - alpha * (h @ history.T).max(dim=1).values
        j = int(score.argmax())
        token = int(top[j])
        ids.append(token)
        out.append(token)
        history = torch.cat([history, h[j : j + 1]])
        logits = nexts[j]
        if token in eos:
            break
    return out


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


@pytest.mark.parametrize(("alpha", "top_k"), [(0.6, 4), (0.3, 3), (0.9, 2)])
def test_contrastive_search_equals_the_reference(tiny, alpha, top_k):
    """Batched (several prompts in one call, chunked prefill), each as the reference gives it alone."""
    eng, hf = tiny
    params = {"temperature": 0, "top_k": top_k, "penalty_alpha": alpha, "max_new_tokens": 16}
    ours = eng.generate(input_ids=PROMPTS, sampling_params=params)
    eos = set(eng.tokenizer.eos_token_ids)
    assert [o["output_ids"] for o in ours] == [reference(hf, p, top_k, alpha, 16, eos) for p in PROMPTS]
    stats = eng.get_stats()
    assert stats["running"] == 0 and stats["kv_slots_free"] + stats["kv_slots_cached"] == stats["kv_slots_total"]
    assert not eng.core.contrastive.runs and not eng.core.scheduler.beam_refs.any()


def test_contrastive_search_beside_plain_requests_streams_and_stops(tiny):
    """Greedy requests in the same batch are unchanged; a stream's chunks add up to the whole output; a stop
    token ends the search where the reference would."""
    eng, hf = tiny
    greedy = {"temperature": 0, "max_new_tokens": 12}
    contrastive = {"temperature": 0, "top_k": 4, "penalty_alpha": 0.5, "max_new_tokens": 12}
    plain = eng.generate(input_ids=PROMPTS, sampling_params=greedy)
    mixed = eng.generate(input_ids=PROMPTS + PROMPTS, sampling_params=[greedy] * 3 + [contrastive] * 3)
    assert [o["output_ids"] for o in mixed[:3]] == [o["output_ids"] for o in plain]
    whole = mixed[3]["output_ids"]
    chunks = list(eng.generate(input_ids=PROMPTS[0], sampling_params=contrastive, stream=True))
    assert [t for c in chunks for t in c["output_ids"]] == whole and chunks[-1]["finished"]
    stop = whole[5]
    stopped = eng.generate(input_ids=PROMPTS[0], sampling_params={**contrastive, "stop_token_ids": [stop]})
    eos = set(eng.tokenizer.eos_token_ids) | {stop}
    assert stopped["output_ids"] == reference(hf, PROMPTS[0], 4, 0.5, 12, eos)
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_constrained_contrastive_search_follows_its_grammar(tiny):
    eng, _ = tiny
    out = eng.generate(input_ids=PROMPTS[1], sampling_params={
        "temperature": 0, "top_k": 3, "penalty_alpha": 0.6, "max_new_tokens": 12, "regex": "(yes|no|maybe)!"})
    assert out["text"] in ("yes!", "no!", "maybe!")


def test_contrastive_search_under_memory_pressure(tmp_path):
    """A small pool and no radix cache: plain requests beside the searches are preempted and resumed, the
    searches' candidates never are, and every output equals a roomy engine's."""
    folder = write_tiny_checkpoint(tmp_path / "m", "llama", seed=2, overrides={"vocab_size": VOCAB})
    prompts = [list(range(10 + i, 60 + i)) for i in range(4)]
    params = [{"temperature": 0, "max_new_tokens": 20, "top_k": 3, "penalty_alpha": 0.6, "ignore_eos": True},
              {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}] * 2
    with Engine(str(folder), tokenizer_path=str(TOKENIZER), device="cpu") as roomy:
        want = roomy.generate(input_ids=prompts, sampling_params=params)
    with Engine(str(folder), tokenizer_path=str(TOKENIZER), device="cpu", max_total_tokens=240,
                chunked_prefill_size=8, max_prefill_tokens=16, disable_radix_cache=True) as tight:
        got = tight.generate(input_ids=prompts, sampling_params=params)
        stats = tight.get_stats()
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    assert stats["preemptions"] > 0, "the pool was small enough to preempt"
    assert stats["kv_slots_free"] == stats["kv_slots_total"]


@pytest.mark.parametrize(("options", "message"), [
    ({"penalty_alpha": 0.5, "top_k": 4}, "temperature"),
    ({"penalty_alpha": 0.5, "temperature": 0}, "top_k > 1"),
    ({"penalty_alpha": 1.5, "top_k": 4, "temperature": 0}, r"\[0, 1\]"),
    ({"penalty_alpha": 0.5, "top_k": 4, "temperature": 0, "num_beams": 2}, "exclude each other"),
    ({"penalty_alpha": 0.5, "top_k": 4, "temperature": 0, "repetition_penalty": 1.2}, "repetition_penalty"),
])
def test_contrastive_options_are_refused_where_they_make_no_sense(options, message):
    with pytest.raises(SamplingParamsError, match=message):
        SamplingParams(**options)


@pytest.mark.gpu
def test_contrastive_search_on_cuda_equals_the_reference(tmp_path):
    """On the GPU (fp32, Triton kernels; the candidates' decode steps replay CUDA graphs that keep the hidden
    states)."""
    folder = write_tiny_checkpoint(tmp_path / "m", "llama", seed=1, overrides={"vocab_size": VOCAB})
    params = {"temperature": 0, "top_k": 4, "penalty_alpha": 0.6, "max_new_tokens": 12}
    with Engine(str(folder), tokenizer_path=str(TOKENIZER), device="cuda", dtype="float32") as eng:
        graphs = eng.runner.graph_runner
        assert graphs is not None
        before = graphs.replays
        ours = eng.generate(input_ids=PROMPTS, sampling_params=params)
        assert graphs.replays - before >= 11  # every step after the first token decodes in a graph
        eos = set(eng.tokenizer.eos_token_ids)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    assert [o["output_ids"] for o in ours] == [reference(hf, p, 4, 0.6, 12, eos) for p in PROMPTS]


# ------------------------------------------------------------------------------------------------ the surfaces
def test_every_surface_returns_the_engines_contrastive_search(tiny):
    """Native /generate (also streamed), OpenAI completions (temperature 0 by default with penalty_alpha; an
    explicit temperature above 0 is a 400) and gen(penalty_alpha=...) give what Engine.generate gives."""
    import json
    import urllib.error
    import urllib.request

    import radixgen as sgl
    from radixgen.server.launch import BackgroundServer
    from radixgen.server.state import ServerSettings

    eng, _ = tiny
    prompt = "The three most important rivers of Europe are"
    options = {"top_k": 4, "penalty_alpha": 0.6, "max_new_tokens": 10}
    eng.flush_cache()
    want = eng.generate(prompt, {"temperature": 0, **options})

    def post(path: str, body: dict) -> tuple[int, dict]:
        req = urllib.request.Request(srv.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    @sgl.function
    def rivers(s):
        s += prompt
        s += sgl.gen("answer", max_tokens=10, top_k=4, penalty_alpha=0.6)

    srv = BackgroundServer(eng, ServerSettings(port=0, owns_engine=False)).start()
    try:
        status, native = post("/generate", {"text": prompt, "sampling_params": {"temperature": 0, **options}})
        assert status == 200 and native["output_ids"] == want["output_ids"] and native["text"] == want["text"]
        status, out = post("/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 10, "top_k": 4,
                                                "penalty_alpha": 0.6})
        assert status == 200 and out["choices"][0]["text"] == want["text"]
        status, out = post("/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 10, "top_k": 4,
                                                "penalty_alpha": 0.6, "temperature": 0.8})
        assert status == 400 and out["error"]["param"] == "temperature"
        for backend in (sgl.EngineBackend(eng), sgl.Endpoint(srv.url)):
            state = rivers.run(backend=backend, temperature=0.9)  # the run's temperature is not the search's
            assert state.error() is None and state["answer"] == want["text"]
    finally:
        srv.stop()
