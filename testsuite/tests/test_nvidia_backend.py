"""NVIDIA backend: the PTX model, PTX -> cubin rebuilds, ptxas reports, occupancy, SASS statistics,
assembly patches (text and in-place binary) and the `kstrata asm` commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kstrata.backends.asm import AsmCheckError, asm_report, patch_bundle, rebuild
from kstrata.backends.binpatch import BinaryEdit, BinaryPatch, BinaryPatchError, apply_binary_patch, nvidia_listing
from kstrata.backends.elf import read_elf
from kstrata.backends.nvidia import compare_cubins, occupancy, parse_ptxas_log, rebuild_cubin
from kstrata.backends.patch import AsmPatch, AsmPatchError, Hunk, apply_patch, make_patch
from kstrata.backends.ptx import Instruction, parse_ptx, render
from kstrata.ir.bundle import KernelBundle
from kstrata.ir.target import Target
from kstrata.ir.triton_layout import load_cache_root
from kstrata.testsuite.kernels import get_kernel
from kstrata.testsuite.kernels.build import bundle_for


@pytest.fixture(scope="module")
def cuda_bundles(suite_cache: Path) -> list[KernelBundle]:
    bundles, errors = load_cache_root(suite_cache)
    assert not errors
    return [b for b in bundles if b.target.backend == "cuda"]


def _bundle(bundles: list[KernelBundle], name: str) -> KernelBundle:
    return next(b for b in bundles if b.name == name)


def test_ptx_model_prints_every_suite_kernel_back_identically(cuda_bundles: list[KernelBundle]) -> None:
    for b in cuda_bundles:
        ptx = b.text("ptx")
        module = parse_ptx(ptx, b.origin)
        assert str(module) == ptx, b.name
        entry = module.entry()
        assert entry.name == b.name and entry.reqntid == (b.num_warps * 32,)
        # every parameter of the TTIR plus Triton's two scratch pointers
        assert len(entry.params) == len(b.params) + 2
        assert module.target == "sm_90a" and module.address_size == 64
        assert module.instructions() and module.register_declarations()


def test_ptx_instruction_fields() -> None:
    line = parse_ptx("\t@!%p3 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd5 + 0 ];  // load\n").lines[0]
    assert isinstance(line, Instruction)
    assert line.predicate == "@!%p3" and line.opcode == "ld.global.v4.b32"
    assert line.operands == ("{ %r1, %r2, %r3, %r4 }", "[ %rd5 + 0 ]")
    assert line.base_opcode == "ld" and line.modifiers == ("global", "v4", "b32")
    edited = line.with_opcode("ld.global.nc.v4.b32")
    assert render(edited) == "\t@!%p3 ld.global.nc.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd5 + 0 ];  // load"


def test_truncated_ptx_is_an_error() -> None:
    from kstrata.backends.ptx import PtxError

    ptx = ".version 8.7\n.target sm_90a\n.visible .entry k(\n\t.param .u64 k_param_0\n)\n{\n\tret;\n"
    with pytest.raises(PtxError, match="not closed"):
        parse_ptx(ptx, "k.ptx")


def test_rebuild_is_byte_identical_for_the_whole_suite(cuda_bundles: list[KernelBundle]) -> None:
    # The suite was compiled in this session from unchanged sources, so ptxas sees the same .file stats.
    for b in cuda_bundles:
        build = rebuild_cubin(b)
        cmp = compare_cubins(b.level("cubin"), build.cubin)  # type: ignore[arg-type]
        assert cmp.identical, f"{b.name}: {cmp.describe()}"
        assert build.reports[b.name].registers > 0


def test_a_rebuild_leaves_tritons_settings_and_the_environment_as_they_were() -> None:
    import os

    from triton import knobs

    from kstrata.backends.rebuild import rebuild_from

    b = bundle_for(get_kernel("vector_add"), Target.parse("cuda:90"))

    def settings() -> tuple[object, ...]:
        return knobs.compilation.always_compile, knobs.cache.dir, dict(os.environ)

    before = settings()
    rebuild_from(b, "ttgir", b.text("ttgir"))
    assert settings() == before


def test_compare_cubins_tells_debug_only_differences(cuda_bundles: list[KernelBundle], tmp_path: Path) -> None:
    b = _bundle(cuda_bundles, "vector_add_kernel")
    moved = b.text("ptx").replace('.file\t1 "', '.file\t1 "/nonexistent')
    build = rebuild_cubin(b, moved)
    cmp = compare_cubins(b.level("cubin"), build.cubin)  # type: ignore[arg-type]
    assert not cmp.identical and cmp.same_code and all("debug" in s for s in cmp.differing_sections)


def test_ptxas_log_and_occupancy() -> None:
    log = ("ptxas info    : 0 bytes gmem\nptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
           "ptxas info    : Function properties for k\n    8 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 1 barriers, 576 bytes cmem[0]\n")
    r = parse_ptxas_log(log)["k"]
    assert (r.registers, r.spill_store_bytes, r.spill_load_bytes, r.stack_frame_bytes, r.barriers, r.cmem_bytes) == (
        168, 24, 16, 8, 1, 576)
    # 168 regs * 32 lanes -> 5376 per warp (a multiple of 256); 4 warps -> 21504 per block -> 3 blocks on 64K regs
    occ = occupancy(90, 168, 128, 49152)
    assert (occ.blocks_per_sm, occ.warps_per_sm, occ.limiter) == (3, 12, "registers")
    occ = occupancy(90, 32, 128, 100 * 1024)
    assert (occ.blocks_per_sm, occ.limiter) == (2, "shared")


def test_asm_report_has_wgmma_for_a_hopper_matmul(cuda_bundles: list[KernelBundle]) -> None:
    kernel = get_kernel("matmul_fp16")
    b = bundle_for(kernel, Target.parse("cuda:90"))
    report = asm_report(b)
    mix = report["instruction_mix"]
    # Hopper pipeline: operands arrive by cp.async (LDGSTS) into shared memory and feed HGMMA
    assert mix["by_category"]["wgmma"] > 0 and mix["by_category"]["async_copy"] > 0
    assert report["ptxas"]["spill_store_bytes"] == 0
    assert 0 < report["occupancy"]["fraction"] <= 1


# -- text patches ---------------------------------------------------------------------------------------
def _nc_patch(b: KernelBundle) -> AsmPatch:
    ptx = b.text("ptx")
    return make_patch("ptx", ptx, ptx.replace("ld.global.b", "ld.global.nc.b"), b.name, "read-only loads")


def test_patch_round_trips_through_text_and_json(cuda_bundles: list[KernelBundle], tmp_path: Path) -> None:
    b = _bundle(cuda_bundles, "softmax_online_kernel")
    patch = _nc_patch(b)
    assert AsmPatch.from_text(patch.to_text()) == patch
    (tmp_path / "p.json").write_text(json.dumps(patch.to_json()))
    assert AsmPatch.load(tmp_path / "p.json") == patch
    result = apply_patch(b.text("ptx"), patch)
    assert result.text == b.text("ptx").replace("ld.global.b", "ld.global.nc.b")


def test_patch_is_strict() -> None:
    text = "a:\n\tmov.u32 %r1, 0;\n\tadd.s32 %r2, %r1, 1;\nb:\n\tmov.u32 %r1, 0;\n\tadd.s32 %r2, %r1, 1;\n"
    twice = AsmPatch("ptx", (Hunk(None, ((" ", "mov.u32 %r1, 0;"), ("-", "add.s32 %r2, %r1, 1;"),
                                         ("+", "add.s32 %r2, %r1, 2;"))),))
    with pytest.raises(AsmPatchError, match="matches 2 places"):
        apply_patch(text, twice)
    anchored = AsmPatch("ptx", (Hunk("b", twice.hunks[0].lines),))
    assert apply_patch(text, anchored).text.endswith("\tadd.s32 %r2, %r1, 2;\n")
    assert apply_patch(text, anchored).text.count("%r1, 1;") == 1
    with pytest.raises(AsmPatchError, match="anchor 'c' not found"):
        apply_patch(text, AsmPatch("ptx", (Hunk("c", twice.hunks[0].lines),)))
    missing = AsmPatch("ptx", (Hunk(None, (("-", "sub.s32 %r2, %r1, 1;"),)),))
    with pytest.raises(AsmPatchError, match="not found"):
        apply_patch(text, missing)
    with pytest.raises(AsmPatchError, match=r"<patch>:3"):
        AsmPatch.from_text("# kstrata asm patch v1\nlevel: ptx\nbogus line\n")


def test_patch_bundle_rebuilds_and_checks_the_abi(cuda_bundles: list[KernelBundle]) -> None:
    b = _bundle(cuda_bundles, "softmax_online_kernel")
    patched = patch_bundle(b, _nc_patch(b))
    assert "ld.global.nc" in patched.bundle.text("ptx")
    assert patched.bundle.level("cubin") != b.level("cubin")
    assert "ttgir" not in patched.bundle.levels  # levels above the edit no longer describe the binary
    assert patched.checks["ptxas"] == "accepted" and patched.resources_after["registers"] > 0
    listing = nvidia_listing(patched.bundle.level("cubin"))[b.name]  # type: ignore[arg-type]
    assert any("CONSTANT" in t for t in listing.values())  # LDG.E.CONSTANT: the read-only path
    ptx = b.text("ptx")
    abi_change = make_patch("ptx", ptx, ptx.replace(".reqntid 128", ".reqntid 256"), b.name)
    with pytest.raises(AsmCheckError, match="reqntid"):
        patch_bundle(b, abi_change)


def test_broken_patch_reports_ptxas_error_with_repro(cuda_bundles: list[KernelBundle]) -> None:
    from kstrata.backends.tools import ToolFailed

    b = _bundle(cuda_bundles, "vector_add_kernel")
    ptx = b.text("ptx")
    broken = make_patch("ptx", ptx, ptx.replace("ld.global.b32", "ld.global.bogus32", 1), b.name)
    with pytest.raises(ToolFailed) as info:
        patch_bundle(b, broken)
    assert "repro:" in str(info.value) and "ptxas" in str(info.value)


def test_rebuild_through_asm_module(cuda_bundles: list[KernelBundle]) -> None:
    b = _bundle(cuda_bundles, "row_argmax_kernel")
    binary, report = rebuild(b)
    assert report.identical and binary == b.level("cubin")


# -- in-place binary patches ------------------------------------------------------------------------------
def test_binary_patch_replaces_one_instruction_and_checks(cuda_bundles: list[KernelBundle]) -> None:
    b = _bundle(cuda_bundles, "vector_add_kernel")
    cubin = b.level("cubin")
    assert isinstance(cubin, bytes)
    section = f".text.{b.name}"
    listing = nvidia_listing(cubin)[b.name]
    data = read_elf(cubin).section(section).data
    nop = next(o for o, t in listing.items() if t == "NOP")
    bra = max(o for o, t in listing.items() if t.startswith("BRA"))  # the unreachable self-loop after EXIT
    patch = BinaryPatch((BinaryEdit(section, bra, data[bra:bra + 16], data[nop:nop + 16], "NOP"),), b.name)
    assert BinaryPatch.from_json(patch.to_json()) == patch
    patched, report = apply_binary_patch(cubin, patch, "nvidia", "90")
    assert report[0]["before"].startswith("BRA") and report[0]["after"] == "NOP"
    assert sum(x != y for x, y in zip(cubin, patched, strict=True)) <= 16
    wrong_anchor = BinaryPatch((BinaryEdit(section, bra, data[nop:nop + 16], data[nop:nop + 16]),))
    with pytest.raises(BinaryPatchError, match="anchor bytes differ"):
        apply_binary_patch(cubin, wrong_anchor, "nvidia", "90")
    misaligned = BinaryPatch((BinaryEdit(section, bra + 8, data[bra + 8:bra + 16], data[nop:nop + 8]),))
    with pytest.raises(BinaryPatchError, match="multiples of 16"):
        apply_binary_patch(cubin, misaligned, "nvidia", "90")
    expect_wrong = BinaryPatch((BinaryEdit(section, bra, data[bra:bra + 16], data[nop:nop + 16], "LDG"),))
    with pytest.raises(BinaryPatchError, match="does not contain 'LDG'"):
        apply_binary_patch(cubin, expect_wrong, "nvidia", "90")


# -- CLI ----------------------------------------------------------------------------------------------------
def _kstrata(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kstrata.tools.cli", *args], capture_output=True, text=True,
                          timeout=600, check=False)


def test_asm_cli(cuda_bundles: list[KernelBundle], tmp_path: Path) -> None:
    b = _bundle(cuda_bundles, "softmax_online_kernel")
    entry = str(b.origin)
    report = _kstrata("asm", "report", entry, "--json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["instruction_mix"]["total"] > 0
    rebuilt = _kstrata("asm", "rebuild", entry, "--json", "--out", str(tmp_path / "rb"))
    assert rebuilt.returncode == 0 and json.loads(rebuilt.stdout)["identical"] is True
    patch_file = tmp_path / "nc.patch"
    patch_file.write_text(_nc_patch(b).to_text())
    patched = _kstrata("asm", "patch", entry, str(patch_file), "--out", str(tmp_path / "ovr"), "--json")
    assert patched.returncode == 0, patched.stderr
    written = Path(json.loads(patched.stdout)["override_entry"])
    assert written.parent == tmp_path / "ovr" and written.name == b.override_key
    assert "ld.global.nc" in (written / f"{b.name}.ptx").read_text()
    assert (written / f"{b.name}.cubin").read_bytes()[:4] == b"\x7fELF"
    bad = tmp_path / "bad.patch"
    bad.write_text("# kstrata asm patch v1\nlevel: ptx\n\n@@\n-\tno.such.instruction;\n")
    failed = _kstrata("asm", "patch", entry, str(bad), "--out", str(tmp_path / "ovr2"))
    assert failed.returncode == 2 and "hunk 1" in failed.stderr and "Traceback" not in failed.stderr


def test_ptx_is_assembled_by_the_ptxas_triton_was_pointed_at(cuda_bundles: list[KernelBundle], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor points Triton at torch's ptxas (TRITON_PTXAS_PATH), and Triton then writes PTX of that ptxas's
    ISA version; the bundled ptxas refused it (`Unsupported .version 9.0; current version is '8.7'`, an H200
    run), which failed every rebuilt candidate of an Inductor kernel as "not accepted at ptx"."""
    from triton import knobs

    from kstrata.backends.nvidia import find_nvidia_tool

    monkeypatch.delenv("KSTRATA_PTXAS", raising=False)
    bundled = find_nvidia_tool("ptxas").path
    log = tmp_path / "ptxas-calls"
    wrapper = tmp_path / "ptxas"
    wrapper.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\nexec {knobs.nvidia.ptxas.path} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(wrapper))
    assert find_nvidia_tool("ptxas").path == wrapper and find_nvidia_tool("cuobjdump").path != wrapper
    rebuild_cubin(cuda_bundles[0])
    assert log.exists() and "sm_90" in log.read_text()
    monkeypatch.delenv("TRITON_PTXAS_PATH")
    assert find_nvidia_tool("ptxas").path == bundled
