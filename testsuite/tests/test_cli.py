"""The `kstrata` command line: JSON output, exit codes, and one-line errors that name the file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kstrata import __version__
from kstrata.testsuite.kernels import all_kernels


def kstrata(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kstrata.tools.cli", *args], capture_output=True, text=True,
                          timeout=600, check=False)


def test_version() -> None:
    proc = kstrata("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"kstrata {__version__}"


def test_suite_list_json() -> None:
    proc = kstrata("suite", "list", "--json")
    assert proc.returncode == 0
    names = [k["name"] for k in json.loads(proc.stdout)["kernels"]]
    assert names == [k.name for k in all_kernels()]


def test_suite_build_json_and_bundle_show(tmp_path: Path) -> None:
    proc = kstrata("suite", "build", "--target", "cuda:90", "--target", "hip:gfx942", "--cache-dir", str(tmp_path),
                   "--only", "vector_add", "--only", "softmax_online", "--json")
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    assert [t["target"] for t in payload["targets"]] == ["cuda:90", "hip:gfx942"]
    assert all(t["built"] == 2 and not t["failed"] for t in payload["targets"])
    amd = payload["targets"][1]["kernels"][0]
    assert amd["levels"][-2:] == ["amdgcn", "hsaco"] and amd["resources"]["vendor"] == "amd"

    shown = kstrata("bundle", "show", str(tmp_path), "--json")
    assert shown.returncode == 0, shown.stderr
    bundles = json.loads(shown.stdout)["bundles"]
    assert len(bundles) == 4
    assert {b["target"] for b in bundles} == {"cuda:90", "hip:gfx942"}
    assert all(b["resources"]["registers"] > 0 for b in bundles)

    entry = Path(bundles[0]["origin"])
    ttgir = kstrata("bundle", "show", str(entry), "--level", "ttgir")
    assert ttgir.returncode == 0 and "ttg.num-warps" in ttgir.stdout
    binary = "cubin" if bundles[0]["target"].startswith("cuda") else "hsaco"
    disasm = kstrata("bundle", "show", str(entry), "--level", binary)
    assert disasm.returncode == 0, disasm.stderr
    assert ("Function" in disasm.stdout) or ("Disassembly" in disasm.stdout)


def test_errors_name_the_file_without_a_traceback(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    proc = kstrata("bundle", "show", str(missing))
    assert proc.returncode == 2
    assert str(missing) in proc.stderr and "Traceback" not in proc.stderr

    proc = kstrata("suite", "build", "--target", "cuda:91", "--cache-dir", str(tmp_path))
    assert proc.returncode == 2 and "cuda:91" in proc.stderr and "Traceback" not in proc.stderr

    proc = kstrata("suite", "build", "--target", "cuda:90", "--cache-dir", str(tmp_path), "--only", "no_such")
    assert proc.returncode == 2 and "no_such" in proc.stderr


def test_doctor_json() -> None:
    proc = kstrata("doctor", "--json")
    report = json.loads(proc.stdout)
    names = {c["name"] for c in report["components"]}
    assert {"triton", "torch", "ptxas", "llvm-mc"} <= names
    assert proc.returncode == (0 if report["ok"] else 1)
    caps = {c["name"]: c for c in report["capabilities"]}
    assert caps["compile for NVIDIA targets (CPU)"]["ok"]
