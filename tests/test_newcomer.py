"""A newcomer's first ten minutes: clone the repository, run the README's commands as written (slow).

The clone is of the committed tree, into a temporary folder, with a fresh virtual environment and a fresh
model cache. The environment sees the packages of the one running this test (`--system-site-packages`), so the
README's pip commands find torch and the other requirements installed and download none of them again; what
they install is radixgen itself, editable, from the clone (checked). The commands are read from README.md's
"Install and test" and "Quickstart" sections: every line of their `bash` blocks runs in the clone (the CPU
torch command only where CUDA is absent, as the README says), then the README's program. The clone's own
`pytest` must pass with no test skipped for a missing model or data file.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CPU_TORCH = "download.pytorch.org/whl/cpu"
# Skip reasons that depend on the machine, not on anything the repository could ship.
MACHINE_SKIPS = ("needs CUDA", "slow; set RADIXGEN_SLOW=1", "not available", "this torch build", "CUDA present",
                 "runs on CUDA")


def readme_section(readme: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", readme, re.S | re.M)
    assert match, f"README.md has no section {title!r}"
    return match.group(1)


def code_blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", section, re.S | re.M)


def commands(section: str) -> list[str]:
    return [line.strip() for block in code_blocks(section, "bash") for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_readme_parsing_finds_the_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install = commands(readme_section(readme, "Install and test"))
    assert 'pip install -e ".[dev]"' in install and "pytest" in install
    assert any(CPU_TORCH in c for c in install)
    quickstart = readme_section(readme, "Quickstart")
    assert any(c.startswith("radixgen generate ") for c in commands(quickstart))
    assert any("import radixgen" in block for block in code_blocks(quickstart, "python"))


@pytest.mark.slow
def test_readme_commands_in_a_fresh_clone(tmp_path):
    import torch

    clone, venv, cache = tmp_path / "radixgen", tmp_path / "venv", tmp_path / "cache"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RADIXGEN_SLOW", "VIRTUAL_ENV", "PYTHONPATH")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               RADIXGEN_CACHE_DIR=str(cache))

    def sh(command: str, timeout: float) -> subprocess.CompletedProcess:
        proc = subprocess.run(["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        assert proc.returncode == 0, f"`{command}` failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        return proc

    readme = (clone / "README.md").read_text(encoding="utf-8")
    for command in commands(readme_section(readme, "Install and test")):
        if CPU_TORCH in command and torch.cuda.is_available():
            continue
        if command == "pytest":
            proc = sh("python -m pytest -q -p no:cacheprovider -ra", timeout=7200)
            skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
            unexpected = [line for line in skipped if not any(reason in line for reason in MACHINE_SKIPS)]
            assert unexpected == [], "\n".join(unexpected)
        else:
            sh(command, timeout=3600)
    # From another folder: in the clone's root, `import radixgen` finds the clone's folder whatever is installed.
    where = sh("cd / && python -c 'import radixgen.lang; print(radixgen.lang.__file__)'", timeout=120).stdout.strip()
    assert Path(where).is_relative_to(clone), f"radixgen imports from {where}, not from the clone"

    quickstart = readme_section(readme, "Quickstart")
    for command in commands(quickstart):
        proc = sh(command, timeout=600)
        if command.startswith("radixgen generate ") and "France" in command:
            assert "Paris" in proc.stdout, proc.stdout
    # In a folder of its own: beside the clone (a folder named radixgen), the script's folder on sys.path would
    # make `import radixgen` that folder as a namespace package instead of the installed one.
    program = tmp_path / "program" / "readme_program.py"
    program.parent.mkdir()
    program.write_text(next(b for b in code_blocks(quickstart, "python") if "import radixgen" in b))
    proc = sh(f"python {shlex.quote(str(program))}", timeout=600)
    assert proc.stdout.strip(), proc.stderr
