"""Component tests: pre-tokenizers, normalizers, added-token options, BPE merge paths, loaders, byte tables."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixgen.tokenizer import Tokenizer
from radixgen.tokenizer import bpe as bpe_module
from radixgen.tokenizer import tokenizer as tokenizer_module
from radixgen.tokenizer.byte_level import BYTE_TO_CHAR, alphabet_to_bytes, bytes_to_alphabet
from radixgen.tokenizer.normalizers import build_normalizer
from radixgen.tokenizer.pretokenizers import build_pretokenizer

hf = pytest.importorskip("tokenizers")
from tokenizers import Regex
from tokenizers import normalizers as hf_normalizers
from tokenizers import pre_tokenizers as hf_pre

TEXTS = [
    "ab12cd x3 ",
    "hello  world\n\n  foo123bar 4 5",
    " leading and trailing ",
    "x",
    "",
    "12 34 56",
    "multi\r\n\r\nline\tTabs\t\t",
    "ünïcödé ½ ² ٣ 中文",
]


@pytest.fixture(scope="module")
def gpt2(fixtures_dir) -> Tokenizer:
    return Tokenizer.from_file(fixtures_dir / "tokenizers" / "r50k_base.tiktoken", pattern="gpt2")


@pytest.fixture(scope="module")
def mistral(fixtures_dir) -> Tokenizer:
    return Tokenizer.from_file(fixtures_dir / "tokenizers" / "mistral-7b-v0.1.tokenizer.json")


def _ours_pre(hf_obj, text: str) -> list[str]:
    spec = json.loads(hf_obj.__getstate__())
    pre = build_pretokenizer(spec)
    pieces = pre(text, True)
    return [bytes_to_alphabet(p.encode()) for p in pieces] if pre.byte_level else pieces


@pytest.mark.parametrize(
    "behavior", ["isolated", "removed", "merged_with_previous", "merged_with_next", "contiguous"]
)
@pytest.mark.parametrize("invert", [False, True])
@pytest.mark.parametrize("pattern", [r"\d", r"\d+|x", r"\s+"])
def test_split_behaviours_match_hf(behavior, invert, pattern):
    split = hf_pre.Split(Regex(pattern), behavior=behavior, invert=invert)
    for text in TEXTS:
        assert _ours_pre(split, text) == [p for p, _ in split.pre_tokenize_str(text)], (text, behavior)


@pytest.mark.parametrize(
    "pre",
    [
        hf_pre.Metaspace(replacement="▁", prepend_scheme="always", split=True),
        hf_pre.Metaspace(replacement="▁", prepend_scheme="first", split=True),
        hf_pre.Metaspace(replacement="▁", prepend_scheme="never", split=False),
        hf_pre.Digits(individual_digits=True),
        hf_pre.Digits(individual_digits=False),
        hf_pre.ByteLevel(add_prefix_space=True, use_regex=True),
        hf_pre.ByteLevel(add_prefix_space=False, use_regex=True),
        hf_pre.WhitespaceSplit(),
        hf_pre.Sequence([hf_pre.Digits(individual_digits=True), hf_pre.ByteLevel(add_prefix_space=False)]),
    ],
    ids=lambda p: type(p).__name__,
)
def test_pretokenizers_match_hf(pre):
    for text in TEXTS:
        assert _ours_pre(pre, text) == [p for p, _ in pre.pre_tokenize_str(text)], text


@pytest.mark.parametrize(
    "norm",
    [
        hf_normalizers.NFC(),
        hf_normalizers.NFKC(),
        hf_normalizers.NFD(),
        hf_normalizers.Lowercase(),
        hf_normalizers.Prepend("▁"),
        hf_normalizers.Replace(" ", "▁"),
        hf_normalizers.Replace(Regex(r"\s+"), " "),
        hf_normalizers.Strip(),
        hf_normalizers.Sequence(
            [hf_normalizers.NFKC(), hf_normalizers.Prepend("▁"), hf_normalizers.Replace(" ", "▁")]
        ),
    ],
    ids=lambda n: type(n).__name__,
)
def test_normalizers_match_hf(norm):
    ours = build_normalizer(json.loads(norm.__getstate__()))
    for text in [*TEXTS, " Ｈello ﬁ e\u0301 ", "ÅΣ"]:
        assert ours(text) == norm.normalize_str(text), text


def _tiny_trained(tmp_path, *, pre, decoder, normalizer=None, byte_fallback=False, unk=None):
    """A small BPE tokenizer trained by HF on our corpus, with added tokens using every option."""
    from test_tokenizer_corpus import make_corpus
    from tokenizers import AddedToken, models, trainers

    tok = hf.Tokenizer(models.BPE(byte_fallback=byte_fallback, unk_token=unk, fuse_unk=unk is not None))
    tok.pre_tokenizer = pre
    tok.decoder = decoder
    if normalizer is not None:
        tok.normalizer = normalizer
    alphabet = hf_pre.ByteLevel.alphabet() if isinstance(pre, hf_pre.ByteLevel) else []
    specials = [unk] if unk else []
    trainer = trainers.BpeTrainer(
        vocab_size=800, initial_alphabet=alphabet, special_tokens=specials, show_progress=False
    )
    tok.train_from_iterator(make_corpus(1 << 16, seed=5).split("\n\n"), trainer)
    if byte_fallback:
        tok.add_tokens([f"<0x{b:02X}>" for b in range(256)])
    tok.add_special_tokens(
        [
            AddedToken("<tool>", lstrip=True, special=True),
            AddedToken("[MASK]", rstrip=True, special=True),
            AddedToken("<|end|>", special=True),
        ]
    )
    tok.add_tokens(
        [AddedToken("word", single_word=True, normalized=False), AddedToken("hello", normalized=True)]
    )
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return tok, path


ADDED_TEXTS = [
    "a  <tool>  b [MASK]   c<|end|>d",
    "word words sword word. <tool>",
    "HELLO hello Hello hellohello",
    "x [MASK]\n\n y   <tool>",
    "unknown ✓ chars 🧪 here",
]


def test_added_token_options_byte_level(tmp_path):
    ref, path = _tiny_trained(
        tmp_path,
        pre=hf_pre.ByteLevel(add_prefix_space=False),
        decoder=hf.decoders.ByteLevel(),
        normalizer=hf_normalizers.Lowercase(),
    )
    ours = Tokenizer.from_file(path)
    for text in ADDED_TEXTS:
        assert ours.encode(text) == ref.encode(text).ids, text
        assert ours.decode(ref.encode(text).ids) == ref.decode(
            ref.encode(text).ids, skip_special_tokens=False
        )


def test_sentencepiece_style_with_unknown_tokens(tmp_path):
    ref, path = _tiny_trained(
        tmp_path,
        pre=hf_pre.Metaspace(replacement="▁", prepend_scheme="always", split=True),
        decoder=hf.decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True),
        unk="<unk>",
    )
    ours = Tokenizer.from_file(path)
    assert ours.model.unk_id is not None and ours.model.fuse_unk
    for text in ADDED_TEXTS:
        ids = ref.encode(text).ids
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=False), text
        assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True), text


def test_ignore_merges_matches_hf(tmp_path):
    ref, path = _tiny_trained(
        tmp_path, pre=hf_pre.ByteLevel(add_prefix_space=False), decoder=hf.decoders.ByteLevel()
    )
    data = json.loads(path.read_text())
    data["model"]["ignore_merges"] = True
    # a token that merges would not reach from its bytes: only ignore_merges can produce it
    data["model"]["vocab"]["Ġqzx"] = max(data["model"]["vocab"].values()) + 1000
    data["added_tokens"] = []
    path.write_text(json.dumps(data))
    ref = hf.Tokenizer.from_file(str(path))
    ours = Tokenizer.from_file(path)
    for text in [" qzx", "the qzx of the", *ADDED_TEXTS]:
        assert ours.encode(text) == ref.encode(text).ids, text
    assert ours.encode(" qzx") == [data["model"]["vocab"]["Ġqzx"]]


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=2, max_size=600))
def test_heap_merge_equals_scan_merge(gpt2, data):
    symbols = [gpt2.model.vocab[BYTE_TO_CHAR[b]] for b in data]
    heap = gpt2.model._merge_heap(list(symbols))
    old = bpe_module.LONG_WORD
    try:
        bpe_module.LONG_WORD = 10**9
        scan = gpt2.model.merge(list(symbols))
    finally:
        bpe_module.LONG_WORD = old
    assert heap == scan


def test_sentencepiece_word_cuts_are_exact(mistral):
    """Cutting words before '▁' runs (an optimisation) gives the same ids as one BPE over the whole text."""
    assert mistral._word_split is not None
    rng = random.Random(0)
    words = ["▁the", "▁▁", "▁a", "bc", "▁▁▁▁", "x", "▁中文", "😀", "▁", "ing", "▁1234"]
    for _ in range(50):
        word = "".join(rng.choices(words, k=rng.randint(1, 30)))
        whole = mistral.model.merge(mistral.model.initial_symbols(word))
        cut = [i for piece in mistral._word_split.split(word) for i in mistral.model.encode_word(piece)]
        assert cut == whole, word


def test_token_bytes(gpt2, mistral):
    assert gpt2.token_bytes(gpt2.token_to_id("Ġhello")) == b" hello"
    assert gpt2.token_bytes(50256) == b"<|endoftext|>"
    assert mistral.token_bytes(mistral.token_to_id("▁Hello")) == b" Hello"
    assert mistral.token_bytes(mistral.token_to_id("<0x0A>")) == b"\n"
    assert mistral.token_bytes(mistral.token_to_id("<s>")) == b"<s>"
    table = gpt2.all_token_bytes()
    assert len(table) == gpt2.vocab_size == 50257
    assert len(set(table)) == len(table)  # every GPT-2 token is a distinct byte string
    assert sorted(len(b) for b in table[:256]) == [1] * 256
    for tid in range(0, gpt2.vocab_size, 97):
        assert gpt2.decode([tid]) == table[tid].decode("utf-8", "replace")


def test_byte_alphabet_round_trip():
    data = bytes(range(256))
    assert alphabet_to_bytes(bytes_to_alphabet(data)) == data
    assert alphabet_to_bytes("not in alphabet ") is None


def test_tiktoken_pattern_by_name_or_regex(fixtures_dir):
    path = fixtures_dir / "tokenizers" / "r50k_base.tiktoken"
    by_name = Tokenizer.from_file(path, pattern="cl100k_base")
    from radixgen.tokenizer.patterns import CL100K

    literal = Tokenizer.from_file(path, pattern=CL100K)
    gpt2 = Tokenizer.from_file(path, pattern="r50k_base")
    text = "I'M SURE HE'LL 1234567 words\n\n  and more"
    assert by_name.encode(text) == literal.encode(text) != gpt2.encode(text)
    assert by_name.token_to_id("<|endofprompt|>") == 100276  # the name brings cl100k's special tokens
    with pytest.raises(ValueError, match="pattern"):
        Tokenizer.from_file(path)


def test_unknown_file_is_rejected(tmp_path):
    bogus = tmp_path / "vocab.txt"
    bogus.write_text("this is not a tokenizer\n")
    with pytest.raises(ValueError, match="not a tokenizer"):
        Tokenizer.from_file(bogus)


def test_cache_is_bounded(gpt2, monkeypatch):
    text = " ".join(f"w{i}x" for i in range(500))
    want = gpt2.encode(text)
    monkeypatch.setattr(tokenizer_module, "MAX_CACHE_ENTRIES", 100)
    gpt2.encode(text)
    assert len(gpt2._cache) == 0
    assert gpt2.encode(text) == want


def test_encode_batch_in_worker_processes_equals_encode(fixtures_dir, monkeypatch):
    from radixgen.tokenizer import pool

    tok = Tokenizer.from_file(fixtures_dir / "tokenizers" / "r50k_base.tiktoken", pattern="gpt2")
    texts = [f"document {i}: " + "some text 😀 " * (i % 7) for i in range(200)]
    monkeypatch.setattr(pool, "MIN_PARALLEL_CHARS", 0)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    try:
        assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
        assert tok._pool is not None  # really went through the workers
    finally:
        tok.close()


def test_numpy_ids_decode(gpt2):
    import numpy as np

    ids = gpt2.encode("numpy arrays decode too")
    assert gpt2.decode(np.asarray(ids, dtype=np.int32)) == "numpy arrays decode too"


@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_gguf_sentencepiece_vocabulary(fixtures_dir, tmp_path, arch):
    """A llama-type GGUF (tokens, scores, token types, no merges) gives the ids transformers' GGUF reader gives."""
    spm = pytest.importorskip("sentencepiece")
    gguf = pytest.importorskip("gguf")
    transformers = pytest.importorskip("transformers")
    from test_tokenizer_corpus import make_documents

    sp = spm.SentencePieceProcessor(
        model_file=str(fixtures_dir / "tokenizers" / "mistral-7b-v0.1.tokenizer.model")
    )
    n = sp.get_piece_size()
    kinds = [
        2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1 for i in range(n)
    ]
    path = tmp_path / "sp.gguf"
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([sp.id_to_piece(i) for i in range(n)])
    writer.add_token_scores([sp.get_score(i) for i in range(n)])
    writer.add_token_types(kinds)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    ours = Tokenizer.from_file(path)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="sp.gguf").backend_tokenizer
    assert (ours.bos_token_id, ours.eos_token_id, ours.add_bos_token) == (1, 2, True)
    docs = make_documents(1 << 16, seed=11)
    for doc in docs + [" leading", "<s> after a special", "two  spaces"]:
        ids = ref.encode(doc, add_special_tokens=False).ids
        assert ours.encode(doc, add_special_tokens=False) == ids
        assert ours.encode(doc) == [1, *ids]
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=False)


def test_model_folder_configs(fixtures_dir, tmp_path):
    """A model folder: generation_config.json adds EOS ids, chat_template.jinja gives the template, and the
    config's add_bos_token / add_eos_token decide what add_special_tokens puts around the ids."""
    qwen = fixtures_dir / "tokenizers" / "qwen3"
    (tmp_path / "tokenizer.json").symlink_to(qwen / "tokenizer.json")
    config = json.loads((qwen / "tokenizer_config.json").read_text())
    del config["chat_template"]
    config.update(bos_token="<|im_start|>", add_bos_token=True, add_eos_token=True)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")

    tok = Tokenizer.from_file(tmp_path)
    assert tok.eos_token_ids == {151645, 151643}
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "[hi]"
    assert tok.encode("hi") == [151644, *tok.encode("hi", add_special_tokens=False), 151645]
    assert tok.add_bos_token and tok.bos_token == "<|im_start|>"
    lone = Tokenizer.from_file(qwen / "tokenizer.json")  # named tokenizer.json: its folder's config applies
    assert lone.eos_token_id == 151645
