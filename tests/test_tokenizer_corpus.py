"""A deterministic, varied text corpus for tokenizer parity tests and benchmarks (and tests of the corpus).

`make_documents(n_bytes, seed)` returns documents mixing English-like prose over a Zipf-distributed lexicon
(real common words plus a long tail of synthetic ones, so a BPE cache sees realistic miss rates), source code,
JSON, non-Latin scripts, combining marks, emoji sequences, long digit and whitespace runs, control characters,
random code points and text containing special-token strings. Same (n_bytes, seed) -> same text.
"""

from __future__ import annotations

import json
import random

COMMON = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "I",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "would",
    "their",
    "we",
    "him",
    "been",
    "has",
    "when",
    "who",
    "will",
    "more",
    "no",
    "if",
    "out",
    "so",
    "said",
    "what",
    "up",
    "its",
    "about",
    "into",
    "than",
    "them",
    "can",
    "only",
    "other",
    "new",
    "some",
    "could",
    "time",
    "these",
    "two",
    "may",
    "then",
    "do",
    "first",
    "any",
    "my",
    "now",
    "such",
    "like",
    "our",
    "over",
    "man",
    "me",
    "even",
    "most",
    "made",
    "after",
    "also",
    "did",
    "many",
    "before",
    "must",
    "through",
    "back",
    "years",
    "where",
    "much",
    "your",
    "way",
    "well",
    "down",
    "should",
    "because",
    "each",
    "just",
    "those",
    "people",
    "how",
    "too",
    "little",
    "state",
    "good",
    "very",
    "make",
    "world",
    "still",
    "own",
    "see",
    "men",
    "work",
    "long",
    "get",
    "here",
    "between",
    "both",
    "life",
    "being",
    "under",
    "never",
    "day",
    "same",
    "another",
    "know",
    "while",
    "last",
    "might",
    "us",
    "great",
    "old",
    "year",
    "off",
    "come",
    "since",
    "against",
    "go",
    "came",
    "right",
    "used",
    "take",
    "three",
    "don't",
    "isn't",
    "we're",
    "they've",
    "I'm",
    "you'll",
    "he'd",
    "it's",
    "tokenizer",
    "model",
    "cache",
    "radix",
    "tree",
    "kernel",
    "attention",
    "tensor",
    "batch",
    "prefix",
    "decode",
    "stream",
    "grammar",
    "schema",
]
SCRIPTS = {
    "french": "élève château garçon où déjà naïve cœur français à été forêt",
    "german": "Straße Müller schön Größe über Mädchen Fußgänger Übermaß",
    "russian": "привет мир как дела это тест токенизатор Москва хорошо",
    "greek": "γειά σου κόσμε αλφάβητο Ελληνικά λόγος",
    "arabic": "مرحبا بالعالم هذا اختبار اللغة العربية",
    "hebrew": "שלום עולם זה מבחן עברית",
    "hindi": "नमस्ते दुनिया यह परीक्षण हिन्दी भाषा है",
    "chinese": "你好世界 这是一个测试 分词器 中文文本 人工智能 机器学习",
    "japanese": "こんにちは世界 これはテストです トークナイザー 日本語 カタカナ",
    "korean": "안녕하세요 세계 이것은 테스트입니다 한국어",
    "thai": "สวัสดีชาวโลก นี่คือการทดสอบ ภาษาไทย",
}
EMOJI = [
    "😀",
    "🎉",
    "👍🏽",
    "👨‍👩‍👧‍👦",
    "🏳️‍🌈",
    "🇫🇷",
    "🇯🇵",
    "❤️",
    "🤖",
    "🧑🏿‍💻",
    "✨",
    "🔥",
    "½",
    "™",
    "→",
    "∑",
    "≠",
    "𝔘𝔫𝔦",
]
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<s>",
    "</s>",
    "<unk>",
    "<|im_start|>user\n",
    "<|fim_prefix|>",
    "<|im_start",
    "<s >",
    "< s>",
    "</s>>",
    "<<s>>",
    "<|endoftext|><|endoftext|>",
    "<think>",
    "<repo_name>",
]
SYLLABLES = [
    "ka",
    "ri",
    "to",
    "mo",
    "na",
    "shi",
    "ve",
    "lo",
    "qua",
    "zen",
    "tri",
    "ble",
    "ght",
    "str",
    "ion",
    "ing",
    "eur",
    "ach",
    "ph",
    "oo",
    "xy",
    "zz",
    "ou",
    "ae",
    "th",
    "sch",
]


