"""Presentation (issue 21, items 4 and 6): numbers that agree, usage lines, piped tables, the README."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def kstrata(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kstrata.tools.cli", *args], capture_output=True, text=True,
                          timeout=300, check=False)


def test_readme_command_table_is_one_table_and_points_to_the_architecture() -> None:
    text = (ROOT / "README.md").read_text()
    start = text.index("| command | what it does |")
    block = text[start:text.index("\n\n", start)]
    rows = block.splitlines()
    assert all(r.startswith("|") for r in rows)
    listed = {m.group(1) for m in re.finditer(r"^\| `kstrata ([a-z-]+)", text, re.M)}
    assert {"asm", "eval", "bench", "verify", "run-passes", "ir", "passes", "task"} <= {
        m.group(1) for m in re.finditer(r"^\| `kstrata ([a-z-]+)", block, re.M)} <= listed
    assert "../shared" not in text
    assert "docs/architecture.md" in text and (ROOT / "docs" / "architecture.md").is_file()


def test_license_is_an_spdx_string_without_setuptools_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    assert re.search(r'^license = "Apache-2.0"$', (ROOT / "pyproject.toml").read_text(), re.M)
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the table form raised SetuptoolsDeprecationWarning here
        apply_configuration(Distribution(), ROOT / "pyproject.toml")


def test_eval_and_bench_usage_have_no_stray_subcommand() -> None:
    for cmd in ("eval", "bench"):
        proc = kstrata(cmd, "--help")
        assert proc.returncode == 0, proc.stderr
        usage = next(ln for ln in proc.stdout.splitlines() if "Usage:" in ln)
        assert "COMMAND" not in proc.stdout and "ARGS" not in usage, proc.stdout


def test_piped_tables_do_not_cut_names() -> None:
    proc = kstrata("suite", "list")
    assert proc.returncode == 0
    assert "leaky_relu_residual_fp16" in proc.stdout and "…" not in proc.stdout
    from kstrata.testsuite.kernels import all_kernels

    longest = max((k.description for k in all_kernels()), key=len)
    assert longest in proc.stdout  # one line, not wrapped at 80 columns


def test_occupancy_says_when_nothing_limits_it() -> None:
    from kstrata.backends.nvidia import occupancy

    full = occupancy(90, 31, 128, 2048)  # 16 blocks of 4 warps fill all 64 warp slots
    assert (full.warps_per_sm, full.fraction, full.limiter) == (64, 1.0, "none")
    tie = occupancy(90, 64, 256, 0)  # 64 regs x 8 warps: 4 blocks by registers, 8 by threads
    assert tie.limiter == "registers" and tie.fraction == 0.5


def test_shared_memory_header_and_resources_are_explained(tmp_path: Path) -> None:
    from kstrata.ir.target import Target
    from kstrata.testsuite.kernels import all_kernels
    from kstrata.testsuite.kernels.build import build_suite

    kernel = [k for k in all_kernels() if k.name == "vector_add"]
    for t in ("cuda:90", "hip:gfx942"):
        assert not build_suite(Target.parse(t), tmp_path, kernel).errors
    proc = kstrata("bundle", "show", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("B at launch") == 2 and "static_shared_bytes=0" in proc.stdout
    assert "1 KiB CUDA reserves per block" in proc.stdout and "all their LDS is dynamic" in proc.stdout
