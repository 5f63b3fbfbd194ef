"""The language on the real default model (SmolLM2-135M, CPU), modelled on SGLang's frontend tests: few-shot QA,
roles, select, typed and constrained gens, variable reuse, tool calls, ReAct, fork/join, streaming, min_tokens,
prefix caching. Greedy decoding and small token budgets keep it to about a minute."""

from __future__ import annotations

import json
import re

import pytest
from lang_engine_cache import shared_engine

import radixgen as sgl
from radixgen.lang.backend import SelectRequest
from radixgen.lang.engine_backend import EngineBackend

IPV4 = r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"


@pytest.fixture(scope="module")
def engine(default_model_path):
    return shared_engine(str(default_model_path))


@pytest.fixture(scope="module")
def backend(engine):
    return EngineBackend(engine)


def run(fn, backend, **kwargs):
    state = fn.run(backend=backend, temperature=0, **kwargs)
    assert state.error() is None, state.error()
    return state


@sgl.function
def few_shot_qa(s, question):
    s += "The following are questions with answers.\n\n"
    s += "Q: What is the capital of France?\nA: Paris\n\n"
    s += "Q: What is the capital of Germany?\nA: Berlin\n\n"
    s += "Q: What is the capital of Italy?\nA: Rome\n\n"
    s += "Q: " + question + "\nA:" + sgl.gen("answer", max_tokens=6, stop="\n")


def test_few_shot_qa(backend):
    state = run(few_shot_qa, backend, question="What is the capital of Spain?")
    assert "Madrid" in state["answer"]
    assert state.text().endswith("A:" + state["answer"])


def test_default_backend_accepts_an_engine(engine):
    import importlib

    fn_mod = importlib.import_module("radixgen.lang.function")
    saved = fn_mod.get_default_backend()
    try:
        sgl.set_default_backend(engine)
        assert isinstance(fn_mod.get_default_backend(), EngineBackend)
        state = few_shot_qa.run(question="What is the capital of Spain?", temperature=0)
        assert state.error() is None and "Madrid" in state["answer"]
    finally:
        fn_mod._default_backend = saved


def test_second_run_reports_its_prefix_cached(backend):
    first = run(few_shot_qa, backend, question="What is the capital of Japan?")
    second = run(few_shot_qa, backend, question="What is the capital of Japan?")
    prompt_tokens = second.get_meta_info("answer")["prompt_tokens"]
    assert second.get_meta_info("answer")["cached_tokens"] >= prompt_tokens - 1
    assert second["answer"] == first["answer"]


@sgl.function
def multi_turn_wrapped(s, q1, q2):
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(q1)
    s += sgl.assistant(sgl.gen("a1", max_tokens=12))
    s += sgl.user(q2)
    s += sgl.assistant(sgl.gen("a2", max_tokens=12))


@sgl.function
def multi_turn_scoped(s, q1, q2):
    with s.system():
        s += "You are a helpful assistant."
    with s.user():
        s += q1
    with s.assistant():
        s += sgl.gen("a1", max_tokens=12)
    with s.user():
        s += q2
    with s.assistant():
        s += sgl.gen("a2", max_tokens=12)


def test_multi_turn_roles_both_forms_match_the_model_template(backend, engine):
    kw = {"q1": "What is the capital of France?", "q2": "And of Germany?"}
    wrapped = run(multi_turn_wrapped, backend, **kw)
    scoped = run(multi_turn_scoped, backend, **kw)
    assert wrapped.text() == scoped.text()
    messages = scoped.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == scoped["a1"]
    assert scoped.text() == engine.tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    assert "Paris" in scoped["a1"]


@sgl.function
def classify(s, text):
    s += "Text: " + text + "\nSentiment (positive or negative):"
    s += sgl.select("label", choices=[" positive", " negative"])


@pytest.mark.parametrize("method", ["token_length_normalized", "greedy_token_selection",
                                    "unconditional_likelihood_normalized"])
def test_select_scores_every_choice_in_one_batched_call(backend, engine, method):
    @sgl.function
    def sky(s):
        s += "The color of a clear sky during the day is"
        s += sgl.select("color", choices=[" blue", " green", " purple"], choices_method=method)

    before = engine.get_stats()
    state = run(sky, backend)
    after = engine.get_stats()
    meta = state.get_meta_info("color")
    scores = meta["normalized_prompt_logprobs"]
    assert len(scores) == 3 and state["color"] == [" blue", " green", " purple"][scores.index(max(scores))]
    if method != "unconditional_likelihood_normalized":  # that one discounts what is likely a priori
        assert state["color"] == " blue"
    calls = 2 if method == "unconditional_likelihood_normalized" else 1
    assert after["finished"] - before["finished"] == 3 * calls  # one prefill per choice, no decoding
    assert after["generated_tokens"] == before["generated_tokens"]


