"""A model whose vocabulary is larger than its tokenizer's (embedding padded, as Qwen2's 151,936 rows for 151,665
tokens): padding ids are never sampled nor reported as top logprobs, an unknown id decodes to nothing, and a
tokenizer larger than the model's vocabulary is refused at engine start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from radixgen.runtime.errors import ModelLoadError, TokenizerMismatchError
from radixgen.runtime.sampler import Sampler
from radixgen.runtime.sampling_batch import SamplingBatch
from radixgen.runtime.sampling_params import SamplingParams as SP
from radixgen.runtime.tokenizer_fit import check_tokenizer_fits
from radixgen.tokenizer import Tokenizer

MODEL_VOCAB = 96  # logits columns
TOKENS = 70  # the tokenizer's ids: 70..95 are padding
PAD = 90

# Each row's options; a padding id gets a large logit bias (and the random logits favour padding columns).
SAMPLING = {
    "greedy": SP(temperature=0),
    "greedy_biased": SP(temperature=0, logit_bias={PAD: 100.0}),
    "temperature": SP(temperature=1.0),
    "hot_biased": SP(temperature=2.0, logit_bias={PAD: 100.0, PAD + 1: 50.0}),
    "top_k": SP(temperature=1.0, top_k=40),
    "top_p": SP(temperature=1.0, top_p=0.9),
    "min_p": SP(temperature=1.0, min_p=0.01),
    "penalties": SP(temperature=1.0, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.5),
    "min_tokens": SP(temperature=1.0, min_new_tokens=5, logit_bias={PAD: 20.0}),
}


def _padded_logits(rows: int, seed: int) -> torch.Tensor:
    logits = torch.randn(rows, MODEL_VOCAB, generator=torch.Generator().manual_seed(seed))
    logits[:, TOKENS:] += 8.0  # the padding columns would win nearly every draw if they could be drawn
    return logits


@pytest.mark.parametrize("name", sorted(SAMPLING))
@pytest.mark.parametrize("logprobs", [False, True])
def test_sampler_never_draws_a_padding_id(name, logprobs):
    params = [SAMPLING[name]] * 4
    sampler = Sampler(MODEL_VOCAB, seed=3, token_count=TOKENS)
    batch = SamplingBatch.build(params, MODEL_VOCAB, eos_token_ids=[2], return_logprob=[logprobs] * 4,
                                top_logprobs_num=[5] * 4)
    for step in range(50):
        out = sampler.sample(batch, _padded_logits(4, step))
        assert int(out.next_token_ids.max()) < TOKENS
        if logprobs:
            assert out.next_token_logprobs is not None and torch.isfinite(out.next_token_logprobs).all()
            assert out.top_logprobs_ids is not None and int(out.top_logprobs_ids.max()) < TOKENS
        batch.append(out.next_token_ids)


def test_padding_ids_get_no_probability_mass():
    """Logprobs are the distribution over the tokenizer's ids: the same as for logits cut to its size."""
    logits = _padded_logits(3, 0)
    batch = SamplingBatch.build([SP(temperature=1.0)] * 3, MODEL_VOCAB, return_logprob=[True] * 3,
                                top_logprobs_num=[TOKENS] * 3)
    out = Sampler(MODEL_VOCAB, token_count=TOKENS).sample(batch, logits)
    assert out.top_logprobs_values is not None and out.top_logprobs_ids is not None
    want = torch.log_softmax(logits[:, :TOKENS], dim=-1).gather(1, out.top_logprobs_ids)
    torch.testing.assert_close(out.top_logprobs_values, want)


def test_grammar_mask_allowing_padding_ids_still_never_draws_them():
    words = (MODEL_VOCAB + 31) // 32
    allow_all = torch.full((2, words), -1, dtype=torch.int32)
    sampler = Sampler(MODEL_VOCAB, seed=1, token_count=TOKENS)
    batch = SamplingBatch.build([SP(temperature=1.0), SP(temperature=0)], MODEL_VOCAB)
    for step in range(30):
        out = sampler.sample(batch, _padded_logits(2, step), allow_all)
        assert int(out.next_token_ids.max()) < TOKENS


def test_without_a_token_count_every_id_can_be_drawn():
    batch = SamplingBatch.build([SP(temperature=0)], MODEL_VOCAB)
    logits = torch.zeros(1, MODEL_VOCAB)
    logits[0, PAD] = 1.0
    assert int(Sampler(MODEL_VOCAB).sample(batch, logits).next_token_ids) == PAD
    assert int(Sampler(MODEL_VOCAB, token_count=10 * MODEL_VOCAB).sample(batch, logits).next_token_ids) == PAD


# ---------------------------------------------------------------------------------------- decoding unknown ids


