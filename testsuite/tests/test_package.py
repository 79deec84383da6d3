"""The package: every top-level folder is a subpackage of `kstrata`, also in an installed copy."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
SUBPACKAGES = ("agents", "backends", "ir", "passes", "testsuite", "tools")


def test_pyproject_lists_every_package_folder() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    on_disk = {"kstrata"}
    for init in ROOT.rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts and rel.parts[0] in SUBPACKAGES and "tests" not in rel.parts and "plugins" not in rel.parts:
            on_disk.add("kstrata." + ".".join(rel.parts))
    assert on_disk == listed
    assert "triton==3.6.0" in config["project"]["dependencies"]


@pytest.mark.slow
def test_installed_copy_imports_outside_the_source_tree(tmp_path: Path) -> None:
    # Build from a copy: a build in the source tree leaves kstrata.egg-info there, whose (possibly stale)
    # entry points would shadow the installed ones for any process started in the tree.
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", ".venv", "out", ".whl",
                                                                "__pycache__", ".pytest_cache", ".mypy_cache"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True, timeout=600)
    code = ("import kstrata, pathlib, sys; "
            + "; ".join(f"import kstrata.{p}" for p in SUBPACKAGES)
            + "; from kstrata.testsuite.kernels import all_kernels; "
            "print(pathlib.Path(kstrata.__file__).resolve().parent); print(len(all_kernels())); "
            "from kstrata.agents.skills import SkillLibrary; "
            "print(sum(o == 'seed' for _, o in SkillLibrary(pathlib.Path('lib')).load()))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    location, count, seeds = proc.stdout.split()
    assert Path(location) == (target / "kstrata").resolve()
    assert int(count) >= 1
    assert int(seeds) == len(list((ROOT / "agents" / "skills" / "seed").glob("*.json"))) > 0  # the seeds ship too
