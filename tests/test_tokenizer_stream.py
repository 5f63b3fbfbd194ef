"""Streaming detokenization equals full decoding for every prefix, and never takes text back."""

from __future__ import annotations

import random

import pytest

from radixgen.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def byte_level(fixtures_dir) -> Tokenizer:
    return Tokenizer.from_file(fixtures_dir / "tokenizers" / "qwen3")


@pytest.fixture(scope="module")
def sentencepiece(fixtures_dir) -> Tokenizer:
    return Tokenizer.from_file(fixtures_dir / "tokenizers" / "mistral-7b-v0.1.tokenizer.json")


def _random_ids(tok: Tokenizer, rng: random.Random, n: int) -> list[int]:
    """Ids biased towards the hard cases: partial UTF-8 bytes, byte-fallback tokens, special tokens, spaces."""
    raw = [i for i in range(tok.vocab_size) if len(tok.token_bytes(i)) == 1 and tok.token_bytes(i)[0] >= 0x80]
    spaced = [i for i in range(min(tok.vocab_size, 5000)) if tok.token_bytes(i).startswith(b" ")]
    special = sorted(tok.special_token_ids)
    pools = [raw, spaced, special, range(tok.vocab_size)]
    return [rng.choice(rng.choices(pools, weights=[4, 3, 1, 4])[0]) for _ in range(n)]


def _check_stream(tok: Tokenizer, ids: list[int], skip: bool) -> None:
    detok = tok.incremental_detokenizer(skip_special_tokens=skip)
    emitted = ""
    for k, tid in enumerate(ids, start=1):
        emitted += detok.feed(tid)
        full = tok.decode(ids[:k], skip_special_tokens=skip)
        assert full.startswith(emitted), (k, emitted, full)  # final text never changes later
        probe = tok.incremental_detokenizer(skip_special_tokens=skip)
        assert probe.feed_many(ids[:k]) + probe.flush() == full, k
        mixed = tok.incremental_detokenizer(skip_special_tokens=skip)  # one by one, then the rest at once
        head = "".join([mixed.feed(i) for i in ids[: k // 2]])
        assert head + mixed.feed_many(ids[k // 2 : k]) + mixed.flush() == full, k
    assert emitted + detok.flush() == tok.decode(ids, skip_special_tokens=skip)
    assert detok.text == tok.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("skip", [False, True])
def test_stream_matches_decode_byte_level(byte_level, seed, skip):
    _check_stream(byte_level, _random_ids(byte_level, random.Random(seed), 60), skip)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("skip", [False, True])
def test_stream_matches_decode_sentencepiece(sentencepiece, seed, skip):
    _check_stream(sentencepiece, _random_ids(sentencepiece, random.Random(seed), 60), skip)


def test_stream_of_real_text(byte_level, sentencepiece):
    text = " Héllo wörld 😀👨‍👩‍👧 中文\n  code = {'a': 1}  "
    for tok in (byte_level, sentencepiece):
        detok = tok.incremental_detokenizer()
        deltas = [detok.feed(i) for i in tok.encode(text, add_special_tokens=False)]
        assert "".join(deltas) + detok.flush() == tok.decode(tok.encode(text, add_special_tokens=False))
        assert all("\ufffd" not in d for d in deltas)  # a split character is held back, never emitted broken


def test_emoji_bytes_are_held_until_complete(byte_level):
    ids = byte_level.encode("😀", add_special_tokens=False)
    pieces = [byte_level.token_bytes(i) for i in ids]
    assert b"".join(pieces) == "😀".encode()
    detok = byte_level.incremental_detokenizer()
    out = [detok.feed(i) for i in ids]
    assert out[-1] == "😀" and all(o == "" for o in out[:-1])


def test_sentencepiece_leading_space_dropped_once(sentencepiece):
    ids = sentencepiece.encode("Hello world", add_special_tokens=False)
    detok = sentencepiece.incremental_detokenizer()
    assert [detok.feed(i) for i in ids] == ["Hello", " world"]


def test_stream_cost_is_linear(byte_level):
    """Feeding n ids costs O(n): 10x more ids may not take much more than 10x the CPU time."""
    import time

    ids = byte_level.encode("streaming text with words and 😀 emoji " * 800, add_special_tokens=False)

    def run(n: int) -> float:
        detok = byte_level.incremental_detokenizer()
        start = time.process_time()  # CPU time: neighbours on a shared machine do not count
        for tid in ids[:n]:
            detok.feed(tid)
        return time.process_time() - start

    small = min(run(len(ids) // 10) for _ in range(3))
    large = min(run(len(ids)) for _ in range(3))
    assert large < 30 * small + 0.005  # quadratic would be ~100x