@pytest.mark.parametrize("name", ["qwen3", "mistral-7b-v0.1.tokenizer.json"])
def test_ids_past_the_vocabulary_decode_to_nothing(fixtures_dir, name):
    tok = Tokenizer.from_file(fixtures_dir / "tokenizers" / name)
    n = tok.vocab_size
    ids = tok.encode("héllo wörld 😀 ok", add_special_tokens=False)
    padded = [n, *ids[:3], n + 1, n + 200, *ids[3:], n]
    assert tok.decode(padded) == tok.decode(ids)
    assert tok.decode(padded, skip_special_tokens=True) == tok.decode(ids, skip_special_tokens=True)
    assert tok.decode([n]) == "" and tok.token_bytes(n) == b"" and tok.id_to_token(n) == ""
    detok = tok.incremental_detokenizer()
    streamed = [detok.feed(i) for i in padded]
    assert streamed[0] == "" and "".join(streamed) + detok.flush() == tok.decode(ids)


def test_an_unknown_id_inside_a_byte_run_does_not_split_the_character(fixtures_dir):
    tok = Tokenizer.from_file(fixtures_dir / "tokenizers" / "mistral-7b-v0.1.tokenizer.json")
    first, second = tok.token_to_id("<0xC3>"), tok.token_to_id("<0xA9>")  # "é" as two byte tokens
    assert first is not None and second is not None
    ids = [first, tok.vocab_size + 3, second]
    detok = tok.incremental_detokenizer()
    assert tok.decode(ids) == "é" == detok.feed_many(ids) + detok.flush()


# ---------------------------------------------------------------------------------------- the engine


def test_tokenizer_larger_than_the_model_is_refused():
    check_tokenizer_fits(151_936, 151_665, "auto")  # padded embedding: fine
    check_tokenizer_fits(1000, 151_669, "dummy")  # random weights may borrow any tokenizer
    with pytest.raises(TokenizerMismatchError) as err:
        check_tokenizer_fits(32_000, 32_002, "auto")
    assert isinstance(err.value, ModelLoadError)
    message = str(err.value)
    assert "\n" not in message and "32,002" in message and "32,000" in message


def _write_char_tokenizer(folder: Path, size: int) -> None:
    """A character-level tokenizer.json of `size` ids: printable ASCII, then '<|end|>' (EOS), then filler."""
    chars = [chr(c) for c in range(32, 127)]
    vocab = {ch: i for i, ch in enumerate(chars[: size - 1])}
    filler = [f"<f{i}>" for i in range(size - 1 - len(vocab))]
    vocab.update({t: len(vocab) for t in filler})
    end = {"id": size - 1, "content": "<|end|>", "special": True, "normalized": False, "single_word": False,
           "lstrip": False, "rstrip": False}
    spec = {"version": "1.0", "added_tokens": [end], "normalizer": None, "pre_tokenizer": None,
            "post_processor": None, "decoder": None,
            "model": {"type": "BPE", "vocab": {**vocab, "<|end|>": size - 1}, "merges": []}}
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>"}))


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A random Llama checkpoint with 256 vocabulary rows (config vocab_size)."""
    pytest.importorskip("transformers")
    from model_fixtures import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("padded") / "llama", "llama", seed=5)


def test_engine_never_samples_a_padding_id(tiny_checkpoint, tmp_path):
    from radixgen.runtime.engine import Engine

    tokens = 80  # ids 80..255 are padding rows of the random model
    _write_char_tokenizer(tmp_path, tokens)
    params = [
        {"temperature": 1.0, "max_new_tokens": 40, "ignore_eos": True, "seed": 1},
        {"temperature": 1.0, "max_new_tokens": 40, "ignore_eos": True, "logit_bias": {200: 100.0}},
        {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True, "logit_bias": {255: 100.0}},
    ]
    scoring = {"temperature": 1.5, "top_k": 50, "max_new_tokens": 40, "ignore_eos": True}
    with Engine(str(tiny_checkpoint), tokenizer_path=str(tmp_path), device="cpu", max_total_tokens=1024) as engine:
        outs = engine.generate(["hello world"] * len(params), params)
        scored = engine.generate("hello", scoring, return_logprob=True, top_logprobs_num=5)
    decode = Tokenizer.from_file(tmp_path).decode
    for out in [*outs, scored]:
        assert len(out["output_ids"]) == 40 and max(out["output_ids"]) < tokens
        assert out["text"] == decode(out["output_ids"], skip_special_tokens=True)
    tops = [entry for step in scored["meta_info"]["output_top_logprobs"] for entry in step]
    assert tops and all(token_id < tokens for _, token_id in tops)


def test_engine_refuses_a_tokenizer_larger_than_the_model(tiny_checkpoint, tmp_path):
    from radixgen.runtime.engine import Engine

    _write_char_tokenizer(tmp_path, 300)
    with pytest.raises(TokenizerMismatchError, match=r"300 ids .* 256"):
        Engine(str(tiny_checkpoint), tokenizer_path=str(tmp_path), device="cpu", max_total_tokens=1024)