def _lexicon(rng: random.Random, size: int) -> list[str]:
    tail = sorted({"".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 5))) for _ in range(size)})
    rng.shuffle(tail)
    return COMMON + tail


class _Lexicon(list):
    """Words with Zipf weights (rank r has weight 1/(r+2)^1.05), cumulative weights computed once."""

    def __init__(self, words: list[str]):
        super().__init__(words)
        total = 0.0
        self.cum_weights = []
        for rank in range(len(words)):
            total += 1.0 / (rank + 2) ** 1.05
            self.cum_weights.append(total)


def _zipf_words(rng: random.Random, lexicon: list[str], count: int) -> list[str]:
    return rng.choices(lexicon, cum_weights=lexicon.cum_weights, k=count)  # type: ignore[attr-defined]


def _prose(rng: random.Random, lexicon: list[str]) -> str:
    sentences = []
    for _ in range(rng.randint(2, 8)):
        words = _zipf_words(rng, lexicon, rng.randint(4, 25))
        words[0] = words[0].capitalize()
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 10 ** rng.randint(1, 6))))
        if rng.random() < 0.2:
            i = rng.randrange(len(words))
            words[i] = f'"{words[i]}"'
        if rng.random() < 0.2:
            words[rng.randrange(len(words))] += ","
        sentences.append(" ".join(words) + rng.choice([".", ".", "!", "?", "...", ";", ":"]))
    return " ".join(sentences)


def _code(rng: random.Random, lexicon: list[str]) -> str:
    names = [w.replace("'", "") or "x" for w in _zipf_words(rng, lexicon, 12)]
    indent = rng.choice(["    ", "  ", "\t"])
    lines = [f"def {names[0]}_{names[1]}({names[2]}, {names[3]}=None) -> dict[str, int]:"]
    lines.append(f'{indent}"""{names[4].capitalize()} the {names[5]}."""')
    lines.append(f"{indent}for i in range({rng.randint(0, 999)}):")
    lines.append(f"{indent * 2}if {names[2]}[i] >= 0x{rng.randint(0, 1 << 32):08X} and not {names[6]}:")
    lines.append(f"{indent * 3}{names[7]} += {names[2]}[i] ** 2 // {rng.randint(1, 99)}  # {names[8]}")
    lines.append(f"{indent}return {{'{names[9]}': {names[10]}, \"k\": [1, 2, 3]}}")
    lines.append("")
    lines.append(f"const {names[11]} = async (a, b) => {{ return a?.b ?? `${{b}}\\n`; }};")
    lines.append(f'int main(void) {{ printf("%d\\n", {rng.randint(-9999, 9999)}); return 0; }}')
    return "\n".join(lines) + "\n"


def _json(rng: random.Random, lexicon: list[str]) -> str:
    def value(depth: int):
        kind = rng.random()
        if depth > 2 or kind < 0.3:
            return rng.choice(
                [
                    rng.randint(-(10**9), 10**9),
                    rng.random() * 1e3,
                    True,
                    None,
                    " ".join(_zipf_words(rng, lexicon, 3)),
                ]
            )
        if kind < 0.6:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        return {w: value(depth + 1) for w in _zipf_words(rng, lexicon, rng.randint(1, 4))}

    obj = {"id": rng.randint(0, 10**6), "data": value(0), "name": rng.choice(list(SCRIPTS.values()))[:12]}
    return json.dumps(obj, indent=rng.choice([None, 2, 4]), ensure_ascii=rng.random() < 0.3)


def _scripts(rng: random.Random) -> str:
    lang = rng.choice(list(SCRIPTS))
    words = SCRIPTS[lang].split()
    return " ".join(rng.choice(words) for _ in range(rng.randint(3, 30))) + rng.choice(
        ["。", ".", "!", "؟", "\n"]
    )


