"""Compiled grammars kept on disk (grammars/disk_cache.py): a second vocabulary object with the same tokens (a
restarted process) loads a grammar instead of compiling it, with masks equal bit for bit; truncated, corrupt,
foreign or stale files are misses; the folder stays under its size bound; several processes may write at
once; the engine's switch and the environment turn it off.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest
from grammar_vocabs import VOCABS

from radixgen.grammars import Grammar, Vocabulary, clear_cache, compile_grammar, compile_regex
from radixgen.grammars import grammar as grammar_module
from radixgen.grammars.disk_cache import MAGIC, SUFFIX, GrammarDiskCache, GrammarKey
from radixgen.grammars.json_schema import compile_json_schema
from radixgen.runtime.constraints import GRAMMAR_CACHE_ENV, grammar_disk_cache
from radixgen.runtime.engine_config import EngineConfig

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b c", "dé"]}},
                                           "n": {"type": "integer"}},
          "required": ["name"], "additionalProperties": False}
TEXTS = [json.dumps({"name": "x" * 40, "tags": ["b c", "dé"], "n": -12}, ensure_ascii=False),
         json.dumps({"name": "", "n": 0})]
EBNF = 'root ::= item ("," item)*\nitem ::= "\\"" [a-z]{1,300} "\\"" | [0-9]+'


def vocab_with(cache: GrammarDiskCache | None) -> Vocabulary:
    """A fresh vocabulary object (nothing compiled against it yet) with GPT-2's tokens."""
    base, _ = VOCABS["gpt2"]()
    return Vocabulary(base.token_bytes, base.eos_token_ids, base.special_ids, grammar_cache=cache)


def compile_all(vocab: Vocabulary) -> list[Grammar]:
    return [compile_json_schema(SCHEMA, vocab), compile_grammar(EBNF, vocab, syntax="ebnf"),
            compile_regex(r"(ab|cd){2,5}-\d{3}", vocab)]


def same_masks(one: Grammar, two: Grammar, texts: list[str]) -> None:
    _, encode = VOCABS["gpt2"]()
    for text in texts:
        m, n = one.matcher(), two.matcher()
        for tid in [*encode(text), None]:
            np.testing.assert_array_equal(one.mask(m.state), two.mask(n.state))
            if tid is None:
                break
            assert m.advance(tid) and n.advance(tid)
        assert m.is_accepting() and n.is_accepting()


def refuse_building(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object) -> None:
        raise AssertionError("compiled instead of loaded")

    monkeypatch.setattr(grammar_module, "build_pda", fail)
    monkeypatch.setattr(grammar_module, "regex_to_dfa", fail)


def test_a_second_process_loads_instead_of_compiling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clear_cache()
    first = compile_all(vocab_with(GrammarDiskCache(tmp_path)))
    assert len(list(tmp_path.glob(f"*{SUFFIX}"))) == 3
    refuse_building(monkeypatch)
    second = compile_all(vocab_with(GrammarDiskCache(tmp_path)))  # another vocabulary object: a new process
    for one, two in zip(first, second):
        assert one is not two and one.relaxations == two.relaxations and one.narrowings == two.narrowings
    same_masks(first[0], second[0], TEXTS)
    same_masks(first[1], second[1], ['"abc","' + "z" * 300 + '",42'])
    same_masks(first[2], second[2], ["abcdab-123"])
    clear_cache()


def test_loaded_masks_equal_a_fresh_compile_on_random_walks(tmp_path: Path) -> None:
    """What a loaded grammar computes on use (frames below its restored top walks) equals a compile
    without any cache, at every position of seeded walks over allowed tokens."""
    clear_cache()
    compile_json_schema(SCHEMA, vocab_with(GrammarDiskCache(tmp_path)))
    loaded = compile_json_schema(SCHEMA, vocab_with(GrammarDiskCache(tmp_path)))
    fresh = compile_json_schema(SCHEMA, vocab_with(None))
    rng = np.random.default_rng(7)
    eos = set(fresh.vocab.eos_token_ids)
    for _ in range(4):
        m, n = loaded.matcher(), fresh.matcher()
        for _ in range(40):
            np.testing.assert_array_equal(loaded.mask(m.state), fresh.mask(n.state))
            choices = [t for t in n.allowed_token_ids().tolist() if t not in eos]
            if not choices:
                break
            tid = int(rng.choice(choices))
            assert m.advance(tid) and n.advance(tid)
    clear_cache()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "header"])
