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


def _split(line: str, path: Path) -> tuple[list[str], list[str]]:
    """A RUN line `kstrata ARGS | filecheck ARGS` as the two argument lists (`%s`, `%S` substituted)."""
    command = line.replace("%S", shlex.quote(str(path.parent))).replace("%s", shlex.quote(str(path)))
    left, bar, right = command.partition("|")
    cli, check = shlex.split(left), shlex.split(right)
    assert cli[:1] == ["kstrata"] and bar and check[:1] == ["filecheck"], f"{path.name}: unsupported RUN line {line!r}"
    return cli[1:], check


def _filecheck(argv: list[str], text: str, tmp: Path) -> tuple[int, str]:
    """FileCheck (the `filecheck` package) in this process on `text`; returns its exit code and output."""
    import contextlib
    import io

    from filecheck.matcher import Matcher
    from filecheck.options import parse_argv_options

    given = tmp / "output.txt"
    given.write_text(text)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = Matcher.from_opts(parse_argv_options([*argv, "--input-file", str(given)])).run()
    return code, printed.getvalue()


@pytest.mark.parametrize("path", TESTS, ids=[str(t.relative_to(ROOT)) for t in TESTS])
def test_golden(path: Path, tmp_path: Path) -> None:
    """Each RUN line in this process: the CLI through typer's runner, its stdout through FileCheck (a CLI
    process and a FileCheck process per line cost about 4 s of imports; `test_golden_as_a_shell_command`
    keeps one line on the real command line)."""
    from typer.testing import CliRunner

    from kstrata.tools.cli import app

    runner = CliRunner()
    for line in _run_lines(path):
        cli, check = _split(line, path)
        merged = "2>&1" in cli  # the line checks what the CLI says on stderr too (why a pass skipped)
        result = runner.invoke(app, [a for a in cli if a != "2>&1"], catch_exceptions=False)
        assert result.exit_code == 0, f"{path.name}: {line}\n{result.output[-3000:]}"
        code, printed = _filecheck(check, result.output if merged else result.stdout, tmp_path)
        assert code == 0, f"{path.name}: {line}\n{printed[-3000:]}"


def test_golden_as_a_shell_command() -> None:
    """One RUN line exactly as written: `kstrata` and `filecheck` as processes, piped."""
    path = TESTS[0]
    line = _run_lines(path)[0]
    kstrata = f"{shlex.quote(sys.executable)} -m kstrata.tools.cli"
    filecheck = f"{shlex.quote(sys.executable)} -m filecheck"
    command = (line.replace("%S", shlex.quote(str(path.parent))).replace("%s", shlex.quote(str(path)))
               .replace("kstrata ", kstrata + " ", 1).replace("| filecheck", "| " + filecheck))
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, f"{path.name}: {line}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_golden_runner_fails_on_a_wrong_check(tmp_path: Path) -> None:
    """The in-process runner is not a rubber stamp: FileCheck rejects output its CHECK lines do not match."""
    check = tmp_path / "x.test"
    check.write_text("// CHECK: ld.global.nc\n")
    assert _filecheck(["filecheck", str(check)], "ld.global.b32 %r1\n", tmp_path)[0] != 0
    assert _filecheck(["filecheck", str(check)], "ld.global.nc.b32 %r1\n", tmp_path)[0] == 0


def test_every_builtin_pass_has_a_golden_test() -> None:
    from kstrata.passes.registry import BUILTIN_PASSES

    text = "\n".join(t.read_text() for t in TESTS)
    missing = [name for name in BUILTIN_PASSES if f"({name}" not in text and f",{name}" not in text]
    assert not missing, f"passes without a golden test: {missing}"
