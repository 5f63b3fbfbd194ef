"""The grammars shipped in grammars/lark/, loadable by name."""

from __future__ import annotations

from importlib import resources

from radixgen.grammars.errors import GrammarError


def builtin_grammar_names() -> list[str]:
    folder = resources.files("radixgen.grammars").joinpath("lark")
    return sorted(p.name[: -len(".lark")] for p in folder.iterdir() if p.name.endswith(".lark"))


def load_builtin_grammar(name: str) -> str:
    """The Lark text of a shipped grammar: "json", "sql", "arithmetic", "tool_call"."""
    path = resources.files("radixgen.grammars") / "lark" / f"{name}.lark"
    if not path.is_file():
        raise GrammarError(f"no built-in grammar {name!r}; available: {', '.join(builtin_grammar_names())}")
    return path.read_text(encoding="utf-8")