def _symbols(rng: random.Random) -> str:
    return "".join(rng.choice(EMOJI) + rng.choice(["", " ", "", "\n"]) for _ in range(rng.randint(3, 20)))


def _runs(rng: random.Random) -> str:
    parts = [
        "".join(rng.choice("0123456789") for _ in range(rng.randint(10, 200))),
        " " * rng.randint(2, 300),
        "\t" * rng.randint(1, 20),
        "\n" * rng.randint(1, 12),
        "\r\n" * rng.randint(1, 5),
        " \n " * rng.randint(1, 5),
        "\u00a0\u3000\u2009 x",
        "-" * rng.randint(3, 80),
        "=" * rng.randint(3, 80),
        "." * rng.randint(3, 40),
    ]
    rng.shuffle(parts)
    return "word" + "word".join(parts[: rng.randint(2, 6)])


def _specials(rng: random.Random, lexicon: list[str]) -> str:
    words = _zipf_words(rng, lexicon, 6)
    out = []
    for w in words:
        out.append(w)
        out.append(rng.choice(SPECIALS) + rng.choice(["", " ", "\n", "x"]))
    return rng.choice(["", " "]).join(out)


def _random_code_points(rng: random.Random) -> str:
    chars = []
    for _ in range(rng.randint(5, 40)):
        cp = rng.choice(
            [
                rng.randint(0x20, 0x7E),
                rng.randint(0xA0, 0x2FFF),
                rng.randint(0x3000, 0xD7FF),
                rng.randint(0xE000, 0xFFFD),
                rng.randint(0x10000, 0x2FFFF),
                rng.randint(0, 0x1F),
            ]
        )
        chars.append(chr(cp))
    return "".join(chars) + " e\u0301 A\u030a \ufb01"  # combining marks and a ligature (NFC/NFKC-sensitive)


def make_documents(n_bytes: int = 1 << 20, seed: int = 0) -> list[str]:
    """Documents totalling at least `n_bytes` UTF-8 bytes."""
    rng = random.Random(seed)
    lexicon = _Lexicon(_lexicon(rng, 60_000))
    makers = [
        (lambda: _prose(rng, lexicon), 40),
        (lambda: _code(rng, lexicon), 14),
        (lambda: _json(rng, lexicon), 10),
        (lambda: _scripts(rng), 14),
        (lambda: _symbols(rng), 5),
        (lambda: _runs(rng), 6),
        (lambda: _specials(rng, lexicon), 5),
        (lambda: _random_code_points(rng), 6),
    ]
    funcs = [m for m, _ in makers]
    weights = [w for _, w in makers]
    docs: list[str] = []
    size = 0
    while size < n_bytes:
        doc = "\n\n".join(f() for f in rng.choices(funcs, weights=weights, k=rng.randint(2, 12)))
        docs.append(doc)
        size += len(doc.encode("utf-8"))
    return docs


def make_corpus(n_bytes: int = 1 << 20, seed: int = 0) -> str:
    return "\n\n".join(make_documents(n_bytes, seed))


# ---------------------------------------------------------------------------------------------- tests
def test_corpus_is_deterministic_and_large_enough():
    a = make_corpus(1 << 20, seed=3)
    assert a == make_corpus(1 << 20, seed=3)
    assert a != make_corpus(1 << 20, seed=4)
    assert len(a.encode("utf-8")) >= 1 << 20


def test_corpus_covers_every_kind_of_text():
    text = make_corpus(1 << 18, seed=0)
    for needle in [
        "def ",
        '{"id"',
        "привет",
        "你好",
        "👨‍👩‍👧‍👦",
        "<|im_start|>",
        "</s>",
        " " * 100,
        "\t\t",
        "\r\n",
    ]:
        assert needle in text, needle
    assert any(ch.isdigit() for ch in text)
    longest_digit_run = max(len(run) for run in __import__("re").findall(r"\d+", text))
    assert longest_digit_run >= 100
