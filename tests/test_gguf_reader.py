"""The GGUF parser equals the `gguf` package on the default model, tokenizer arrays included, and refuses
broken files with one line naming the file."""

from __future__ import annotations

import numpy as np
import pytest

from radixgen.tokenizer.loaders.gguf_reader import GGUFFormatError, read_gguf


def test_metadata_and_tensors_equal_the_gguf_package(default_model_path):
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize

    ours = read_gguf(default_model_path, decode_arrays=lambda key: key.startswith("tokenizer."))
    ref = gguf.GGUFReader(str(default_model_path))
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue  # the package's synthetic header fields
        want, got = field.contents(), ours.metadata[key]
        if isinstance(want, list) and want and isinstance(want[0], float):
            np.testing.assert_allclose(got, want)
        elif isinstance(want, float):
            assert got == pytest.approx(want), key
        else:
            assert got == want, key
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(ref.tensors[:40], ours.tensors[:40]):
        np.testing.assert_array_equal(dequantize(a.data, a.tensor_type), dequantize(b.data, b.tensor_type))


def test_long_arrays_are_skipped_unless_asked_for(default_model_path):
    lean = read_gguf(default_model_path)
    assert "tokenizer.ggml.tokens" not in lean.metadata
    assert lean.array_lengths["tokenizer.ggml.tokens"] == 49152


def test_truncated_and_foreign_files_are_refused(default_model_path, tmp_path):
    data = default_model_path.read_bytes()
    for name, blob in [("cut.gguf", data[: len(data) // 2]), ("head.gguf", data[:1000])]:
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(GGUFFormatError, match="truncated"):
            read_gguf(tmp_path / name)
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(GGUFFormatError, match="not a GGUF"):
        read_gguf(tmp_path / "x.gguf")
