"""The `radixgen` command line: subcommand table, streaming generate, one-line errors, download."""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path
from typing import ClassVar

import pytest

from radixgen import cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_every_table_entry_builds_a_subcommand():
    parser = cli.build_parser()
    for name in cli.COMMAND_TABLE:
        args = parser.parse_args([name, "x"] if name in ("generate", "run") else [name])
        assert callable(args._run)


def test_missing_model_is_one_line_on_stderr(capsys):
    assert cli.main(["generate", "hi", "--model", "/no/such/model.gguf"]) == 1
    err = capsys.readouterr().err
    assert err == ("radixgen: loading /no/such/model.gguf ...\n"
                   "radixgen: error: model path /no/such/model.gguf does not exist\n")


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
                     "--max-new-tokens", "3", "--raw"])
    assert code == 0
    out = capsys.readouterr()
    assert out.out == " Paris.\n\n"
    assert out.err == f"radixgen: loading {default_model_path} ...\n"


def test_generate_uses_the_chat_template_of_an_instruct_model(default_model_path, capsys):
    args = ["generate", "What is the capital of France?", "--model", str(default_model_path), "--max-new-tokens", "8"]
    assert cli.main(args) == 0
    chat = capsys.readouterr().out
    assert "Paris" in chat
    assert cli.main([*args, "--chat"]) == 0  # the old flag is accepted and changes nothing
    assert capsys.readouterr().out == chat


class _EndsAtOnceEngine:
    """Stands in for radixgen.Engine: a tokenizer with a chat template, and an answer that ends at once."""

    prompts: ClassVar[list[list[int]]] = []

    def __init__(self, *args, **kwargs) -> None:
        self.tokenizer = self

    chat_template = "{{ messages[0].content }}"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [len(text)]

    def apply_chat_template(self, messages, add_generation_prompt: bool) -> str:
        return "<chat>" + messages[0]["content"]

    def generate(self, input_ids, sampling_params, stream):
        self.prompts.append(input_ids)
        finish = {"type": "stop", "matched": 2}
        yield {"text": "", "finished": True, "meta_info": {"finish_reason": finish}}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def test_an_empty_answer_is_said_on_stderr(monkeypatch, capsys):
    from radixgen.runtime import engine

    monkeypatch.setattr(engine, "Engine", _EndsAtOnceEngine)
    _EndsAtOnceEngine.prompts.clear()
    assert cli.main(["generate", "hi"]) == 0
    assert cli.main(["generate", "hi", "--raw"]) == 0
    out = capsys.readouterr()
    assert out.out == "\n\n"
    assert out.err.count("radixgen: the model's answer is empty: it ended at once (finish reason: stop)\n") == 2
    assert _EndsAtOnceEngine.prompts == [[len("<chat>hi")], [len("hi")]]  # chat template unless --raw


def test_raw_and_chat_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "hi", "--raw", "--chat"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_bad_flag_prints_the_subcommand_usage(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", "--no-such-flag"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: radixgen serve ") and err.endswith("unrecognized arguments: --no-such-flag\n")


@pytest.mark.parametrize("args,message", [
    (["generate", "hi", "--temperature", "-0.5"], "--temperature must be >= 0.0, got -0.5"),
    (["generate", "hi", "--device", "gpu"], "use --device cuda"),
    (["generate", "hi", "--device", "tpu"], "--device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
    (["run", "prog.py", "--device", "cuda:x"], "--device must be auto, cpu, cuda or cuda:N, got 'cuda:x'"),
    (["serve", "--port", "-1"], "--port must be in 0..65535, got -1"),
    (["serve", "--shutdown-grace", "-1"], "--shutdown-grace must be >= 0.0, got -1.0"),
])
def test_invalid_values_are_refused_before_the_model_loads(monkeypatch, capsys, tmp_path, args, message):
    from radixgen.runtime import engine

    def no_engine(*args, **kwargs):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(engine, "Engine", no_engine)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prog.py").write_text("")
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("radixgen: error: ") and message in err and err.count("\n") == 1


def test_program_files_run_as_registered_modules():
    """examples/json_extraction.py: a dataclass under `from __future__ import annotations` needs its module in
    sys.modules while the file runs (`radixgen serve --programs` crashed at start without it)."""
    from radixgen.server.programs import load_program_file

    programs = load_program_file(EXAMPLES / "json_extraction.py")
    assert [p.name for p in programs] == ["extract"]
    module = sys.modules[programs[0].function.func.__module__]
    assert typing.get_type_hints(module.Person) == {"name": str, "age": int, "city": str}


def test_run_a_function_whose_schema_is_a_dataclass(default_model_path, capsys):
    assert cli.main(["run", str(EXAMPLES / "json_extraction.py"), "--model", str(default_model_path), "--function",
                     "extract", "--arg", "text=Ann Lee, 30, lives in Oslo.", "--arg", "max_tokens=40"]) == 0
    record = json.loads(json.loads(capsys.readouterr().out)["record"])
    assert set(record) == {"name", "age", "city"} and isinstance(record["age"], int)
