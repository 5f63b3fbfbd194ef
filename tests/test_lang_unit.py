"""The language's mechanics on a scripted stand-in backend (no model): state, roles, fork/join, streaming, errors,
batching, schemas, choice rules, chat-template derivation. Model behaviour is tested in test_lang_engine.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import threading
from collections.abc import Sequence
from typing import Literal, TypedDict

import pytest

import radixgen as sgl
from radixgen.lang.backend import Backend, GenResult, ModelCallError, SelectResult, StreamDelta
from radixgen.lang.chat_template import CHATML, derive_role_template, jinja_renderer
from radixgen.lang.choices import decide
from radixgen.lang.schema import schema_text
from radixgen.lang.spec import GenSpec, convert_dtype

SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ScriptedBackend(Backend):
    """Answers from `replies` (prompt suffix -> text, first match wins; default "x" * max tokens); records calls.
    `select` picks the choice named by the last "pick:<choice>" in the prompt, else the first."""

    def __init__(self, replies: dict[str, str] | None = None, fail_on: str | None = None) -> None:
        self.replies = replies or {}
        self.fail_on = fail_on
        self.calls: list[tuple[str, str, GenSpec | None]] = []
        self.lock = threading.Lock()

    def _reply(self, prompt: str, spec: GenSpec) -> str:
        if self.fail_on is not None and prompt.endswith(self.fail_on):
            raise ModelCallError("scripted failure")
        for suffix, text in self.replies.items():
            if prompt.endswith(suffix):
                return text
        return "x" * (spec.max_new_tokens or 1)

    def generate(self, prompt: str, spec: GenSpec) -> GenResult:
        with self.lock:
            self.calls.append(("generate", prompt, spec))
        return GenResult(self._reply(prompt, spec), {"prompt_tokens": len(prompt), "completion_tokens": 1})

    def stream(self, prompt: str, spec: GenSpec):
        text = self._reply(prompt, spec)
        for ch in text:
            yield StreamDelta(ch)
        yield StreamDelta("", True, {"completion_tokens": len(text)})

    def select(self, prompt: str, choices: Sequence[str], method: str, temperature: float = 0.0) -> SelectResult:
        with self.lock:
            self.calls.append(("select", prompt, None))
        picks = [c for c in choices if f"pick:{c}" in prompt]
        return SelectResult(picks[-1] if picks else choices[0], {"method": method})

    def cache_prefix(self, prompt: str) -> None:
        with self.lock:
            self.calls.append(("cache", prompt, None))

    def role_template(self):
        return CHATML


@sgl.function
def few_shot(s, question):
    s += "Q: What is 1+1?\nA: 2\n"
    s += "Q: " + question + "\nA:" + sgl.gen("answer", max_tokens=4, stop="\n")


def test_text_and_variables_accumulate_in_order():
    be = ScriptedBackend({"A:": " Paris"})
    state = few_shot.run(question="Capital of France?", backend=be)
    assert state.error() is None
    assert state["answer"] == " Paris"
    assert state.text() == "Q: What is 1+1?\nA: 2\nQ: Capital of France?\nA: Paris"
    spec = be.calls[0][2]
    assert spec.max_new_tokens == 4 and spec.stop == ("\n",)


def test_run_options_are_defaults_that_gens_override():
    @sgl.function
    def prog(s):
        s += sgl.gen("a") + sgl.gen("b", max_tokens=2, temperature=0.5)

    be = ScriptedBackend()
    prog.run(backend=be, max_new_tokens=3, temperature=0.0)
    a, b = (c[2] for c in be.calls)
    assert (a.max_new_tokens, a.temperature) == (3, 0.0)
    assert (b.max_new_tokens, b.temperature) == (2, 0.5)
    assert b.sampling_params() == {"max_new_tokens": 2, "temperature": 0.5}


def test_roles_both_forms_render_the_template_and_record_messages():
    @sgl.function
    def wrapped(s):
        s += sgl.system("Be brief.")
        s += sgl.user("Hi")
        s += sgl.assistant(sgl.gen("reply", max_tokens=2))

    @sgl.function
    def scoped(s):
        with s.system():
            s += "Be brief."
        with s.user():
            s += "Hi"
        with s.assistant():
            s += sgl.gen("reply", max_tokens=2)

    @sgl.function
    def begin_end(s):
        s += sgl.system_begin() + "Be brief." + sgl.system_end()
        s += sgl.user_begin() + "Hi" + sgl.user_end()
        s += sgl.assistant_begin() + sgl.gen("reply", max_tokens=2) + sgl.assistant_end()

    texts = {f.__name__: f.run(backend=ScriptedBackend()).text() for f in (wrapped, scoped, begin_end)}
    expected = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                "<|im_start|>assistant\nxx<|im_end|>\n")
    assert set(texts.values()) == {expected}
    assert scoped.run(backend=ScriptedBackend()).messages() == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "xx"}]


def test_role_inside_role_says_what_to_write_instead():
    @sgl.function
    def nested(s):
        with s.user():  # noqa: SIM117 - the nesting is the mistake under test
            with s.assistant():
                s += "oops"

    state = nested.run(backend=ScriptedBackend())
    assert "roles do not nest" in str(state.error())
    assert "with s.user()" in str(state.error())


def test_preamble_is_written_when_a_chat_starts_without_system():
    rt = derive_role_template(jinja_renderer(SMOL_TEMPLATE))
    assert rt.begin == {r: f"<|im_start|>{r}\n" for r in ("system", "user", "assistant")}
    assert rt.end["assistant"] == "<|im_end|>\n"
    assert rt.preamble.startswith("<|im_start|>system\nYou are a helpful AI")
    render = jinja_renderer(SMOL_TEMPLATE)
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    assert rt.role_begin("user", True) + "Hi" + rt.end["user"] + rt.begin["assistant"] + "Yo" + rt.end[
        "assistant"] == render(msgs, False)


def test_select_and_python_control_flow_on_its_value():
    @sgl.function
    def agent(s):
        s += "pick:search "
        s += sgl.select("action", choices=["search", "finish"])
        if s["action"] == "search":
            s += " result" + sgl.gen("obs", max_tokens=1)

    state = agent.run(backend=ScriptedBackend())
    assert state["action"] == "search" and state["obs"] == "x"
    assert sgl.gen("c", choices=["a", "b"]).__class__.__name__ == "Select"


def test_dtype_gens_convert_their_text():
    assert convert_dtype(" 42", int) == 42
    assert convert_dtype("3.5", float) == 3.5
    assert convert_dtype("True", bool) is True
    assert convert_dtype('"hi"', str) == "hi"
    assert convert_dtype('"cut ope', str) == "cut ope"  # max_tokens ended the span before its closing quote
    assert convert_dtype("+7 \n", int) == 7
    be = ScriptedBackend({"n=": "17"})

    @sgl.function
    def prog(s):
        s += "n=" + sgl.gen_int("n", max_tokens=3)

    state = prog.run(backend=be)
    assert state["n"] == 17
    assert be.calls[0][2].constraint.kind == "regex"


def test_fork_join_gathers_branch_variables_and_caches_the_prefix_once():
    @sgl.function
    def tot(s):
        s += "Question. "
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"Idea {i}:" + sgl.gen("idea", max_tokens=i + 1)
        forks.join()

    be = ScriptedBackend()
    state = tot.run(backend=be)
    assert state["idea"] == ["x", "xx", "xxx"]
    assert [c[0] for c in be.calls].count("cache") == 1
    assert state.text() == "Question. "


def test_var_scope_set_var_meta_and_nested_program():
    @sgl.function
    def inner(s, topic):
        s += "About " + topic + ":" + sgl.gen("fact", max_tokens=2)

    @sgl.function
    def outer(s):
        with s.var_scope("intro"):
            s += "Hello."
        inner(s, topic="cats")
        s.set_var("extra", 5)

    state = outer.run(backend=ScriptedBackend())
    assert state["intro"] == "Hello."
    assert state["fact"] == "xx" and state["extra"] == 5
    assert state.get_meta_info("fact")["completion_tokens"] == 1
    assert state.text() == "Hello.About cats:xx"


def test_streaming_whole_text_and_one_variable():
    @sgl.function
    def prog(s):
        s += "A:" + sgl.gen("a", max_tokens=3) + " B:" + sgl.gen("b", max_tokens=2)

    state = prog.run(backend=ScriptedBackend(), stream=True)
    assert "".join(state.text_iter()) == "A:xxx B:xx"
    state = prog.run(backend=ScriptedBackend(), stream=True)
    assert list(state.text_iter("b")) == ["x", "x"]

    async def collect():
        st = prog.run(backend=ScriptedBackend(), stream=True)
        return [d async for d in st.text_async_iter("a")]

    assert asyncio.run(collect()) == ["x", "x", "x"]


def test_run_batch_keeps_going_past_failed_programs():
    @sgl.function
    def prog(s, i):
        if i == 1:
            raise ValueError("bad input")
        s += f"item {i}:" + sgl.gen("out", max_tokens=1)
        if i == 2:
            s += "boom" + sgl.gen("never", max_tokens=1)
            s += s["never"]  # reading a value the failed call never produced

    states = prog.run_batch([{"i": i} for i in range(4)], backend=ScriptedBackend(fail_on="boom"),
                            progress_bar=True)
    assert [s.error() is None for s in states] == [True, False, False, True]
    assert "bad input" in str(states[1].error())
    assert isinstance(states[2].error(), ModelCallError)
    assert states[3]["out"] == "x"


def test_bind_and_positional_arguments():
    @sgl.function
    def prog(s, a, b):
        s += a + b

    be = ScriptedBackend()
    assert prog.bind(a="1").run(b="2", backend=be).text() == "12"
    assert prog.run("3", "4", backend=be).text() == "34"
    with pytest.raises(TypeError):
        prog.bind(c=1)


def test_default_backend_and_missing_backend_message():
    import importlib

    fn_mod = importlib.import_module("radixgen.lang.function")

    saved = fn_mod._default_backend
    try:
        fn_mod._default_backend = None
        with pytest.raises(RuntimeError, match="set_default_backend"):
            few_shot.run(question="q")
        sgl.set_default_backend(ScriptedBackend())
        assert few_shot.run(question="q").error() is None
    finally:
        fn_mod._default_backend = saved


def test_gen_argument_errors():
    with pytest.raises(ValueError, match="at most one"):
        sgl.gen("x", regex="a", dtype=int)
    with pytest.raises(ValueError, match="non-empty"):
        sgl.select("x", choices=[])
    with pytest.raises(ValueError, match="choices_method"):
        sgl.select("x", choices=["a"], choices_method="nope")
    assert sgl.gen("g", grammar="root ::= \"a\"").spec.constraint.kind == "ebnf"
    assert sgl.gen("g", grammar="start: \"a\"").spec.constraint.kind == "grammar"


@dataclasses.dataclass
class Person:
    name: str
    age: int
    email: str | None = None


class City(TypedDict):
    name: str
    population: int
    kind: Literal["city", "town"]


def test_json_schema_from_dict_string_dataclass_typeddict_pydantic():
    pydantic = pytest.importorskip("pydantic")

    class Item(pydantic.BaseModel):
        title: str
        tags: list[str]

    person = json.loads(schema_text(Person))
    assert person["required"] == ["name", "age"]
    assert person["properties"]["age"] == {"type": "integer"}
    assert person["properties"]["email"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    city = json.loads(schema_text(City))
    assert city["properties"]["kind"] == {"enum": ["city", "town"]} and city["required"] == ["name", "population",
                                                                                             "kind"]
    assert json.loads(schema_text(Item))["properties"]["tags"]["type"] == "array"
    assert json.loads(schema_text({"type": "string"})) == {"type": "string"}
    assert schema_text('{"type": "integer"}') == '{"type": "integer"}'
    with pytest.raises(ValueError):
        schema_text("{not json")


def test_choice_methods_follow_their_rules():
    lp = [[-1.0, -1.0], [-0.5, -3.0], [-2.0]]
    assert decide("token_length_normalized", lp).index == 0  # means: -1, -1.75, -2
    assert decide("greedy_token_selection", lp).index == 1  # best first token wins
    uncond = [[-0.1, -0.1], [-0.5, -3.0], [-5.0]]
    # cond - uncond means: -0.9, 0.0, 3.0: the last choice is unlikely a priori, so it wins
    assert decide("unconditional_likelihood_normalized", lp, uncond).index == 2
    scores = decide("token_length_normalized", lp)
    assert math.isclose(scores.meta_info()["normalized_prompt_logprobs"][1], -1.75)


@sgl.function
def tree(s, question):
    s += "You are a careful solver.\n"
    s += "Question: " + question + "\n"
    forks = s.fork(2)
    for f in forks:
        f += "Thought:" + sgl.gen("thought", max_tokens=2) + "\n"
    forks.join()
    s += "Best: " + forks[0]["thought"] + sgl.select("verdict", choices=["good", "bad"])


def test_trace_records_nodes_and_dependencies_readably():
    graph = tree.trace()
    assert graph.static
    kinds = [n.kind for n in graph.nodes]
    assert kinds[:3] == ["text", "text", "arg"] and "fork" in kinds and kinds.count("gen") == 2
    join = next(n for n in graph.nodes if n.kind == "join")
    gens = [n for n in graph.nodes if n.kind == "gen"]
    assert {g.id + 1 for g in gens} <= set(join.deps)  # join waits on each branch's last node
    var = next(n for n in graph.nodes if n.kind == "var")
    assert gens[0].id in var.deps and "thought of s1" in var.label  # forks[0]["thought"] reads branch 1
    printed = str(graph)
    assert "program tree(question)" in printed and "fork" in printed and "select" in printed
    assert [type(e).__name__ for e in graph.constant_prefix()] == ["Text", "Text"]  # up to the argument


def test_trace_names_fstring_misuse_and_stops_at_dynamic_control_flow():
    @sgl.function
    def bad(s, question):
        s += f"Q: {question}"

    with pytest.raises(TypeError, match=r"s \+= \"text \" \+ question"):
        bad.trace()

    @sgl.function
    def branching(s):
        s += "Go? " + sgl.select("go", choices=["yes", "no"])
        if s["go"] == "yes":
            s += sgl.gen("more")

    graph = branching.trace()
    assert not graph.static and "'go'" in graph.dynamic
    assert "traced up to here" in str(graph)


def test_compiled_plan_matches_eager_and_batches_calls():
    be_eager, be_comp = ScriptedBackend({"pick:good Thought:": "A"}), ScriptedBackend()
    batch = [{"question": f"q{i}"} for i in range(3)]
    eager = tree.run_batch(batch, backend=be_eager)
    compiled = tree.compile()
    states = compiled.run_batch(batch, backend=be_comp, progress_bar=True)
    assert [s.text() for s in states] == [s.text() for s in eager]
    assert [s["thought"] for s in states] == [["xx", "xx"]] * 3
    stats = compiled.stats
    # waves: fork-prefix prefills, then all 6 branch gens together, then the 3 selects
    assert stats.waves == 3 and stats.gens == 6 and stats.selects == 3
    assert stats.prefix_prefills == 1 + 3
    assert be_comp.calls[0] == ("cache", "You are a careful solver.\nQuestion: ", None)


def test_compiled_dynamic_program_runs_eagerly_after_prefix_prefill():
    @sgl.function
    def branching(s):
        s += "Go? " + sgl.select("go", choices=["yes", "no"])
        if s["go"] == "yes":
            s += sgl.gen("more", max_tokens=1)

    be = ScriptedBackend()
    states = branching.compile().run_batch([{}, {}], backend=be)
    assert [s["more"] for s in states] == ["x", "x"]
    assert be.calls[0] == ("cache", "Go? ", None)


LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@pytest.mark.parametrize("adds_bos", [False, True])
def test_role_template_keeps_bos_once(adds_bos):
    bos = "<|begin_of_text|>"
    rt = derive_role_template(jinja_renderer(LLAMA3_TEMPLATE, bos), bos, tokenizer_adds_bos=adds_bos)
    assert rt.begin["user"] == "<|start_header_id|>user<|end_header_id|>\n\n"
    assert rt.end["assistant"] == "<|eot_id|>"
    lead = "" if adds_bos else bos
    assert rt.role_begin("system", True) == lead + "<|start_header_id|>system<|end_header_id|>\n\n"
    assert rt.role_begin("user", True) == lead + rt.begin["user"]
    assert rt.role_begin("user", False) == rt.begin["user"]


def test_text_iter_accepts_sglang_var_name():
    @sgl.function
    def prog(s):
        s += "A:" + sgl.gen("a", max_tokens=2)

    assert list(prog.run(backend=ScriptedBackend(), stream=True).text_iter(var_name="a")) == ["x", "x"]


def test_nested_program_calls_trace_as_call_nodes_and_compile():
    @sgl.function
    def inner(s, topic):
        s += "About " + topic + ":" + sgl.gen("fact", max_tokens=2)

    @sgl.function
    def outer(s, topic):
        s += "Facts.\n"
        inner(s, topic=topic)
        s.set_var("done", True)

    graph = outer.trace()
    kinds = [n.kind for n in graph.nodes]
    assert kinds == ["text", "call_begin", "text", "arg", "text", "gen", "call_end", "set_var"]
    assert graph.static
    state = outer.compile().run(topic="owls", backend=ScriptedBackend())
    assert state.text() == "Facts.\nAbout owls:xx" and state["done"] is True


def test_unmatched_role_end_is_reported():
    @sgl.function
    def prog(s):
        s += "hi" + sgl.user_end()

    assert "user_end() without a matching user_begin()" in str(prog.run(backend=ScriptedBackend()).error())


def test_join_gathers_a_branch_value_equal_to_the_parents():
    @sgl.function
    def prog(s):
        s += "A" + sgl.gen("v", max_tokens=1)  # parent's v == "x"
        forks = s.fork(2)
        forks += sgl.gen("v", max_tokens=1)  # each branch regenerates the same text
        forks.join()

    assert prog.run(backend=ScriptedBackend())["v"] == ["x", "x"]


def test_compiled_run_separates_run_options_from_program_arguments():
    @sgl.function
    def prog(s, q):
        s += q + sgl.gen("a")

    be = ScriptedBackend()
    prog.compile().run(q="hi", temperature=0.5, backend=be)
    specs = [spec for kind, _, spec in be.calls if kind == "generate"]
    assert specs and specs[0].temperature == 0.5


def test_a_gen_spec_gives_the_engine_object_and_the_wire_dict():
    from radixgen.runtime.sampling_params import SamplingParams

    spec = sgl.gen("x", max_tokens=3, stop="\n", regex="[a-z]+").spec
    assert spec.to_sampling_params() == SamplingParams(max_new_tokens=3, stop=("\n",), regex="[a-z]+")
    assert spec.sampling_params() == {"max_new_tokens": 3, "stop": ["\n"], "regex": "[a-z]+"}


# -- SGLang's idioms (issue 22): each as SGLang's own test programs write it -----------------------------------
def test_fork_item_add_lambda_add_and_setitem_variables():
    @sgl.function
    def prog(s):
        forks = s.fork(3)
        forks += lambda i: f"branch {i}:"
        for i in range(3):
            forks[i] += sgl.gen("tip", max_tokens=i + 1)
        forks.join()
        s["label"] = "set"

    state = prog.run(backend=ScriptedBackend())
    assert state.error() is None
    assert state["tip"] == ["x", "xx", "xxx"] and state["label"] == "set"
    forks = few_shot.run(question="q", backend=ScriptedBackend()).fork(2)
    with pytest.raises(TypeError, match="cannot be replaced"):
        forks[0] = forks[1]


def test_text_async_iter_pairs_deltas_with_meta_info():
    @sgl.function
    def prog(s):
        s += "A:" + sgl.gen("answer", max_tokens=3)

    async def collect(state):
        return [item async for item in state.text_async_iter("answer", return_meta_data=True)]

    pairs = asyncio.run(collect(prog.run(backend=ScriptedBackend(), stream=True)))
    assert "".join(text for text, _ in pairs) == "xxx"
    assert all(isinstance(meta, dict) for _, meta in pairs)


def test_gen_n_keeps_every_answer_and_continues_with_the_first():
    @sgl.function
    def prog(s):
        s += "A:" + sgl.gen("answer", max_tokens=2, n=3) + "!"

    be = ScriptedBackend()
    state = prog.run(backend=be)
    assert state["answer"] == ["xx", "xx", "xx"] and state.text() == "A:xx!"
    assert sum(c[0] == "generate" for c in be.calls) == 3
    assert not prog.trace().static  # n > 1 runs eagerly under compile()
    with pytest.raises(ValueError, match="positive int"):
        sgl.gen("a", n=0)


def test_dtype_regexes_are_sglangs_and_dtype_names_work():
    from radixgen.lang.spec import DTYPE_REGEX

    sglang_regexes = {int: r"[-+]?[0-9]+[ \n]*", float: r"[-+]?[0-9]*\.?[0-9]+[ \n]*", bool: r"(True|False)",
                      str: r"\"[\w\d\s]*\""}  # sglang/lang/ir.py: REGEX_INT, REGEX_FLOAT, REGEX_BOOL, REGEX_STR
    assert sglang_regexes == DTYPE_REGEX
    assert sgl.gen("a", dtype="int").spec.constraint == sgl.gen("a", dtype=int).spec.constraint
    with pytest.raises(TypeError, match="dtype"):
        sgl.gen("a", dtype="list")


def test_run_on_a_list_of_argument_dicts_is_run_batch():
    states = few_shot.run([{"question": "a"}, {"question": "b"}], backend=ScriptedBackend({"A:": " y"}))
    assert [s["answer"] for s in states] == [" y", " y"]


def test_global_config_default_backend_is_the_default_backend_and_image_refuses():
    previous = sgl.get_default_backend()
    be = ScriptedBackend()
    try:
        sgl.global_config.default_backend = be
        assert sgl.get_default_backend() is be and sgl.global_config.default_backend is be
        assert few_shot.run(question="q")["answer"] == "xxxx"
        sgl.global_config.enable_precache_with_tracing = False  # accepted; no effect
    finally:
        sgl.global_config.default_backend = previous
        sgl.global_config.enable_precache_with_tracing = True
    with pytest.raises(NotImplementedError, match="text-only"):
        sgl.image("example_image.png")


def test_gen_json_schema_exact_language_reaches_every_backend():
    """`gen(json_schema=..., json_schema_infer_types=False)`: the engine's SamplingParams and the HTTP backends'
    sampling_params both carry it (a schema's type is then not inferred); without a json_schema it is refused."""
    g = sgl.gen("x", json_schema={"required": ["a"]}, json_schema_infer_types=False)
    sp = g.spec.to_sampling_params()
    assert sp.json_schema_infer_types is False and sp.constraint is not None and not sp.constraint.infer_types
    assert g.spec.sampling_params()["json_schema_infer_types"] is False
    assert "json_schema_infer_types" not in sgl.gen("y", json_schema={"required": ["a"]}).spec.sampling_params()
    with pytest.raises(ValueError, match="json_schema_infer_types"):
        sgl.gen("z", regex="a+", json_schema_infer_types=False)
