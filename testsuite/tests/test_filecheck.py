"""Golden tests: every `*.test` file under testsuite/filecheck runs its `RUN:` lines (`kstrata` is this
package's CLI, `%s` the test file, `%S` its directory) and pipes the output through FileCheck."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "filecheck"
TESTS = sorted(ROOT.rglob("*.test"))


def _run_lines(path: Path) -> list[str]:
    lines = [m.group(1) for m in re.finditer(r"^(?://|;)\s*RUN:\s*(.*)$", path.read_text(), re.M)]
    assert lines, f"{path} has no RUN line"
    return lines


@pytest.mark.parametrize("path", TESTS, ids=[str(t.relative_to(ROOT)) for t in TESTS])
def test_golden(path: Path) -> None:
    kstrata = f"{shlex.quote(sys.executable)} -m kstrata.tools.cli"
    filecheck = f"{shlex.quote(sys.executable)} -m filecheck"
    for line in _run_lines(path):
        command = (line.replace("%S", shlex.quote(str(path.parent))).replace("%s", shlex.quote(str(path)))
                   .replace("kstrata ", kstrata + " ", 1).replace("| filecheck", "| " + filecheck))
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=300,
                              check=False, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        assert proc.returncode == 0, f"{path.name}: {line}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_every_builtin_pass_has_a_golden_test() -> None:
    from kstrata.passes.registry import BUILTIN_PASSES

    text = "\n".join(t.read_text() for t in TESTS)
    missing = [name for name in BUILTIN_PASSES if f"({name}" not in text and f",{name}" not in text]
    assert not missing, f"passes without a golden test: {missing}"
