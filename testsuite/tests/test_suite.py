"""The kernel suite: its size and coverage, compilation for both reference targets, and correctness
under the Triton interpreter (run in a subprocess, since TRITON_INTERPRET must be set before import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kstrata.ir.triton_layout import load_cache_root
from kstrata.testsuite.kernels import all_kernels

REQUIRED_TAGS = {
    "softmax", "layernorm", "rmsnorm", "matmul", "fp16", "bf16", "tf32", "tf32x3", "ieee", "fp8", "batched",
    "attention", "conv2d", "gather", "transpose", "dropout", "atomic", "scan", "scf.for", "scf.while", "scf.if",
    "masked-tail", "int8", "epilogue-fusion", "argmax",
}


def test_suite_has_at_least_30_kernels_with_unique_names() -> None:
    kernels = all_kernels()
    names = [k.name for k in kernels]
    assert len(names) >= 30, names
    assert len(set(names)) == len(names)


def test_suite_covers_what_the_project_promises() -> None:
    tags = {t for k in all_kernels() for t in k.tags}
    assert REQUIRED_TAGS <= tags, f"no suite kernel tagged {sorted(REQUIRED_TAGS - tags)}"


def test_every_kernel_compiles_for_both_reference_targets(suite_cache: Path) -> None:
    bundles, errors = load_cache_root(suite_cache)
    assert not errors and bundles
    index = json.loads((suite_cache / "kstrata-index.json").read_text())["entries"]
    per_target: dict[str, set[str]] = {}
    for record in index.values():
        per_target.setdefault(record["target"], set()).add(record["suite_kernel"])
    expected = {k.name for k in all_kernels()}
    for target in ("cuda:90", "hip:gfx942"):
        unsupported = {k.name for k in all_kernels() if target.split(":")[0] in k.unsupported_backends}
        assert per_target.get(target, set()) == expected - unsupported, target


def test_control_flow_kernels_really_have_their_scf_ops(suite_cache: Path) -> None:
    bundles, _ = load_cache_root(suite_cache)
    index = json.loads((suite_cache / "kstrata-index.json").read_text())["entries"]
    by_name = {}
    for b in bundles:
        record = index[Path(b.origin or "").name]
        by_name[(record["suite_kernel"], record["target"])] = b
    for kernel in all_kernels():
        for op in ("scf.for", "scf.while", "scf.if"):
            if op in kernel.tags:
                ttir = by_name[(kernel.name, "cuda:90")].text("ttir")
                assert f"{op} " in ttir or f"{op}\n" in ttir, f"{kernel.name} is tagged {op} but its TTIR has none"


@pytest.mark.slow
def test_every_kernel_matches_its_reference_in_the_interpreter() -> None:
    proc = subprocess.run([sys.executable, "-m", "kstrata.testsuite.kernels.run", "--device", "cpu", "--json"],
                          capture_output=True, text=True, timeout=1200, check=False)
    assert proc.stdout, proc.stderr
    runs = json.loads(proc.stdout)["runs"]
    failed = [r for r in runs if not r["ok"]]
    assert not failed, json.dumps(failed, indent=1)
    assert len(runs) == len(all_kernels())


def test_runner_catches_a_kernel_that_skips_the_tail(tmp_path: Path) -> None:
    """The comparison must be able to fail: a kernel that never writes its last elements is rejected."""
    script = tmp_path / "broken.py"
    script.write_text(textwrap.dedent('''
        import os, json
        os.environ["TRITON_INTERPRET"] = "1"
        import torch, triton, triton.language as tl
        from kstrata.testsuite.kernels.spec import SuiteKernel
        from kstrata.testsuite.kernels.run import run_kernel

        @triton.jit
        def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < (n // BLOCK) * BLOCK  # drops the tail
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)

        k = SuiteKernel(name="broken_copy", fn=copy_kernel,
                        make_args=lambda g: {"x_ptr": torch.randn(100, generator=g), "out_ptr": torch.empty(100), "n": 100},
                        grid=lambda a: (triton.cdiv(a["n"], 32),), reference=lambda a: {"out_ptr": a["x_ptr"].clone()},
                        outputs=("out_ptr",), constexprs={"BLOCK": 32})
        r = run_kernel(k, "cpu")
        print(json.dumps({"ok": r.ok, "mismatch": r.mismatch}))
    '''))
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] is False
    assert result["mismatch"]["index"] == [96] and result["mismatch"]["mismatched"] == 4
