"""StopChecker: stop strings across token boundaries, trimming, streaming hold-back, stop tokens, min tokens.

The driver below feeds tokens the way the engine loop does (check_token, then feed_text through a real
incremental detokenizer over a fake byte vocabulary, then a final flush when a stop string hits).
"""

from __future__ import annotations

import random

import pytest

from radixgen.runtime.outputs import LengthFinish, StopFinish
from radixgen.runtime.sampling_params import SamplingParams as SP
from radixgen.runtime.stop_checker import StopChecker
from radixgen.tokenizer.detokenizer import IncrementalDetokenizer

EOS = 0


def run(params: SP, pieces: list[str | bytes], ids: list[int] | None = None, max_tokens: int | None = None):
    """Feed one token per piece (token i has the bytes of pieces[i], or of `ids` when given, EOS = "</s>").
    Returns (emitted chunks, finish reason or None, checker)."""
    table = [b"</s>"] + [p.encode() if isinstance(p, str) else p for p in pieces]
    ids = ids if ids is not None else list(range(1, len(pieces) + 1))
    checker = StopChecker(params, eos_token_ids=[EOS])
    detok = IncrementalDetokenizer(table, None, False)
    chunks = []
    for n, token in enumerate(ids, start=1):
        finish = checker.check_token(token, n)
        if finish is None and max_tokens is not None and n >= max_tokens:
            finish = LengthFinish()
        text = checker.feed_text(detok, [token], finished=finish is not None)
        if finish is None and checker.stop_string_hit is not None:
            finish = StopFinish(checker.stop_string_hit)
            text += checker.feed_text(detok, [], finished=True)
        chunks.append(text)
        if finish is not None:
            assert checker.text == "".join(chunks)
            return chunks, finish, checker
    return chunks, None, checker


def stop(matched):
    return StopFinish(matched)


@pytest.mark.parametrize("params, pieces, ids, chunks, finish", [
    # A stop string spanning three tokens is trimmed; the text before it streams as soon as it is safe.
    (SP(stop="END"), ["Hello E", "N", "D and more"], None, ["Hello ", "", ""], stop("END")),
    # no_stop_trim keeps the stop string (and nothing after it).
    (SP(stop="END", no_stop_trim=True), ["Hello E", "N", "D and more"], None, ["Hello ", "", "END"], stop("END")),
    # A false start is released once it cannot be a stop string any more.
    (SP(stop="###"), ["a#", "#b", "c"], None, ["a", "##b", "c"], None),
    (SP(stop="###"), ["a#", "#", "#x"], None, ["a", "", ""], stop("###")),
    # Overlapping false start: held "a", then "aa", must still find "ab".
    (SP(stop="ab"), ["xa", "a", "b"], None, ["x", "a", ""], stop("ab")),
    # The stop string that completes first wins, even if another one started earlier.
    (SP(stop=["abcd", "bc"]), ["a", "bcd"], None, ["", "a"], stop("bc")),
    (SP(stop=["bc", "abc"]), ["xabc"], None, ["x"], stop("abc")),
    # EOS stops; its text is dropped unless no_stop_trim; held text is released.
    (SP(stop="zz"), ["hi z"], [1, EOS], ["hi ", "z"], stop(EOS)),
    (SP(no_stop_trim=True), ["hi"], [1, EOS], ["hi", "</s>"], stop(EOS)),
    # ignore_eos: EOS is just a token; stop_token_ids still stop (their text trimmed).
    (SP(ignore_eos=True, stop_token_ids=[3]), ["a", "b", "<3>"], [1, EOS, 2, 3], ["a", "</s>", "b", ""], stop(3)),
    # min_new_tokens defers stop strings and stop tokens.
    (SP(min_new_tokens=3, stop="x"), ["x", "y", "x!"], [1, 2, 3], ["x", "y", ""], stop("x")),
    (SP(min_new_tokens=2), ["a", "b"], [1, EOS, 2, EOS], ["a", "</s>", "b", ""], stop(EOS)),
    # Multi-byte characters split across tokens, and a stop string ending in one.
    (SP(stop="→ fin"), ["voilà ", "→".encode()[:2], "→".encode()[2:], " f", "in ici"], None,
     ["voilà ", "", "", "", ""], stop("→ fin")),
    (SP(stop="é"), ["caf", "é".encode()[:1], "é".encode()[1:] + b"!"], None, ["caf", "", ""], stop("é")),
])
def test_stop_table(params, pieces, ids, chunks, finish):
    got_chunks, got_finish, _ = run(params, pieces, ids)
    assert got_chunks == chunks
    assert got_finish == finish


