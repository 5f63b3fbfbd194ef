"""`Tokenizer.encode(continued=True)`: text that continues a sequence gets no prefix space, whichever way the
tokenizer adds one (a Metaspace pre-tokenizer with the `first` scheme, or a `Prepend` normalizer as Llama 2's
files have); byte-level tokenizers, which add none, encode it as usual."""

from __future__ import annotations

import json

import pytest
from grammar_vocabs import TOKENIZERS

from radixgen.tokenizer import Tokenizer

PAIRS = [("Hello world", "}]"), ('{"a": 6', "}]"), ("x", " and more"), ("abc", "def"), ("1", "\n  b")]


def _legacy(tmp_path) -> Tokenizer:
    """Mistral's vocabulary with Llama 2's way of adding the prefix space: normalizers, no pre-tokenizer."""
    spec = json.loads((TOKENIZERS / "mistral-7b-v0.1.tokenizer.json").read_text())
    spec["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    spec["pre_tokenizer"] = None
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    return Tokenizer.from_file(str(path))


@pytest.mark.parametrize("kind", ["metaspace", "prepend"])
def test_a_continuation_is_the_tail_of_the_whole_texts_ids(kind, tmp_path):
    tok = (Tokenizer.from_file(str(TOKENIZERS / "mistral-7b-v0.1.tokenizer.json")) if kind == "metaspace"
           else _legacy(tmp_path))
    for head, tail in PAIRS:
        whole = tok.encode(head + tail, add_special_tokens=False)
        assert tok.encode(head, add_special_tokens=False) + tok.encode(tail, False, continued=True) == whole
    # A fresh text does get the prefix space (Metaspace adds none where the text starts with a space already).
    assert tok.encode("}]", False) != tok.encode("}]", False, continued=True)
    assert (tok.encode(" and", False) == tok.encode(" and", False, continued=True)) == (kind == "metaspace")


def test_byte_level_tokenizers_encode_a_continuation_as_usual():
    tok = Tokenizer.from_file(str(TOKENIZERS / "qwen3" / "tokenizer.json"))
    for _, tail in PAIRS:
        assert tok.encode(tail, False, continued=True) == tok.encode(tail, False)