def test_select_batch_scores_like_one_at_a_time(backend):
    long_prompt = "Here is a long review. " * 12 + "Overall the film was great.\nSentiment:"
    requests = [
        SelectRequest("Text: I loved it!\nSentiment:", (" positive", " negative")),
        SelectRequest("The color of a clear sky is", (" blue", " green", " purple")),
        SelectRequest("The color of grass is", (" green", " red"), "unconditional_likelihood_normalized"),
        SelectRequest(long_prompt, (" positive", " negative"), "greedy_token_selection"),  # a group of its own
    ]
    batched = backend.select_batch(requests)
    for req, got in zip(requests, batched):
        alone = backend.select(req.prompt, req.choices, req.method)
        assert got.choice == alone.choice
        assert got.meta_info["normalized_prompt_logprobs"] == pytest.approx(
            alone.meta_info["normalized_prompt_logprobs"], abs=2e-3)


def test_select_among_labels(backend):
    assert run(classify, backend, text="I loved this movie, it was wonderful!")["label"] == " positive"
    assert run(classify, backend, text="Terrible food and rude staff. Never again.")["label"] == " negative"


@sgl.function
def expert_answer(s, question):
    s += "Question: " + question + "\n"
    s += "A good expert to answer this question is a" + sgl.gen("expert", max_tokens=6, stop=[".", "\n"]) + ".\n"
    s += "As a" + s["expert"] + ", my answer is:" + sgl.gen("answer", max_tokens=12, stop="\n")


def test_expert_answer_reuses_a_variable(backend):
    state = run(expert_answer, backend, question="How do vaccines work?")
    expert = state["expert"]
    assert expert and state.text().count(expert) == 2
    assert "As a" + expert + ", my answer is:" in state.text()


@sgl.function
def tool_use(s, a, b):
    s += f"Write a Python expression that multiplies {a} by {b}.\nExpression:"
    s += sgl.gen("expr", max_tokens=10, stop="\n")
    s += "\nDone.\n"
    result = a * b  # the "tool": Python computes, the program continues with its output
    s += f"Result: {result}\nSo {a} times {b} is" + sgl.gen("final", max_tokens=4, stop="\n")


def test_tool_call_in_mid_program(backend):
    state = run(tool_use, backend, a=12, b=3)
    assert "Result: 36\n" in state.text()
    assert "36" in state["final"]


@sgl.function
def react(s, question, max_steps=3):
    s += "Answer the question with a search if needed.\nQuestion: " + question + "\n"
    for step in range(max_steps):
        s += "Action:" + sgl.select(f"act{step}", choices=[" search", " finish"])
        if s[f"act{step}"] == " search":
            s += " " + sgl.gen(f"query{step}", max_tokens=8, stop="\n") + "\n"
            s += "Observation: The Eiffel Tower is 330 metres tall.\n"
        else:
            s += "\nAnswer:" + sgl.gen("answer", max_tokens=8, stop="\n")
            return


def test_react_loop_branches_on_a_select(backend):
    state = run(react, backend, question="How tall is the Eiffel Tower?")
    actions = [v for k, v in state.variables().items() if k.startswith("act")]
    assert actions and set(actions) <= {" search", " finish"}
    for i, act in enumerate(actions):  # each branch taken left its mark
        assert (f"query{i}" in state.variables()) == (act == " search")
    assert ("answer" in state.variables()) == (actions[-1] == " finish")


@sgl.function
def parallel_tips(s, topic):
    s += "Here are two tips about " + topic + ".\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Tip {i + 1}:" + sgl.gen("tip", max_tokens=8, min_tokens=2)
    forks.join()
    s += "Tip 1:" + forks[0]["tip"] + "\nTip 2:" + forks[1]["tip"] + "\nSummary:" + sgl.gen("summary", max_tokens=8)


def test_fork_join_decodes_in_parallel_and_branches_share_the_prefix(backend):
    state = run(parallel_tips, backend, topic="staying healthy")
    tips = state["tip"]
    assert isinstance(tips, list) and len(tips) == 2 and all(tips)
    assert f"Tip 1:{tips[0]}\nTip 2:{tips[1]}" in state.text()
    assert state["summary"]


def test_fork_branch_meta_counts_cached_prefix_tokens(backend):
    @sgl.function
    def branches(s):
        s += "List three fruits that are red or yellow, one per line:\n"
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"{i + 1}." + sgl.gen("fruit", max_tokens=4, stop="\n")
        forks.join()
        for i, f in enumerate(forks):
            s.set_var(f"meta{i}", f.get_meta_info("fruit"))

    state = run(branches, backend)
    prefix = len(backend.tokenizer.encode("List three fruits that are red or yellow, one per line:\n"))
    for i in range(3):
        assert state[f"meta{i}"]["cached_tokens"] >= prefix - 1


