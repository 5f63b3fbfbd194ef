"""The decoded-weights cache of quantized GGUF files: a second load reads the cache and gives the same model."""

from __future__ import annotations

import os

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from model_fixtures import write_tiny_checkpoint
from test_loader_gguf import write_gguf

from radixgen.runtime.loader import gguf_file as gguf_loader
from radixgen.runtime.loader import load_model


@pytest.fixture()
def quantized_gguf(tmp_path):
    return write_gguf(tmp_path / "m.gguf", write_tiny_checkpoint(tmp_path / "hf", "llama"), "llama", Q.Q8_0)


def _decodes(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = gguf_loader.load_gguf_weights
    monkeypatch.setattr("radixgen.runtime.loader.load_gguf_weights",
                        lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    return calls


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_second_load_reads_the_cache(quantized_gguf, tmp_path, monkeypatch):
    decodes = _decodes(monkeypatch)
    first, _ = load_model(quantized_gguf, weight_cache_dir=tmp_path / "cache")
    second, _ = load_model(quantized_gguf, weight_cache_dir=tmp_path / "cache")
    assert len(decodes) == 1
    assert len(list((tmp_path / "cache" / "weights").glob("*.safetensors"))) == 1
    assert _same(first, second)
    assert _same(first, load_model(quantized_gguf)[0])  # and both equal an uncached load


def test_a_changed_file_or_dtype_is_decoded_again(quantized_gguf, tmp_path, monkeypatch):
    decodes = _decodes(monkeypatch)
    load_model(quantized_gguf, weight_cache_dir=tmp_path / "cache")
    load_model(quantized_gguf, weight_cache_dir=tmp_path / "cache", dtype=torch.bfloat16)
    stat = quantized_gguf.stat()
    os.utime(quantized_gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    load_model(quantized_gguf, weight_cache_dir=tmp_path / "cache")
    assert len(decodes) == 3
    assert len(list((tmp_path / "cache" / "weights").glob("*.safetensors"))) == 2  # the older fp32 one is gone


def test_a_corrupt_cache_file_falls_back_to_decoding(quantized_gguf, tmp_path, monkeypatch):
    reference, _ = load_model(quantized_gguf, weight_cache_dir=tmp_path / "cache")
    (cached,) = (tmp_path / "cache" / "weights").glob("*.safetensors")
    cached.write_bytes(cached.read_bytes()[:100])
    decodes = _decodes(monkeypatch)
    again, _ = load_model(quantized_gguf, weight_cache_dir=tmp_path / "cache")
    assert len(decodes) == 1 and _same(reference, again)


def test_unquantized_files_are_not_cached(tmp_path):
    path = write_gguf(tmp_path / "f.gguf", write_tiny_checkpoint(tmp_path / "hf", "llama"), "llama", Q.F32)
    load_model(path, weight_cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_a_bf16_cache_reads_back_exactly(quantized_gguf, tmp_path, monkeypatch):
    first, _ = load_model(quantized_gguf, weight_cache_dir=tmp_path / "cache", dtype=torch.bfloat16)
    decodes = _decodes(monkeypatch)
    second, _ = load_model(quantized_gguf, weight_cache_dir=tmp_path / "cache", dtype=torch.bfloat16)
    assert not decodes and _same(first, second)