def test_length_finish_releases_held_text():
    chunks, finish, checker = run(SP(stop="xyz"), ["ab", "cx"], max_tokens=2)
    assert chunks == ["ab", "cx"] and finish == LengthFinish()
    assert checker.stop_string_hit is None and not checker.finished


def test_feed_after_a_hit_emits_nothing():
    checker = StopChecker(SP(stop="!"))
    checker.check_token(5, 1)
    assert checker.feed("hi! there") == "hi" and checker.finished
    assert checker.feed("more", finished=True) == "" and checker.text == "hi"


def _oracle(text: str, stops: list[str]) -> tuple[str, str | None]:
    """Text before the first stop string to complete (earliest end, then earliest start)."""
    hits = [(text.find(s) + len(s), text.find(s), s) for s in stops if s in text]
    if not hits:
        return text, None
    _end, start, matched = min(hits)
    return text[:start], matched


def test_any_tokenisation_gives_the_oracle_result():
    """Random texts over a small alphabet, split at random token boundaries: the emitted text is the oracle's,
    and every prefix of the stream is a prefix of it (nothing emitted is ever taken back)."""
    rng = random.Random(0)
    for _ in range(400):
        stops = list({"".join(rng.choice("ab#") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))})
        text = "".join(rng.choice("ab#c") for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) - 1))) if len(text) > 1 else []
        deltas = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])] if text else []
        expected, matched = _oracle(text, stops)
        checker = StopChecker(SP(stop=stops))
        emitted = ""
        for n, d in enumerate(deltas, start=1):
            checker.check_token(100, n)
            emitted += checker.feed(d, finished=n == len(deltas))
            assert expected.startswith(emitted), (stops, deltas)
            if checker.finished:
                break
        assert emitted == expected, (stops, deltas)
        assert checker.stop_string_hit == matched


# ------------------------------------------------------------------------------------------------ stop_regex
@pytest.mark.parametrize("params, pieces, chunks, finish", [
    # A match spanning tokens is trimmed; the text before a possible match start streams at once.
    (SP(stop_regex=r"\d{3}"), ["ab", "1", "2", "3x"], ["ab", "", "", ""], stop(r"\d{3}")),
    # A partial match that fails is released.
    (SP(stop_regex=r"\d{3}"), ["ab1", "2x", "45", "6", "zz"], ["ab", "12x", "", ""], stop(r"\d{3}")),
    # no_stop_trim keeps the matched text (and nothing after it).
    (SP(stop_regex=r"END\.", no_stop_trim=True), ["hi E", "N", "D.more"], ["hi ", "", "END."], stop(r"END\.")),
    # `^` is the start of the output, not of the text held back.
    (SP(stop_regex=r"^Q"), ["aQ", "Q", "z"], ["aQ", "Q", "z"], None),
    # Lookbehind sees text already emitted.
    (SP(stop_regex=r"(?<=ab)c"), ["ab", "c!"], ["ab", ""], stop(r"(?<=ab)c")),
    # A stop string and a stop regex: the one that completes first wins.
    (SP(stop="zz", stop_regex=r"y+!"), ["a", "yy!zz"], ["a", ""], stop(r"y+!")),
    (SP(stop="z", stop_regex=r"y+!"), ["a", "yyz!"], ["a", "yy"], stop("z")),
])
def test_stop_regex_table(params, pieces, chunks, finish):
    got_chunks, got_finish, _ = run(params, pieces)
    assert got_chunks == chunks
    assert got_finish == finish


def test_stop_regex_any_tokenisation_gives_the_oracle_result():
    """Random texts split at random token boundaries: the output is the text before the leftmost match of the
    first regex to match (re.search on the text so far decides), and nothing emitted is ever taken back."""
    import re

    rng = random.Random(1)
    patterns = [r"a[b#]+c", r"#\d", r"(ab|ba)#", r"c{2,3}a"]
    for _ in range(400):
        pattern = rng.choice(patterns)
        text = "".join(rng.choice("ab#c1") for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) - 1))) if len(text) > 1 else []
        deltas = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])] if text else []
        checker = StopChecker(SP(stop_regex=[pattern]))
        emitted, seen, expected = "", "", text
        for n, d in enumerate(deltas, start=1):
            seen += d
            match = re.search(pattern, seen)
            if match and expected == text:
                expected = seen[:match.start()]
            checker.check_token(100, n)
            emitted += checker.feed(d, finished=n == len(deltas))
            if checker.finished:
                break
        assert emitted == expected, (pattern, deltas)
        assert checker.stop_string_hit == (pattern if expected != text or re.search(pattern, text) else None)
