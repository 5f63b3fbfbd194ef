"""`--model` as a local path: files and folders as given, Hugging Face hub ids from the local HF cache only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from radixgen.runtime import model_path as mp
from radixgen.runtime.errors import ModelNotFoundError

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _snapshot(cache, repo: str, revision: str, with_ref: bool = True):
    folder = cache / ("models--" + repo.replace("/", "--"))
    snap = folder / "snapshots" / revision
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    if with_ref:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / "main").write_text(revision + "\n")
    return snap


@pytest.mark.parametrize("text,is_id", [
    (REPO, True), ("Qwen/Qwen2.5-0.5B-Instruct", True), ("org/name_v1.5", True),
    ("/abs/path", False), ("./rel/path", False), ("a/b/c", False), ("model.gguf", False), ("~/models/x", False),
    ("../x", False), ("org/..", False), ("-org/name", False),
])
def test_what_counts_as_a_hub_id(text, is_id):
    assert mp.is_hub_id(text) is is_id


def test_hub_cache_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert mp.hub_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert mp.hub_cache_dir() == tmp_path / "hub"
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.delenv("HF_HOME")
    assert mp.hub_cache_dir() == Path.home() / ".cache" / "huggingface" / "hub"


def test_a_hub_id_resolves_to_the_snapshot_refs_main_names(tmp_path):
    _snapshot(tmp_path, REPO, "aaaa", with_ref=False)
    main = _snapshot(tmp_path, REPO, "bbbb")
    newer = tmp_path / ("models--" + REPO.replace("/", "--")) / "snapshots" / "cccc"
    newer.mkdir()
    assert mp.local_model_path(REPO, cache=tmp_path) == main


def test_without_refs_main_the_newest_snapshot_is_used(tmp_path):
    old = _snapshot(tmp_path, REPO, "aaaa", with_ref=False)
    new = _snapshot(tmp_path, REPO, "bbbb", with_ref=False)
    os.utime(old, (1, 1))
    assert mp.local_model_path(REPO, cache=tmp_path) == new


def test_a_hub_id_not_in_the_cache_says_how_to_point_at_a_folder(tmp_path):
    with pytest.raises(ModelNotFoundError) as info:
        mp.local_model_path(REPO, cache=tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert "looked up in the local cache only" in message and "model folder or .gguf file" in message
    assert str(tmp_path) in message


def test_an_existing_path_wins_over_a_hub_id(tmp_path, monkeypatch):
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert mp.local_model_path("org/name", cache=tmp_path / "empty") == Path("org/name")


def test_a_missing_path_is_named(tmp_path):
    with pytest.raises(ModelNotFoundError, match=r"^model path /no/such/model.gguf does not exist$"):
        mp.local_model_path("/no/such/model.gguf", cache=tmp_path)


def test_a_folder_without_a_tokenizer_names_the_flag(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelNotFoundError, match=r"has no tokenizer\.json; pass one with --tokenizer-path"):
        mp.check_tokenizer_source(tmp_path, None)
    with pytest.raises(ModelNotFoundError, match=r"tokenizer path .*nope\.json does not exist"):
        mp.check_tokenizer_source(tmp_path, str(tmp_path / "nope.json"))
    (tmp_path / "tok.json").write_text("{}")
    mp.check_tokenizer_source(tmp_path, str(tmp_path / "tok.json"))
    (tmp_path / "tokenizer.json").write_text("{}")
    mp.check_tokenizer_source(tmp_path, None)


def test_the_engine_resolves_hub_ids_through_the_cache(tmp_path, monkeypatch):
    from radixgen.runtime.engine_config import EngineConfig
    from radixgen.runtime.model_runner import resolve_model_path

    snap = _snapshot(tmp_path, REPO, "abcd")
    (snap / "tokenizer.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert resolve_model_path(EngineConfig(model_path=REPO)) == snap
