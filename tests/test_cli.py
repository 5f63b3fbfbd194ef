"""The `radixgen` command line: subcommand table, streaming generate, one-line errors, download."""

from __future__ import annotations

import pytest

from radixgen import cli


def test_every_table_entry_builds_a_subcommand():
    parser = cli.build_parser()
    for name in cli.COMMAND_TABLE:
        args = parser.parse_args([name, "x"] if name in ("generate", "run") else [name])
        assert callable(args._run)


def test_missing_model_is_one_line_on_stderr(capsys):
    assert cli.main(["generate", "hi", "--model", "/no/such/model.gguf"]) == 1
    err = capsys.readouterr().err
    assert err == "radixgen: error: model path /no/such/model.gguf does not exist\n"


def test_debug_shows_the_exception():
    from radixgen.runtime.errors import ModelNotFoundError

    with pytest.raises(ModelNotFoundError):
        cli.main(["generate", "hi", "--model", "/no/such/model.gguf", "--debug"])


def test_bad_argument_value(capsys):
    assert cli.main(["generate", "hi", "--max-new-tokens", "0"]) == 1
    assert "--max-new-tokens must be >= 1" in capsys.readouterr().err


def test_download_prints_the_cached_path(monkeypatch, capsys, tmp_path):
    from radixgen.runtime import download

    monkeypatch.setattr(download, "cached_model_path", lambda: tmp_path / "m.gguf")
    assert cli.main(["download"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "m.gguf")


def test_generate_streams_the_default_model_answer(default_model_path, capsys):
    code = cli.main(["generate", "The capital of France is", "--model", str(default_model_path),
                     "--max-new-tokens", "3"])
    assert code == 0
    assert capsys.readouterr().out == " Paris.\n\n"
