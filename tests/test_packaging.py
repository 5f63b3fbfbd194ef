"""Every package folder is listed in pyproject.toml, so a built wheel is complete."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")


def test_every_package_folder_is_listed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(cfg["tool"]["setuptools"]["packages"])
    pkg_dir = cfg["tool"]["setuptools"]["package-dir"]
    roots = {name: ROOT / path for name, path in pkg_dir.items()}
    found = set()
    for name, folder in roots.items():
        parent = name.rsplit(".", 1)[0]
        if "." in name and parent in roots and (ROOT / pkg_dir[parent]) in folder.parents:
            continue
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert found - listed == set(), f"package folders missing from pyproject packages: {sorted(found - listed)}"
    assert listed - found == set(), f"listed packages without a folder: {sorted(listed - found)}"
    for name in listed:
        assert name in pkg_dir, f"{name} has no package-dir mapping"