def test_streaming_whole_text_and_one_variable(backend):
    state = few_shot_qa.run(question="What is the capital of Spain?", backend=backend, temperature=0, stream=True)
    streamed = "".join(state.text_iter())
    assert streamed == state.text() and "Madrid" in streamed
    state = few_shot_qa.run(question="What is the capital of Spain?", backend=backend, temperature=0, stream=True)
    pieces = list(state.text_iter("answer"))
    assert len(pieces) >= 1 and "".join(pieces) == state["answer"]


def test_min_tokens_holds_off_the_end(backend):
    @sgl.function
    def short(s, min_tokens):
        s += "Q: What is the capital of France?\nA: Paris\nQ: What is the capital of Spain?\nA:"
        s += sgl.gen("reply", max_tokens=16, min_tokens=min_tokens, stop="\n")

    free = run(short, backend, min_tokens=None)
    forced = run(short, backend, min_tokens=10)
    assert free.get_meta_info("reply")["completion_tokens"] < 10
    assert forced.get_meta_info("reply")["completion_tokens"] >= 10


def test_failed_model_call_is_kept_in_the_state(backend):
    @sgl.function
    def too_long(s):
        s += "word " * 10000 + sgl.gen("x", max_tokens=2)

    state = too_long.run(backend=backend)
    assert state.error() is not None and "context" in str(state.error())


def test_run_batch_compiled_equals_eager(backend):
    batch = [{"question": q} for q in ("What is the capital of Spain?", "What is the capital of Poland?")]
    eager = few_shot_qa.run_batch(batch, backend=backend, temperature=0)
    compiled = few_shot_qa.compile().run_batch(batch, backend=backend, temperature=0)
    assert [s["answer"] for s in compiled] == [s["answer"] for s in eager]


# -- constrained gens: need radixgen.grammars wired into the engine ---------------------------------------------

def test_integer_decode_and_dtype_gens(backend, engine):

    @sgl.function
    def typed(s):
        s += "Q: How many legs does a spider have?\nA: " + sgl.gen_int("legs", max_tokens=4) + "\n"
        s += "Q: What is pi to two decimals?\nA: " + sgl.gen("pi", dtype=float, max_tokens=6) + "\n"
        s += "Q: Is water wet? Answer True or False.\nA: " + sgl.gen("wet", dtype=bool, max_tokens=3) + "\n"
        s += "Q: Name a color in double quotes.\nA: " + sgl.gen_string("color", max_tokens=8)

    state = run(typed, backend)
    assert isinstance(state["legs"], int)
    assert isinstance(state["pi"], float)
    assert isinstance(state["wet"], bool)
    assert isinstance(state["color"], str) and '"' not in state["color"]


def test_ipv4_regex(backend, engine):

    @sgl.function
    def ip(s):
        s += "Q: What is the IP address of the Google DNS servers?\nA: " + sgl.gen("ip", max_tokens=16, regex=IPV4)

    assert re.fullmatch(IPV4, run(ip, backend)["ip"])


def test_json_by_per_field_regex(backend, engine):

    @sgl.function
    def character(s, name):
        s += name + " is a character in Harry Potter. Fill in the information.\n"
        s += "{\n"
        s += '  "name": "' + sgl.gen("name", max_tokens=8, regex=r"[A-Za-z ]{1,20}") + '",\n'
        s += '  "house": "' + sgl.gen("house", max_tokens=6, regex=r"(Gryffindor|Slytherin|Ravenclaw|Hufflepuff)")
        s += '",\n  "age": ' + sgl.gen_int("age", max_tokens=3) + "\n}"

    state = run(character, backend, name="Hermione Granger")
    data = json.loads(state.text()[state.text().index("{"):])
    assert data["house"] in ("Gryffindor", "Slytherin", "Ravenclaw", "Hufflepuff")
    assert isinstance(data["age"], int)


def test_json_by_schema_is_parseable_and_valid(backend, engine):
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}

    @sgl.function
    def extract(s, text):
        s += "Extract the city and its population as JSON.\nText: " + text + "\nJSON: "
        s += sgl.gen("data", max_tokens=24, json_schema=schema)

    state = run(extract, backend, text="Paris has about 2100000 inhabitants.")
    jsonschema.validate(json.loads(state["data"]), schema)


def test_logprobs_of_a_gen_are_in_its_meta_info(backend):
    @sgl.function
    def prog(s):
        s += "The capital of France is" + sgl.gen("city", max_tokens=3, return_logprob=True, top_logprobs_num=2)

    meta = run(prog, backend).get_meta_info("city")
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])


def test_invalid_constraint_is_reported_in_the_state(backend, engine):

    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("bad", max_tokens=2, regex="(unclosed")

    error = prog.run(backend=backend).error()
    assert isinstance(error, ValueError) and "regex" in str(error)
