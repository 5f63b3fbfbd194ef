"""Every real chat template renders exactly as transformers' apply_chat_template renders it."""

from __future__ import annotations

import pytest
from jinja2.exceptions import TemplateError

from radixgen.tokenizer.chat_template import render_chat_template

transformers_chat = pytest.importorskip("transformers.utils.chat_template_utils")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city — with a non-ASCII dash and ünïcödé",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "城市"}},
                "required": ["city"],
            },
        },
    }
]

CONVERSATIONS = {
    "user_only": [{"role": "user", "content": 'Hello there! <b>bold</b> & "quotes"'}],
    "system": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "multi_turn": [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about 日本語."},
        {"role": "assistant", "content": "Why did the tokenizer split? 😀"},
        {"role": "user", "content": "Another one."},
    ],
    "none_values_dropped": [{"role": "user", "content": "x", "name": None}],
}
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}


def _templates(fixtures_dir):
    return sorted((fixtures_dir / "tokenizers" / "chat-templates").glob("*.jinja"))


def _reference(
    template: str, messages, add_generation_prompt: bool, tools=None, special=SPECIAL, **kwargs
) -> str:
    rendered, _ = transformers_chat.render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        **special,
        **kwargs,
    )
    return rendered[0]


def _outcome(render):
    try:
        return ("ok", render())
    except TemplateError as exc:  # e.g. Gemma refuses a system role; both must refuse the same way
        return ("error", str(exc))


def test_all_templates_present(fixtures_dir):
    assert len(_templates(fixtures_dir)) == 7


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_templates_render_like_transformers(fixtures_dir, conversation, add_generation_prompt):
    messages = CONVERSATIONS[conversation]
    rendered_any = False
    for path in _templates(fixtures_dir):
        template = path.read_text()
        want = _outcome(lambda t=template: _reference(t, messages, add_generation_prompt))
        got = _outcome(lambda t=template: render_chat_template(t, messages, add_generation_prompt, **SPECIAL))
        assert got == want, path.name
        rendered_any |= want[0] == "ok"
    assert rendered_any


def test_templates_with_tools_render_like_transformers(fixtures_dir):
    messages = CONVERSATIONS["system"]
    for path in _templates(fixtures_dir):
        template = path.read_text()
        want = _outcome(lambda t=template: _reference(t, messages, True, tools=TOOLS))
        got = _outcome(lambda t=template: render_chat_template(t, messages, True, tools=TOOLS, **SPECIAL))
        assert got == want, path.name


def test_extra_kwargs_reach_the_template(fixtures_dir):
    template = (fixtures_dir / "tokenizers" / "chat-templates" / "Qwen-Qwen3-0.6B.jinja").read_text()
    messages = CONVERSATIONS["user_only"]
    off = render_chat_template(template, messages, True, enable_thinking=False, **SPECIAL)
    assert off == _reference(template, messages, True, enable_thinking=False)
    assert "<think>" in off and off != render_chat_template(template, messages, True, **SPECIAL)


def test_tokenizer_apply_chat_template_uses_its_tokens(fixtures_dir):
    from radixgen.tokenizer import Tokenizer

    tok = Tokenizer.from_file(fixtures_dir / "tokenizers" / "smollm2-135m-instruct.tokenizer.gguf")
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    special = {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
    }
    assert text == _reference(tok.chat_template, [{"role": "user", "content": "Hi"}], True, special=special)
    assert tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=False).endswith(
        "<|im_end|>\n"
    )


def test_raise_exception_surfaces_as_template_error():
    with pytest.raises(TemplateError, match="nope"):
        render_chat_template("{{ raise_exception('nope') }}", [], True)


def test_sandbox_blocks_attribute_escapes():
    from jinja2.exceptions import SecurityError

    with pytest.raises(SecurityError):
        render_chat_template("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}", [], True)
