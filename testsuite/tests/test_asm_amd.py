"""Assembly patches, rebuilds and reports on AMD kernels (gfx942), through `kstrata.backends.asm` and
the `kstrata asm` commands. Running the patched code needs an AMD GPU, which this project does not have."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kstrata.backends.amd import amd_instruction_mix, code_object_metadata, compare_text
from kstrata.backends.asm import AsmCheckError, asm_report, patch_bundle, rebuild
from kstrata.backends.patch import AsmPatch, Hunk, make_patch
from kstrata.ir.bundle import KernelBundle
from kstrata.ir.triton_layout import load_cache_root


@pytest.fixture(scope="module")
def hip_bundles(suite_cache: Path) -> list[KernelBundle]:
    bundles, errors = load_cache_root(suite_cache)
    assert not errors
    return [b for b in bundles if b.target.backend == "hip"]


def _bundle(bundles: list[KernelBundle], name: str) -> KernelBundle:
    return next(b for b in bundles if b.name == name)


def test_rebuild_gives_identical_text(hip_bundles: list[KernelBundle]) -> None:
    b = _bundle(hip_bundles, "softmax_online_kernel")
    hsaco, report = rebuild(b)
    assert report.same_code and report.level == "amdgcn"
    assert compare_text(b.level("hsaco"), hsaco).identical  # type: ignore[arg-type]


def test_patch_with_a_resource_change_is_accepted(hip_bundles: list[KernelBundle]) -> None:
    b = _bundle(hip_bundles, "softmax_online_kernel")
    # one more wait at the loop head: meaning unchanged (waiting is always safe), code changed
    patch = AsmPatch("amdgcn", (Hunk(".LBB0_2", ((" ", ".LBB0_2:"), ("+", "\ts_waitcnt vmcnt(0)"))),), b.name)
    patched = patch_bundle(b, patch)
    assert "ttir" not in patched.bundle.levels and patched.bundle.params == b.params
    assert patched.checks["abi"].startswith("unchanged")
    cmp = compare_text(b.level("hsaco"), patched.bundle.level("hsaco"))  # type: ignore[arg-type]
    assert not cmp.identical
    waits = [amd_instruction_mix(x.level("hsaco"), "gfx942").by_category["wait"]  # type: ignore[arg-type]
             for x in (b, patched.bundle)]
    assert waits[1] == waits[0] + 1
    assert patched.resources_after["wavefront_size"] == 64


def test_patch_that_changes_the_kernarg_layout_is_rejected(hip_bundles: list[KernelBundle]) -> None:
    b = _bundle(hip_bundles, "vector_add_kernel")
    text = b.text("amdgcn")
    size = code_object_metadata(b.level("hsaco")).kernel(b.name).kernarg_segment_size  # type: ignore[arg-type]
    grown = text.replace(f".kernarg_segment_size: {size}", f".kernarg_segment_size: {size + 8}")
    assert grown != text
    with pytest.raises(AsmCheckError, match="ABI"):
        patch_bundle(b, make_patch("amdgcn", text, grown, b.name))


def test_asm_report_for_amd(hip_bundles: list[KernelBundle]) -> None:
    report = asm_report(_bundle(hip_bundles, "matmul_kernel") if any(
        x.name == "matmul_kernel" for x in hip_bundles) else hip_bundles[0])
    assert report["instruction_mix"]["vendor"] == "amd" and report["instruction_mix"]["total"] > 0
    assert report["resources"]["vendor"] == "amd"


def test_asm_cli_on_amd(hip_bundles: list[KernelBundle], tmp_path: Path) -> None:
    b = _bundle(hip_bundles, "softmax_online_kernel")
    run = [sys.executable, "-m", "kstrata.tools.cli"]
    rebuilt = subprocess.run([*run, "asm", "rebuild", str(b.origin), "--json"], capture_output=True, text=True,
                             timeout=300, check=False)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert json.loads(rebuilt.stdout)["same_code"] is True
    patch = tmp_path / "wait.patch"
    patch.write_text("# kstrata asm patch v1\nlevel: amdgcn\n\n@@ .LBB0_2\n .LBB0_2:\n+\ts_waitcnt vmcnt(0)\n")
    patched = subprocess.run([*run, "asm", "patch", str(b.origin), str(patch), "--out", str(tmp_path / "o"), "--json"],
                             capture_output=True, text=True, timeout=300, check=False)
    assert patched.returncode == 0, patched.stderr
    entry = Path(json.loads(patched.stdout)["override_entry"])
    assert (entry / f"{b.name}.hsaco").exists() and "s_waitcnt vmcnt(0)" in (entry / f"{b.name}.amdgcn").read_text()


def test_binary_patch_on_an_hsaco(hip_bundles: list[KernelBundle]) -> None:
    from kstrata.backends.binpatch import BinaryEdit, BinaryPatch, BinaryPatchError, apply_binary_patch
    from kstrata.backends.elf import read_elf

    b = _bundle(hip_bundles, "vector_add_kernel")
    hsaco = b.level("hsaco")
    assert isinstance(hsaco, bytes)
    text = read_elf(hsaco).section(".text")
    last = text.size - 4  # the fill after s_endpgm: s_nop 0 / s_code_end words
    old = text.data[last:last + 4]
    new = (0xBF800001).to_bytes(4, "little")  # s_nop 1
    patched, report = apply_binary_patch(hsaco, BinaryPatch((BinaryEdit(".text", last, old, new, "s_nop 1"),)),
                                         "amd", "gfx942")
    assert report[0]["after"] == "s_nop 1" and patched != hsaco
    with pytest.raises(BinaryPatchError, match="multiples of 4"):
        apply_binary_patch(hsaco, BinaryPatch((BinaryEdit(".text", last - 2, text.data[last - 2:last], new[:2]),)),
                           "amd", "gfx942")
