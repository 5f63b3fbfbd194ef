"""Chat roles as text: the begin/end strings of each role, derived from the model's own chat template.

A program writes `user(...)` turns one at a time, so it needs each role's prefix and suffix rather than a whole
rendered conversation. `derive_role_template` renders growing conversations with sentinel contents through the
model's template and takes the differences: the text a template puts around a message's content is that
role's begin/end; what it puts before the first user turn (a default system prompt, in SmolLM2's case) is the
`preamble` written when a conversation starts without a system turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

ApplyTemplate = Callable[[list[dict[str, str]], bool], str]

_SENTINEL = "\u2063RADIXGEN{}\u2063"


@dataclass(frozen=True)
class RoleTemplate:
    """Begin/end text per role; `preamble` starts a conversation that opens without a system turn."""

    begin: dict[str, str]
    end: dict[str, str]
    preamble: str = ""
    system_preamble: str = ""

    def role_begin(self, role: str, first_turn: bool) -> str:
        """Text that opens `role`; the first turn of a conversation also carries the template's preamble."""
        if role not in self.begin:
            raise ValueError(f"this model's chat template has no {role!r} role; roles: {sorted(self.begin)}")
        lead = (self.system_preamble if role == "system" else self.preamble) if first_turn else ""
        return lead + self.begin[role]

    def role_end(self, role: str) -> str:
        return self.end[role]


CHATML = RoleTemplate(
    begin={r: f"<|im_start|>{r}\n" for r in ("system", "user", "assistant")},
    end={r: "<|im_end|>\n" for r in ("system", "user", "assistant")},
)

PLAIN = RoleTemplate(
    begin={"system": "", "user": "User: ", "assistant": "Assistant: "},
    end={"system": "\n\n", "user": "\n", "assistant": "\n"},
)


def _split(rendered: str, token: str, what: str) -> tuple[str, str]:
    if rendered.count(token) != 1:
        raise ValueError(f"cannot derive role template: the chat template did not render {what} content once")
    before, after = rendered.split(token)
    return before, after


def derive_role_template(apply: ApplyTemplate, bos_text: str = "", tokenizer_adds_bos: bool = False) -> RoleTemplate:
    """Derive role begin/end text from `apply(messages, add_generation_prompt)`, a chat-template renderer.

    A template that writes the BOS text (`bos_text`) itself keeps it only on the first turn, and drops it when
    the tokenizer adds BOS on its own (`tokenizer_adds_bos`), so the prompt never carries two.
    """
    s, u, a = (_SENTINEL.format(i) for i in range(3))
    user_msg, asst_msg = {"role": "user", "content": u}, {"role": "assistant", "content": a}

    only_user = apply([user_msg], False)
    preamble, user_end = _split(only_user, u, "user")
    with_asst = apply([user_msg, asst_msg], False)
    if not with_asst.startswith(only_user):
        raise ValueError("cannot derive role template: rendering is not incremental over turns")
    asst_begin, asst_end = _split(with_asst[len(only_user):], a, "assistant")
    gen_prompt = apply([user_msg], True)[len(only_user):]
    if gen_prompt:
        asst_begin = gen_prompt  # the template's own generation prompt is what the model was trained to see
    # The user begin is what precedes a later user turn's content; the rest of the first turn's opening text is
    # the conversation preamble (BOS, a default system prompt).
    second_user = apply([user_msg, asst_msg, {"role": "user", "content": s}], False)[len(with_asst):]
    user_begin, _ = _split(second_user, s, "second user")
    if not preamble.endswith(user_begin):
        raise ValueError("cannot derive role template: the user turn's opening text is not stable")
    begin = {"user": user_begin, "assistant": asst_begin}
    end = {"user": user_end, "assistant": asst_end}
    conv_preamble = preamble[: len(preamble) - len(user_begin)]

    system_preamble = ""
    sys_before: str | None
    sys_after: str | None
    try:
        sys_before, sys_after = _split(apply([{"role": "system", "content": s}], False), s, "system")
    except Exception:
        sys_before = sys_after = None
    if sys_before is not None and sys_after is not None:
        if bos_text and sys_before.startswith(bos_text):
            sys_before = sys_before[len(bos_text):]
            system_preamble = "" if tokenizer_adds_bos else bos_text
        begin["system"], end["system"] = sys_before, sys_after
    if tokenizer_adds_bos and bos_text and conv_preamble.startswith(bos_text):
        conv_preamble = conv_preamble[len(bos_text):]
    return RoleTemplate(begin=begin, end=end, preamble=conv_preamble, system_preamble=system_preamble)


def jinja_renderer(template: str, bos_token: str = "", eos_token: str = "") -> ApplyTemplate:
    """A renderer for a Hugging Face-style Jinja chat template (used when only the template text is known)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    compiled = env.from_string(template)

    def apply(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return compiled.render(
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token
        )

    return apply