def test_damaged_files_are_misses(tmp_path: Path, damage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clear_cache()
    compile_json_schema(SCHEMA, vocab_with(GrammarDiskCache(tmp_path)))
    (path,) = tmp_path.glob(f"*{SUFFIX}")
    data = path.read_bytes()
    damaged = {"truncate": data[: len(data) // 2], "garbage": b"\x00" * 4096, "empty": b"",
               "header": data[:40] + b"{" + data[41:]}[damage]
    path.write_bytes(damaged)
    grammar = compile_json_schema(SCHEMA, vocab_with(GrammarDiskCache(tmp_path)))  # compiled again, stored again
    same_masks(grammar, compile_json_schema(SCHEMA, vocab_with(None)), TEXTS[:1])
    assert path.read_bytes().startswith(MAGIC)
    clear_cache()
    refuse_building(monkeypatch)
    compile_json_schema(SCHEMA, vocab_with(GrammarDiskCache(tmp_path)))  # whole again: loaded
    clear_cache()


def test_a_file_under_another_name_is_a_miss(tmp_path: Path) -> None:
    """A file renamed to another key's name (or a digest collision) is refused by its header's key."""
    clear_cache()
    cache = GrammarDiskCache(tmp_path)
    vocab = vocab_with(cache)
    compile_regex("a+", vocab)
    (only,) = tmp_path.glob(f"*{SUFFIX}")
    other = compile_regex("b+", vocab_with(None))
    target = cache.path(GrammarKey("regex", "b+"), vocab)
    only.rename(target)
    clear_cache()
    loaded = compile_regex("b+", vocab_with(cache))
    assert loaded.matcher().advance_bytes(b"bbb") and not loaded.matcher().advance_bytes(b"a")
    same_masks(loaded, other, [])
    clear_cache()


def test_the_folder_stays_under_its_bound(tmp_path: Path) -> None:
    clear_cache()
    sizes = []
    for i in range(3):
        compile_regex(f"x{{{i + 1}}}[a-z]+", vocab_with(GrammarDiskCache(tmp_path)))
        sizes.append(max(p.stat().st_size for p in tmp_path.glob(f"*{SUFFIX}")))
    bound = max(sizes) * 2
    small = GrammarDiskCache(tmp_path, max_bytes=bound)
    compile_regex("y+", vocab_with(small))
    files = list(tmp_path.glob(f"*{SUFFIX}"))
    assert sum(p.stat().st_size for p in files) <= bound and len(files) <= 2
    newest = small.path(GrammarKey("regex", "y+"), vocab_with(None))
    assert newest in files  # the file just written is never the one removed
    small.clear()
    assert not list(tmp_path.glob(f"*{SUFFIX}"))
    clear_cache()


def _compile_in_child(folder: str) -> None:
    clear_cache()
    compile_json_schema(SCHEMA, vocab_with(GrammarDiskCache(folder)))


def test_processes_writing_at_once_leave_a_whole_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    VOCABS["gpt2"]()  # loaded before forking, so the children share it
    ctx = mp.get_context("fork")
    children = [ctx.Process(target=_compile_in_child, args=(str(tmp_path),)) for _ in range(3)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=300)
        assert child.exitcode == 0
    assert len(list(tmp_path.glob(f"*{SUFFIX}"))) == 1 and not list(tmp_path.glob("*.tmp"))
    clear_cache()
    fresh = compile_json_schema(SCHEMA, vocab_with(None))
    refuse_building(monkeypatch)
    same_masks(compile_json_schema(SCHEMA, vocab_with(GrammarDiskCache(tmp_path))), fresh, TEXTS)
    clear_cache()


def test_an_unwritable_folder_only_means_compiling(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    clear_cache()
    grammar = compile_regex("[0-9]{2}", vocab_with(GrammarDiskCache(blocker / "grammars")))
    assert grammar.matcher().advance_bytes(b"42")
    clear_cache()


def test_the_switch_and_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(GRAMMAR_CACHE_ENV, raising=False)
    cache = grammar_disk_cache()
    assert cache is not None and cache.folder == tmp_path / "grammars"
    assert grammar_disk_cache(disabled=True) is None
    for off in ("0", "off", "False", "no"):
        monkeypatch.setenv(GRAMMAR_CACHE_ENV, off)
        assert grammar_disk_cache() is None
    monkeypatch.setenv(GRAMMAR_CACHE_ENV, "1")
    assert grammar_disk_cache() is not None
    assert EngineConfig.from_options(disable_grammar_disk_cache=True).disable_grammar_disk_cache
    with pytest.raises(ValueError, match="disable_grammar_disk_cache"):
        EngineConfig.from_options(disable_grammar_disk_cache="yes")
    with pytest.raises(ValueError, match="max_bytes"):
        GrammarDiskCache(tmp_path, max_bytes=-1)
