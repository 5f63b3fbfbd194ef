"""The packages' imports point one way: front door -> lang -> runtime -> radix, kernels, grammars, tokenizer.

Every `import` and `from ... import` of every source file (at any depth, lazy ones inside functions included)
is read with `ast`; an arrow that runs back up a layer, or between two leaf libraries, fails the test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# folder -> the import package it holds
FOLDERS = {"radixgen": "radixgen", "lang": "radixgen.lang", "runtime": "radixgen.runtime",
           "radix": "radixgen.radix", "kernels": "radixgen.kernels", "grammars": "radixgen.grammars",
           "tokenizer": "radixgen.tokenizer"}
LEAVES = {"radix", "kernels", "grammars", "tokenizer"}
# layer -> the layers it may import (itself always)
ALLOWED = {
    "radixgen": {"lang", "runtime", *LEAVES},
    "lang": {"runtime", *LEAVES},
    "runtime": set(LEAVES),
    **{leaf: set() for leaf in LEAVES},
}


def _layer_of(module: str) -> str | None:
    """The layer an absolute module name belongs to (None: not radixgen's)."""
    parts = module.split(".")
    if parts[0] != "radixgen":
        return None
    if len(parts) > 1 and parts[1] in FOLDERS and parts[1] != "radixgen":
        return parts[1]
    return "radixgen"


def _imports(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in `path`, relative ones resolved against `package`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # level 1 is the file's own package (its folder), each further level one up
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            if module == "radixgen":  # `from radixgen import kernels` imports the subpackage
                out.extend((node.lineno, f"radixgen.{alias.name}") for alias in node.names)
            else:
                out.append((node.lineno, module))
    return out


def _package_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    top = FOLDERS[rel.parts[0]]
    return ".".join([top, *rel.parts[1:-1]])


def _sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_every_package_folder_is_checked():
    assert len(_sources()) > 100


@pytest.mark.parametrize("layer", sorted(FOLDERS))
def test_no_import_runs_back_up(layer: str):
    wrong = []
    for path in _sources():
        if path.relative_to(ROOT).parts[0] != layer:
            continue
        for line, module in _imports(path, _package_of(path)):
            target = _layer_of(module)
            if target is None or target == layer:
                continue
            if target not in ALLOWED[layer]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module} ({layer} -> {target})")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_relative_imports_resolve_inside_their_package():
    assert _layer_of("radixgen.tokenizer.bpe") == "tokenizer"
    assert _layer_of("radixgen") == "radixgen"
    assert _layer_of("radixgen.server.app") == "radixgen"
    assert _layer_of("numpy") is None
