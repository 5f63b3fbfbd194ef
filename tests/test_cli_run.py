"""`radixgen run PROGRAM.py`: a program file on the default model, by function name or as a script."""

from __future__ import annotations

import json

from radixgen.__main__ import main

PROGRAM = '''
import radixgen as sgl

@sgl.function
def capital(s, country):
    s += "Q: What is the capital of " + country + "?\\nA:" + sgl.gen("answer", max_tokens=4, stop="\\n")

if __name__ == "__main__":
    import sys
    state = capital.run(country=sys.argv[1], temperature=0)
    print("SCRIPT", state["answer"])
'''


def test_run_a_function_of_a_program_file(default_model_path, tmp_path, capsys):
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM)
    assert main(["run", str(path), "--model", str(default_model_path), "--function", "capital",
                 "--arg", "country=France"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"answer"} and out["answer"].strip()
    assert main(["run", str(path), "--model", str(default_model_path), "--", "Japan"]) == 0
    assert "SCRIPT" in capsys.readouterr().out


def test_unknown_function_is_one_clear_line(default_model_path, tmp_path, capsys):
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM)
    assert main(["run", str(path), "--model", str(default_model_path), "--function", "nope"]) == 1
    assert "has no @function named 'nope'" in capsys.readouterr().err
