"""Byte-identical ids and decoded text against the reference libraries, over a 1 MB varied corpus.

References (test-only): Hugging Face `tokenizers` for Qwen3's tokenizer.json, tiktoken for GPT-2's ranks,
transformers' conversion of Mistral's SentencePiece model, and transformers' GGUF loader for SmolLM2.
"""

from __future__ import annotations

import shutil

import pytest
from test_tokenizer_corpus import make_documents

from radixgen.tokenizer import Tokenizer
from radixgen.tokenizer.patterns import GPT2

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return make_documents(1 << 20, seed=0)


@pytest.fixture(scope="module")
def qwen(fixtures_dir):
    from tokenizers import Tokenizer as HFTokenizer

    path = fixtures_dir / "tokenizers" / "qwen3"
    ref = HFTokenizer.from_file(str(path / "tokenizer.json"))
    return (
        Tokenizer.from_file(path),
        ref.encode,
        lambda ids, skip=False: ref.decode(ids, skip_special_tokens=skip),
    )


@pytest.fixture(scope="module")
def gpt2(fixtures_dir):
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    path = fixtures_dir / "tokenizers" / "r50k_base.tiktoken"
    ref = tiktoken.Encoding(
        "r50k",
        pat_str=GPT2,
        mergeable_ranks=load_tiktoken_bpe(str(path)),
        special_tokens={"<|endoftext|>": 50256},
    )

    class Ref:
        @staticmethod
        def encode(text, add_special_tokens=False):
            return ref.encode(text, allowed_special="all")

    return (
        Tokenizer.from_file(path, pattern="gpt2"),
        lambda t, add_special_tokens=False: _Ids(Ref.encode(t)),
        (lambda ids, skip=False: ref.decode([i for i in ids if not (skip and i == 50256)])),
    )


@pytest.fixture(scope="module")
def mistral(fixtures_dir, tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("sentencepiece")
    folder = tmp_path_factory.mktemp("mistral")
    shutil.copy(fixtures_dir / "tokenizers" / "mistral-7b-v0.1.tokenizer.model", folder / "tokenizer.model")
    ref = transformers.LlamaTokenizer.from_pretrained(str(folder)).backend_tokenizer
    ref.save(str(folder / "tokenizer.json"))
    return (
        Tokenizer.from_file(folder / "tokenizer.json"),
        ref.encode,
        (lambda ids, skip=False: ref.decode(ids, skip_special_tokens=skip)),
    )


@pytest.fixture(scope="module")
def smollm2(fixtures_dir):
    transformers = pytest.importorskip("transformers")
    from tokenizers import pre_tokenizers

    folder = fixtures_dir / "tokenizers"
    name = "smollm2-135m-instruct.tokenizer.gguf"
    ref = transformers.AutoTokenizer.from_pretrained(str(folder), gguf_file=name).backend_tokenizer
    # transformers' GGUF reader ignores llama.cpp's pre-tokenizer name "smollm" and splits like GPT-2; SmolLM2's
    # own tokenizer.json (and llama.cpp) first split every digit apart. We follow the model; so does the reference.
    ref.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    return (
        Tokenizer.from_file(folder / name),
        ref.encode,
        lambda ids, skip=False: ref.decode(ids, skip_special_tokens=skip),
    )


class _Ids:
    def __init__(self, ids):
        self.ids = ids


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _check_corpus(bundle, docs: list[str]) -> None:
    ours, ref_encode, ref_decode = bundle
    for n, doc in enumerate(docs):
        want = ref_encode(doc, add_special_tokens=False).ids
        got = ours.encode(doc, add_special_tokens=False)
        if got != want:
            i = _first_difference(got, want)
            context = ours.decode(want[max(0, i - 8) : i + 8])
            pytest.fail(
                f"doc {n}: ids differ at {i} near {context!r}: ours {got[i : i + 6]} reference {want[i : i + 6]}"
            )
        assert ours.decode(want) == ref_decode(want), f"doc {n}: decoded text differs"
        if n % 16 == 0:
            assert ours.decode(want, skip_special_tokens=True) == ref_decode(want, True), (
                f"doc {n}: skip-special decode"
            )


@pytest.mark.parametrize("name", ["qwen", "gpt2", "mistral", "smollm2"])
def test_corpus_parity(name, request, corpus):
    _check_corpus(request.getfixturevalue(name), corpus)


SAMPLES = [
    "",
    " ",
    "Hello world",
    "  leading spaces and trailing  ",
    "<s>Hello</s> world <|im_start|>user\nhi<|im_end|>\n",
    "<|endoftext|>",
    "x" * 5000,
    "1234567890" * 300,
    "\n\n\n\t\t  \r\n",
    "😀👨‍👩‍👧‍👦🇫🇷 中文 العربية",
]


@pytest.mark.parametrize("name", ["qwen", "mistral", "smollm2"])
def test_special_tokens_added_like_reference(name, request):
    ours, ref_encode, _ = request.getfixturevalue(name)
    for text in SAMPLES:
        assert ours.encode(text, add_special_tokens=True) == ref_encode(text, add_special_tokens=True).ids, (
            text
        )


def test_qwen_special_ids(qwen):
    tok = qwen[0]
    assert tok.vocab_size == 151669
    assert tok.eos_token_id == tok.token_to_id("<|im_end|>") == 151645
    assert tok.pad_token_id == 151643
    assert tok.bos_token_id is None and not tok.add_bos_token
    assert 151645 in tok.eos_token_ids
    assert tok.chat_template and "<|im_start|>" in tok.chat_template


def test_smollm2_gguf_metadata(smollm2):
    tok = smollm2[0]
    assert tok.vocab_size == 49152
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    assert tok.eos_token_ids == {2}
    assert tok.encode("hi", add_special_tokens=True) == tok.encode(
        "hi", add_special_tokens=False
    )  # add_bos false
    assert "<|im_start|>" in tok.chat_template
