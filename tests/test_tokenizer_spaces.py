"""SentencePiece-style vocabularies (Llama 2, Mistral) around spaces: ids and decoded text byte-identical to Hugging
Face `tokenizers` for every way a tokenizer.json spells the leading '▁' (Metaspace with each prepend scheme, with
and without split; Llama 2's Prepend + Replace normalizer, with special tokens matched raw or normalized), and
for a GGUF "llama" vocabulary against transformers' conversion of the same file."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest

from radixgen.tokenizer import Tokenizer

hf = pytest.importorskip("tokenizers")

TEXTS = [
    "", " ", "  ", "   ", " Hello", "  Hello", "   Hello", " (", "  (x)", "\n Hello", " \n ", "\t Hi", "Hello",
    "Hello world", "Hello  world", "Hello   world ", "end ", "end  ", "a\n\n b", "▁Hello", " ▁", "1 2  3",
    " 😀 ", "x\u00a0y", "<s> Hello", "<s>  Hello", " <s>", "Hi <s> there", "Hi</s> (", "x<s>y", "<unk> world",
    "</s>\n </s>", "<s><s> a",
]
FRAGMENTS = [" ", " ", "  ", "\n", "\t", "(", ")", "Hello", "world", "a", "▁", "<s>", "</s>", "<unk>", "😀", "é",
             ".", "1", "\u00a0", "\r", "x y"]

LLAMA2_NORMALIZER = {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
BOS_PROCESSOR = {
    "type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
             {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
}


def _metaspace(scheme: str, split: bool) -> dict:
    return {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": split}


# name -> (normalizer, pre_tokenizer, added tokens matched in normalized text)
PIPELINES = {
    "mistral_as_shipped": (None, _metaspace("first", False), False),
    "metaspace_first_split": (None, _metaspace("first", True), False),
    "metaspace_always": (None, _metaspace("always", False), False),
    "metaspace_always_split": (None, _metaspace("always", True), False),
    "metaspace_never": (None, _metaspace("never", False), False),
    "metaspace_legacy_fields": (None, {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True}, False),
    "llama2_normalizer": (LLAMA2_NORMALIZER, None, False),
    # Hugging Face looks for normalized added tokens as the normalizer spells them: "<s>" only as "▁<s>"
    "llama2_normalizer_normalized_specials": (LLAMA2_NORMALIZER, None, True),
}


@pytest.fixture(scope="module")
def mistral_json(fixtures_dir) -> dict:
    return json.loads((fixtures_dir / "tokenizers" / "mistral-7b-v0.1.tokenizer.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module", params=sorted(PIPELINES))
def pipeline(request, mistral_json, tmp_path_factory):
    normalizer, pre_tokenizer, normalized_specials = PIPELINES[request.param]
    spec = copy.deepcopy(mistral_json)
    spec["normalizer"], spec["pre_tokenizer"], spec["post_processor"] = normalizer, pre_tokenizer, BOS_PROCESSOR
    for token in spec["added_tokens"]:
        token["normalized"] = normalized_specials
    path = tmp_path_factory.mktemp(request.param) / "tokenizer.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    return request.param, Tokenizer.from_file(path), hf.Tokenizer.from_file(str(path))


def _check(name: str, ours: Tokenizer, ref, texts: list[str]) -> None:
    for text in texts:
        for special in (False, True):
            want = ref.encode(text, add_special_tokens=special)
            got = ours.encode(text, add_special_tokens=special)
            assert got == want.ids, (name, text, special, [ours.id_to_token(i) for i in got], want.tokens)
        ids = ref.encode(text, add_special_tokens=True).ids
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=False), (name, text)
        # (with normalized special tokens Hugging Face's decode no longer recognises them as special, so
        # skip_special_tokens keeps them; that quirk is not copied)
        if name != "llama2_normalizer_normalized_specials":
            assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True), (name, text)


def test_leading_spaces_match_hf(pipeline):
    _check(*pipeline, TEXTS)


def test_random_space_heavy_text_matches_hf(pipeline):
    rng = random.Random(0)
    texts = ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 12))) for _ in range(400)]
    _check(*pipeline, texts)


# ------------------------------------------------------------------------------------------------ GGUF


def _write_sentencepiece_gguf(path: Path, model_file: Path, architecture: str) -> Path:
    """A GGUF holding only the tokenizer metadata llama.cpp's converter writes for a SentencePiece model."""
    gguf = pytest.importorskip("gguf")
    model_pb2 = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
    proto = model_pb2.ModelProto()
    proto.ParseFromString(model_file.read_bytes())
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([p.piece for p in proto.pieces])
    writer.add_token_scores([p.score for p in proto.pieces])
    writer.add_token_types([p.type for p in proto.pieces])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("architecture", ["llama", "phi3"])  # phi3: transformers prepends '▁' by a normalizer
def test_gguf_sentencepiece_vocabulary_matches_transformers(fixtures_dir, tmp_path, architecture):
    transformers = pytest.importorskip("transformers")
    model_file = fixtures_dir / "tokenizers" / "mistral-7b-v0.1.tokenizer.model"
    path = _write_sentencepiece_gguf(tmp_path / "spm.gguf", model_file, architecture)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name).backend_tokenizer
    rng = random.Random(1)
    texts = TEXTS + ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 10))) for _ in range(200)]
    _check(architecture, Tokenizer.from_file(path), ref, texts)
