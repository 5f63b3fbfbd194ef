"""Our GGUF header reader equals the `gguf` package's on the default model, and refuses broken files."""

from __future__ import annotations

import numpy as np
import pytest

from radixgen.runtime.gguf_reader import GGUFFile, GGUFFormatError


def test_metadata_and_tensors_equal_the_gguf_package(default_model_path):
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize

    ours = GGUFFile(default_model_path)
    ref = gguf.GGUFReader(str(default_model_path))
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue  # the package's synthetic header fields
        want, got = field.contents(), ours.metadata[key]
        if isinstance(want, list) and want and isinstance(want[0], float):
            np.testing.assert_allclose(got, want)
        else:
            assert got == pytest.approx(want) if isinstance(want, float) else got == want, key
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(ref.tensors[:40], ours.tensors[:40]):
        assert tuple(int(x) for x in a.shape) == b.shape and int(a.tensor_type) == b.tensor_type
        np.testing.assert_array_equal(dequantize(a.data, a.tensor_type), dequantize(b.data, b.tensor_type))


def test_truncated_and_foreign_files_are_refused(default_model_path, tmp_path):
    data = default_model_path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(GGUFFormatError, match="truncated"):
        GGUFFile(cut)
    head = tmp_path / "head.gguf"
    head.write_bytes(data[:1000])
    with pytest.raises(GGUFFormatError, match="truncated"):
        GGUFFile(head)
    foreign = tmp_path / "x.gguf"
    foreign.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(GGUFFormatError, match="not a GGUF"):
        GGUFFile(foreign)
