"""Every example in examples/ runs on the default model (small token budgets, one shared engine)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from lang_engine_cache import shared_engine

from radixgen.lang.engine_backend import EngineBackend

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str):
    """Import examples/NAME.py under a private module name (examples/ never goes on sys.path)."""
    spec = importlib.util.spec_from_file_location(f"radixgen_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def engine(default_model_path):
    return shared_engine(str(default_model_path))


@pytest.fixture(scope="module")
def backend(engine):
    return EngineBackend(engine)


def test_every_example_has_a_test():
    tested = {"quickstart", "chat", "tree_of_thought", "react_agent", "batch", "json_extraction", "regex_constraints",
              "tool_agent"}
    assert {p.stem for p in EXAMPLES.glob("*.py")} == tested


def test_quickstart(backend):
    out = load("quickstart").run(backend, max_tokens=8)
    assert "Tokyo" in out["answer"]
    assert out["cached_tokens"] > 20  # the few-shot prefix was reused
    assert len(out["batch"]) == 2


def test_chat(backend, engine):
    out = load("chat").run(backend, max_tokens=12)
    assert [m["role"] for m in out["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert out["text"] == engine.tokenizer.apply_chat_template(out["messages"], add_generation_prompt=False)


def test_tree_of_thought(backend):
    out = load("tree_of_thought").run(backend, max_tokens=8)
    assert len(out["thoughts"]) == 3
    assert out["best"] in (" 1", " 2", " 3")
    assert len(out["batch_answers"]) == 2 and "graph plan" in out["plan"]


def test_react_agent(backend, engine):
    module = load("react_agent")
    assert module.calculator("12 * 7") == "84"
    assert module.calculator("__import__('os')").startswith("error")
    out = module.run(backend, max_tokens=8)
    assert "action0" in out["variables"] and "answer" in out["variables"]
    if out["variables"]["action0"] == " calculator":  # the tool ran on the model's (regex-shaped) input
        expr = out["variables"]["expr0"]
        assert re.fullmatch(module.ARITHMETIC, expr)
        assert f"Expression: {expr}\nObservation: {module.calculator(expr)}\n" in out["text"]


def test_batch(backend):
    out = load("batch").run(backend, max_tokens=6, progress_bar=True)
    assert out["errors"] == []
    assert out["eager"] == out["compiled"]
    assert "Rome" in out["eager"][0]


def test_json_extraction(backend, engine):
    out = load("json_extraction").run(backend, max_tokens=40)
    assert all(isinstance(r.age, int) for r in out["records"])


def test_regex_constraints(backend, engine):
    module = load("regex_constraints")
    out = module.run(backend, max_tokens=16)
    assert re.fullmatch(module.IPV4, out["dns"])
    assert re.fullmatch(module.ISO_DATE, out["moon"]) and re.fullmatch(module.ISO_DATE, out["wall"])


@pytest.mark.slow
def test_tool_agent(backend):
    import jsonschema

    module = load("tool_agent")
    out = module.run(backend, max_tokens=48)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in module.TOOLS}
    assert out["calls"] and out["calls"][0]["name"] == "get_weather"
    for call in out["calls"]:
        jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])


def test_quickstart_runs_as_one_command(default_model_path):
    proc = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py"), "--model", str(default_model_path),
                           "--max-tokens", "4"], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Q: What is the capital of Japan?")
