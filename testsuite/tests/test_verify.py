"""`kstrata verify`: static checks on the levels that differ, and (on a GPU) the differential run of the
original and candidate binaries on replays of a recorded launch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kstrata.backends.verify import Check, Verdict, VerifyReport, load_candidate, verify_static
from kstrata.ir.candidate import CANDIDATE_FILE, CandidateInfo
from kstrata.ir.target import Target
from kstrata.passes.pipeline import parse_pipeline, run_pipeline
from kstrata.testsuite.kernels import get_kernel
from kstrata.testsuite.kernels.build import build_suite

from .conftest import has_cuda


@pytest.fixture(scope="module")
def entry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verify-cache")
    result = build_suite(Target.parse("cuda:90"), root, [get_kernel("softmax_online")])
    origin = result.bundles["softmax_online"].origin
    assert origin is not None
    return Path(origin)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "verify", *args], capture_output=True, text=True,
                          timeout=600, check=False)


def test_a_pass_result_verifies(entry: Path, tmp_path: Path) -> None:
    from kstrata.ir.triton_layout import load_any, write_override

    original = load_any(entry)[0][0]
    new = run_pipeline(original, parse_pipeline("llir(noalias-args{assume=true}),ptx(cache-hints)")).bundle
    override = write_override(new, tmp_path, levels=["llir", "ptx", "cubin"])
    candidate = load_candidate(override, original)
    report = verify_static(original, candidate)
    # static checks alone are no evidence: nothing fails, and the verdict is unproven
    assert report.verdict is Verdict.UNPROVEN and report.differing_levels == ["llir", "ptx", "cubin"]
    # the pipeline edits two levels: its description says so, and the ptx is kept (not rebuilt from the llir)
    info = CandidateInfo("softmax_online_kernel", "llir(noalias-args{assume=true}),ptx(cache-hints)", None, None, {})
    (override / CANDIDATE_FILE).write_text(json.dumps(info.to_json()))
    proc = _cli(str(entry), str(override), "--json", "--static-only")
    assert proc.returncode == 0, proc.stderr
    report_json = json.loads(proc.stdout)
    assert report_json["verdict"] == "unproven" and report_json["accepted"] and report_json["rebuilt_levels"] == ["cubin"]
    assert {c["name"] for c in report_json["checks"]} >= {"signature", "accepted", "abi", "resources", "lower levels"}
    lower = next(c for c in report_json["checks"] if c["name"] == "lower levels")
    assert "rebuilt from the candidate's ptx" in lower["detail"] and "stale" not in lower["detail"]
    # without --static-only, and no GPU: the suite kernel's own launch is found, the GPU run cannot happen
    if not has_cuda():
        proc = _cli(str(entry), str(override), "--json")
        assert proc.returncode == 3, proc.stdout + proc.stderr
        report_json = json.loads(proc.stdout)
        assert report_json["verdict"] == "unproven"
        if _suite_registered():  # the CLI finds the suite through its entry point (an up-to-date install)
            assert "suite kernel softmax_online" in report_json["launch_source"]


def test_changed_launch_bounds_are_rejected(entry: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(entry, bad)
    ptx = next(bad.glob("*.ptx"))
    ptx.write_text(ptx.read_text().replace(".reqntid 128", ".reqntid 256"))
    proc = _cli(str(entry), str(bad), "--json")
    assert proc.returncode == 1
    failed = [c for c in json.loads(proc.stdout)["checks"] if c["verdict"] == "fail"]
    assert [c["name"] for c in failed] == ["abi"] and "reqntid (128,) -> (256,)" in failed[0]["detail"]


def test_ptx_that_does_not_assemble_is_rejected(entry: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(entry, bad)
    ptx = next(bad.glob("*.ptx"))
    ptx.write_text(ptx.read_text().replace("ld.global.b16", "ld.global.bogus16", 1))
    proc = _cli(str(entry), str(bad), "--json")
    assert proc.returncode == 1
    checks = {(c["name"], c["level"]): c for c in json.loads(proc.stdout)["checks"]}
    assert checks[("accepted", "ptx")]["verdict"] == "fail" and "ptxas" in checks[("accepted", "ptx")]["detail"]


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
def test_gpu_differential_on_a_recorded_launch(entry: Path, tmp_path: Path) -> None:
    # record a real launch of the kernel, then verify a sound rewrite (passes) and a wrong one (fails)
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import torch
        from kstrata.testsuite.kernels import get_kernel
        from kstrata.testsuite.kernels.run import launch
        k = get_kernel("softmax_online")
        args = {n: (v.cuda() if isinstance(v, torch.Tensor) else v) for n, v in k.make_args(torch.Generator().manual_seed(0)).items()}
        launch(k, args)
        torch.cuda.synchronize()
    """))
    records = tmp_path / "records"
    subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "record", "--out", str(records), "--", sys.executable,
                    str(script)], check=True, capture_output=True, timeout=600, env=dict(os.environ))
    record = next(records.glob("softmax_online_kernel-*.json"))
    from kstrata.ir.triton_layout import load_any, write_override

    original = load_any(entry)[0][0]
    good = write_override(run_pipeline(original, parse_pipeline("ptx(cache-hints)")).bundle, tmp_path / "good",
                          levels=["ptx", "cubin"])
    proc = _cli(str(entry), str(good), "--launch", str(record), "--seeds", "2", "--sanitizer", "memcheck", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dynamic = {c["name"]: c["verdict"] for c in json.loads(proc.stdout)["checks"]
               if c["level"] == "cubin" and c["name"] != "resources"}
    assert dynamic == {"differential: random seed 0": "pass", "differential: random seed 1": "pass",
                       "differential: edge floats (NaN, ±Inf, ±0, denormals, extremes)": "pass",
                       "determinism": "pass", "compute-sanitizer memcheck": "pass"}, dynamic
    wrong_ptx = original.text("ptx").replace("max.f32", "min.f32")
    assert wrong_ptx != original.text("ptx")
    from kstrata.backends.rebuild import rebuild_from

    wrong = write_override(rebuild_from(original, "ptx", wrong_ptx), tmp_path / "wrong", levels=["ptx", "cubin"])
    proc = _cli(str(entry), str(wrong), "--launch", str(record), "--json")
    assert proc.returncode == 1
    first = next(c for c in json.loads(proc.stdout)["checks"] if c["verdict"] == "fail")
    assert "first difference" in first["detail"]


def test_run_passes_candidates_carry_their_metadata_and_tolerance(entry: Path, tmp_path: Path) -> None:
    # num-warps changes the block size on purpose and declares a tolerance: run-passes writes both into
    # the override entry's kstrata-candidate.json, and verify uses them (launch bounds must match it)
    from kstrata.agents.run_passes import run_passes
    from kstrata.ir.candidate import CandidateInfo

    out = tmp_path / "out"
    report = run_passes(entry.parent, "ttgir(num-warps{n=8})", out, kernel_filter="softmax_online")
    override = Path(next(k["override_entry"] for k in report.kernels if k["status"] == "changed"))
    info = CandidateInfo.read(override)
    assert info is not None and info.metadata == {"num_warps": 8} and info.tolerance == "ulp=4,rtol=1e-05,atol=1e-06"
    proc = _cli(str(entry), str(override), "--json", "--static-only")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert "4 -> 8 warps" in checks["abi"]["detail"] and "ulp=4" in checks["tolerance"]["detail"]


@pytest.mark.skipif(has_cuda(), reason="checks the answer on a machine without an NVIDIA GPU")
def test_device_cuda_needs_a_gpu_only_for_nvidia_kernels() -> None:
    from kstrata.backends.verify import verify
    from kstrata.ir.errors import KstrataError
    from kstrata.testsuite.kernels.build import bundle_for
    from kstrata.testsuite.kernels.launch import suite_launch_record

    kernel = get_kernel("vector_add")
    hip = bundle_for(kernel, Target.parse("hip:gfx942"))
    edited = hip.text("amdgcn").replace("\ts_endpgm", "\ts_nop 0\n\ts_endpgm", 1)
    from kstrata.backends.rebuild import rebuild_from

    candidate = rebuild_from(hip, "amdgcn", edited)
    # an AMD kernel under --device cuda: the static checks run, and the verdict says what needs an AMD GPU
    report = verify(hip, candidate, suite_launch_record(kernel, "hip:gfx942"), device="cuda")
    assert report.verdict is Verdict.UNPROVEN and any(c.name == "differential" and "AMD GPU" in c.detail
                                                      for c in report.checks)
    cuda = bundle_for(kernel, Target.parse("cuda:90"))
    with pytest.raises(KstrataError, match="no NVIDIA GPU"):
        verify(cuda, cuda, suite_launch_record(kernel, "cuda:90"), device="cuda")


@pytest.mark.slow
def test_cli_verifies_a_ttir_rewrite_with_the_interpreter(entry: Path, tmp_path: Path) -> None:
    from kstrata.backends.rebuild import rebuild_from
    from kstrata.ir.triton_layout import load_any, write_override
    from kstrata.testsuite.kernels.launch import suite_launch_record

    original = load_any(entry)[0][0]
    record = suite_launch_record(get_kernel("softmax_online"), "cuda:90", snapshot_dir=tmp_path / "launch")
    launch = record.save(tmp_path / "launch" / "softmax_online-1.json")
    good = write_override(run_pipeline(original, parse_pipeline("ttir(load-eviction)")).bundle, tmp_path / "good")
    proc = _cli(str(entry), str(good), "--launch", str(launch), "--seeds", "1", "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    interpreted = [c for c in json.loads(proc.stdout)["checks"] if c["name"].startswith("interpreter")]
    assert {c["level"] for c in interpreted} == {"ttir", "ttgir"} and all(c["verdict"] == "pass" for c in interpreted)
    # the online max turned into a min: the interpreter rejects it at TTIR, naming the first difference
    wrong_ttir = original.text("ttir").replace("arith.maxnumf", "arith.minnumf")
    assert wrong_ttir != original.text("ttir")
    wrong = write_override(rebuild_from(original, "ttir", wrong_ttir), tmp_path / "wrong")
    proc = _cli(str(entry), str(wrong), "--launch", str(launch), "--seeds", "1", "--device", "cpu")
    assert proc.returncode == 1
    assert "fail" in proc.stdout and "interpreter" in proc.stdout and "first difference" in proc.stdout
    assert "verdict: different" in proc.stdout


@pytest.mark.slow
def test_cli_takes_ir_files(entry: Path, tmp_path: Path) -> None:
    # ORIGINAL as the entry's .ttgir (compiled with the metadata beside it), CANDIDATE as one edited file
    from kstrata.testsuite.kernels.launch import suite_launch_record

    ttgir = next(entry.glob("*.ttgir"))
    record = suite_launch_record(get_kernel("softmax_online"), "cuda:90")
    launch = record.save(tmp_path / "softmax_online-1.json")
    wrong = tmp_path / ttgir.name
    wrong.write_text(ttgir.read_text().replace("arith.maxnumf", "arith.minnumf"))
    proc = _cli(str(ttgir), str(wrong), "--launch", str(launch), "--seeds", "1", "--device", "cpu", "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert "ttgir" in report["differing_levels"] and "ttir" not in report["differing_levels"]
    assert any(c["name"].startswith("interpreter") and c["verdict"] == "fail" for c in report["checks"])
    ptx = tmp_path / "hinted.ptx"
    from kstrata.ir.triton_layout import load_any

    ptx.write_text(run_pipeline(load_any(entry)[0][0], parse_pipeline("ptx(cache-hints)")).bundle.text("ptx"))
    proc = _cli(str(entry), str(ptx), "--json", "--static-only")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["differing_levels"] == ["ptx", "cubin"]
    proc = _cli(str(entry), str(tmp_path / "nothing.ptx"))
    assert proc.returncode == 2 and "nothing.ptx" in proc.stderr


# ---------------------------------------------------------------------------------------------------
# Verdicts mean evidence (issue 20): equivalent / different / unproven, skipped is never a pass
# ---------------------------------------------------------------------------------------------------
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _row_scale_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):  # not a suite kernel: kstrata knows no launch
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask)
    tl.store(out_ptr + row * n_cols + cols, x * 2.0, mask=mask)


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kstrata.ir.triton_layout import compile_jit

    root = tmp_path_factory.mktemp("foreign-cache")
    bundle = compile_jit(_row_scale_kernel, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_cols": "i32",
                                             "BLOCK": "constexpr"}, "cuda:90", {"BLOCK": 128}, cache_dir=root)
    assert bundle.origin is not None
    return Path(bundle.origin)


def test_report_verdicts_need_evidence() -> None:
    def report(*checks: Check, levels: tuple[str, ...] = ("ttir",)) -> VerifyReport:
        return VerifyReport("k", "cuda:90", list(levels), list(checks))

    static = Check("accepted", "ttir", "pass")
    interp = Check("interpreter: random seed 0", "ttir", "pass")
    assert report(static, levels=()).verdict is Verdict.EQUIVALENT  # identical code
    assert report(static).verdict is Verdict.UNPROVEN
    assert report(static, interp).verdict is Verdict.EQUIVALENT
    assert report(static, interp, Check("interpreter: edge integers", "ttir", "n/a")).verdict is Verdict.EQUIVALENT
    # a check that could not run is not a pass: a skipped input set, or a static check this machine lacks
    assert report(static, interp, Check("interpreter: random seed 1", "ttir", "skipped", "timeout")).verdict \
        is Verdict.UNPROVEN
    unrun = report(Check("accepted", "ptx", "skipped", "cannot run here: ptxas"), interp)
    assert unrun.verdict is Verdict.UNPROVEN and "ptxas" in unrun.unproven_reasons()[0]
    assert report(static, interp, Check("abi", "ptx", "fail")).verdict is Verdict.DIFFERENT
    assert (Verdict.EQUIVALENT.exit_code, Verdict.DIFFERENT.exit_code, Verdict.UNPROVEN.exit_code) == (0, 1, 3)
    accepted = report(static)
    accepted.static_only = True
    assert accepted.accepted and accepted.exit_code == 0 and accepted.to_json()["verdict"] == "unproven"


@pytest.mark.slow
def test_ttir_mask_off_by_one_without_a_launch_is_unproven(foreign: Path, tmp_path: Path) -> None:
    # issue 20's CPU "done when": every static check passes, no launch is known -> unproven, exit 3;
    # the target comes from Triton's metadata JSON beside the .ttir (no --target)
    original = tmp_path / "orig" / "_row_scale_kernel.ttir"
    original.parent.mkdir()
    shutil.copy(foreign / "_row_scale_kernel.ttir", original)
    shutil.copy(foreign / "_row_scale_kernel.json", original.with_suffix(".json"))
    text = original.read_text()
    assert text.count("arith.cmpi slt") == 1 and "ttg.target" not in text
    wrong = tmp_path / "_row_scale_kernel.ttir"
    wrong.write_text(text.replace("arith.cmpi slt", "arith.cmpi sle"))
    proc = _cli(str(original), str(wrong), "--json", "--no-symbolic")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["verdict"] == "unproven" and report["target"] == "cuda:90" and not report["evidence"]
    assert all(c["verdict"] == "pass" for c in report["checks"] if c["name"] != "dynamic")
    assert "no dynamic evidence" in report["unproven_reasons"][0]
    # issue 18: by default (no launch record) the symbolic checker decides it, with a counterexample the
    # interpreter confirms
    proc = _cli(str(original), str(wrong), "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["verdict"] == "different"
    assert {c["name"] for c in report["checks"] if c["verdict"] == "fail"} == {"symbolic"}
    proc = _cli(str(original), str(wrong), "--static-only")
    assert proc.returncode == 0 and "verdict: unproven (static evidence accepted" in proc.stdout
    # --timeout 0 cannot skip its way to a verdict: it is refused
    proc = _cli(str(original), str(wrong), "--timeout", "0")
    assert proc.returncode == 2 and "positive" in proc.stderr
    # the same file twice: identical code, no "levels that differ"
    for same in (original, foreign / "_row_scale_kernel.ttgir"):
        proc = _cli(str(same), str(same))
        assert proc.returncode == 0 and "levels that differ: none" in proc.stdout, proc.stdout + proc.stderr
        assert "verdict: equivalent" in proc.stdout


def _suite_registered() -> bool:
    import importlib.metadata

    return bool(importlib.metadata.entry_points(group="kstrata.suites"))


def test_a_suite_kernel_gets_its_own_launch(entry: Path, tmp_path: Path) -> None:
    # no launch given: kstrata knows the suite kernel's launch (the suite registers it when it is
    # loaded), so the interpreter runs and rejects the mask bug
    import kstrata.testsuite.kernels.launch  # noqa: F401
    from kstrata.backends.verify import known_launch, verify
    from kstrata.ir.triton_layout import load_any

    original = load_any(entry)[0][0]
    found = known_launch(original)
    assert found is not None and "suite kernel softmax_online" in found[1]
    ttgir = original.text("ttgir")
    wrong = ttgir.replace("arith.cmpi slt, %mask_8, %mask", "arith.cmpi sle, %mask_8, %mask")
    assert wrong != ttgir
    import dataclasses

    candidate = dataclasses.replace(original, levels={**original.levels, "ttgir": wrong})
    report = verify(original, candidate, seeds=1, device="cpu")
    assert report.verdict is Verdict.DIFFERENT and report.launch_source == found[1]
    assert any(c.name.startswith("interpreter") and c.verdict == "fail" for c in report.checks)


@pytest.mark.parametrize("corruption", [("tt.load", "tt.lood"), ("tt.addptr %x_ptr, %x_row_3", "tt.addptr %x_ptr, %nowhere")],
                         ids=["unknown-op", "undefined-ssa"])
def test_a_corrupt_original_is_an_error(entry: Path, tmp_path: Path, corruption: tuple[str, str]) -> None:
    bad = tmp_path / "bad-original"
    shutil.copytree(entry, bad)
    ttir = next(bad.glob("*.ttir"))
    text = ttir.read_text()
    assert corruption[0] in text
    ttir.write_text(text.replace(corruption[0], corruption[1], 1))
    proc = _cli(str(bad), str(entry), "--seeds", "1", "--device", "cpu")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "original's ttir is not valid" in proc.stderr and "Traceback" not in proc.stderr


def test_ptx_abi_is_compared_on_the_parsed_parameter_list(entry: Path, tmp_path: Path) -> None:
    ptx = next(entry.glob("*.ptx")).read_text()
    last = "softmax_online_kernel_param_4\n)"
    assert last in ptx
    for i, extra in enumerate(("\n,\t.param .u64 extra\n)", ",\n\t.param .u64 extra\n)")):
        cand = tmp_path / f"{i}" / "softmax_online_kernel.ptx"
        cand.parent.mkdir()
        cand.write_text(ptx.replace(last, "softmax_online_kernel_param_4" + extra))
        proc = _cli(str(entry), str(cand), "--json", "--static-only")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        abi = next(c for c in json.loads(proc.stdout)["checks"] if c["name"] == "abi")
        assert abi["verdict"] == "fail" and "extra" in abi["detail"]


@pytest.mark.parametrize("damage", ["corrupt-metadata", "missing-metadata", "corrupt-group", "empty-llir"])
def test_damaged_candidate_entries_are_refused(entry: Path, tmp_path: Path, damage: str) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(entry, bad)
    meta, group = bad / "softmax_online_kernel.json", next(bad.glob("__grp__*.json"))
    if damage == "corrupt-metadata":
        meta.write_text(meta.read_text()[:40])
    elif damage == "missing-metadata":
        meta.unlink()
    elif damage == "corrupt-group":
        group.write_text("{not json")
    else:
        (bad / "softmax_online_kernel.llir").write_text("")
    proc = _cli(str(entry), str(bad), "--static-only")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "bad" in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_an_empty_or_crashing_llir_file_is_a_clear_error(entry: Path, tmp_path: Path) -> None:
    empty = tmp_path / "softmax_online_kernel.llir"
    empty.write_text("")
    proc = _cli(str(entry), str(empty))
    assert proc.returncode == 2 and "empty" in proc.stderr
    # Triton's LLVM aborts on IR it cannot parse: that happens in a child process, kstrata says so in one line
    empty.write_text("define void @softmax_online_kernel(ptr %0 {\n  garbage\n")
    proc = _cli(str(entry), str(empty))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "LLVM" in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_stale_cubin_is_rebuilt_from_the_edited_ptx(entry: Path, tmp_path: Path) -> None:
    # the first hole: PTX edited in an entry whose cubin is still Triton's
    stale = tmp_path / "stale"
    shutil.copytree(entry, stale)
    ptx = next(stale.glob("*.ptx"))
    text = ptx.read_text()
    assert "\tsub.f32" in text
    ptx.write_text(text.replace("\tsub.f32", "\tadd.f32", 1))
    proc = _cli(str(entry), str(stale), "--json", "--device", "cpu")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["rebuilt_levels"] == ["cubin"] and report["differing_levels"] == ["ptx", "cubin"]
    lower = next(c for c in report["checks"] if c["name"] == "lower levels")
    assert "stale" in lower["detail"] and "cubin" in lower["detail"]
    from kstrata.backends.verify import derive_lower_levels
    from kstrata.ir.triton_layout import load_any

    original = load_any(entry)[0][0]
    candidate = load_candidate(stale, original)
    assert candidate.levels["cubin"] == original.levels["cubin"]  # what the entry holds
    derived, how = derive_lower_levels(original, candidate)
    assert derived.levels["cubin"] != original.levels["cubin"] and how.stale == ["cubin"] and how.top == "ptx"


def test_unknown_shared_memory_is_not_a_pass(entry: Path) -> None:
    import dataclasses

    from kstrata.ir.triton_layout import load_any

    original = load_any(entry)[0][0]
    metadata = {k: v for k, v in original.metadata.items() if k != "shared"}
    ptx = original.text("ptx").replace("\tsub.f32", "\tadd.f32", 1)
    candidate = dataclasses.replace(original, metadata=metadata, levels={**original.levels, "ptx": ptx})
    report = verify_static(original, candidate)
    resources = next(c for c in report.checks if c.name == "resources")
    assert resources.verdict == "fail" and "shared memory size" in resources.detail


def test_symbolic_evidence_plugs_into_the_unproven_path(foreign: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from kstrata.backends import verify as verify_mod
    from kstrata.ir.triton_layout import load_any

    original = load_any(foreign)[0][0]
    # Another constant, so that the binary changes (a renaming, or x + x for x * 2.0, rebuilds to the
    # identical binary, which is evidence of its own); the stand-in checker below "proves" it: this test is
    # about how a symbolic verdict enters the report, not about the checker.
    ttir = original.text("ttir")
    assert ttir.count("dense<2.000000e+00>") == 1
    candidate = dataclasses_replace_ttir(original, ttir.replace("dense<2.000000e+00>", "dense<3.000000e+00>"))

    def checker(orig: object, cand: object, level: str, launch: object, timeout: float) -> Check:
        return verify_mod.symbolic_check(SimpleNamespace(status="proved", reason="z3: unsat"), level)

    # only the stand-in: the real checker (registered once kstrata.ir.symbolic is imported, as other tests of
    # this process may have done) would rightly call the changed constant a difference
    monkeypatch.setattr(verify_mod, "_SYMBOLIC_CHECKERS", [])
    verify_mod.register_symbolic_checker(checker)
    report = verify_mod.verify(original, candidate, device="cpu", symbolic=True)
    assert report.verdict is Verdict.EQUIVALENT and report.evidence() == ["symbolic"], report.checks
    assert verify_mod.verify(original, candidate, device="cpu").verdict is Verdict.UNPROVEN


def dataclasses_replace_ttir(bundle, ttir):  # type: ignore[no-untyped-def]
    import dataclasses

    assert ttir != bundle.text("ttir")
    return dataclasses.replace(bundle, levels={**bundle.levels, "ttir": ttir})


def test_redzones_catch_writes_outside_a_buffer() -> None:
    import torch

    from kstrata.backends.replay import (
        REDZONE_BYTES,
        clone_args,
        compare_outputs,
        describe_violation,
        redzone_violations,
        replay_args,
    )
    from kstrata.ir.launch import LaunchRecord, ScalarArg, TensorArg

    record = LaunchRecord("k", "cuda:90", (4, 1, 1), (TensorArg("x", "float32", (4, 100), (100, 1), 0, 400),
                                                      TensorArg("out", "float32", (4, 100), (100, 1), 0, 400,
                                                                written=True),
                                                      ScalarArg("n", "i32", 100)))
    args = replay_args(record, "cpu", 0, redzone=True)
    out = args["out"]
    assert out.storage_offset() == REDZONE_BYTES // 4 and out.untyped_storage().nbytes() == 2 * REDZONE_BYTES + 1600
    assert redzone_violations(args, record, "clean") == []
    other = clone_args(args)
    flat = torch.empty(0, dtype=out.dtype).set_(out.untyped_storage())
    flat[out.storage_offset() + 400] = 1.0  # one past the end: the last row's program writes column 100
    found = redzone_violations(args, record, "candidate, random seed 0")
    assert found == [{"buffer": "out", "buffer_bytes": 1600, "first_offset": 1600, "last_offset": 1603,
                      "bytes_changed": 4, "launch": "candidate, random seed 0"}]
    assert "past its end" in describe_violation(found[0]) and "candidate, random seed 0" in describe_violation(found[0])
    flat[out.storage_offset() - 1] = 1.0
    assert redzone_violations(args, record, "l")[0]["first_offset"] == -4
    # the comparison looks at the buffers only (the guards are the redzone check's)
    assert compare_outputs(args, other, ["out"], redzone=True) is None
    out[3, 99] = 5.0
    assert compare_outputs(args, other, ["out"], redzone=True)["element"] == 399


def test_an_llir_change_that_leaves_the_binary_identical_is_equivalent(entry: Path, tmp_path: Path) -> None:
    """The rebuilt cubin is byte-identical to the original's: the GPU runs the same code, which is evidence
    without a launch (noalias changes no instruction here: Triton's loads are inline asm). An edit that
    changes an instruction still needs dynamic evidence. The rebuild from LLVM IR runs in this process,
    where no Triton compile set NVPTX's short shared pointers first (they used to be missed)."""
    from kstrata.backends.verify import verify
    from kstrata.ir.triton_layout import load_any

    original = load_any(entry)[0][0]
    noalias = run_pipeline(original, parse_pipeline("llir(noalias-args{assume=true})")).bundle.text("llir")
    assert " fmul " in noalias
    for name, llir, same_binary in (("noalias", noalias, True),
                                    ("fmul-to-fadd", noalias.replace(" fmul ", " fadd ", 1), False)):
        single = tmp_path / name / f"{original.name}.llir"  # only the LLVM IR: verify rebuilds below it
        single.parent.mkdir()
        single.write_text(llir)
        report = verify(original, load_candidate(single, original), device="cpu", find_launch=False)
        same = [c for c in report.checks if c.name == "identical binary"]
        assert "llir" in report.differing_levels and "cubin" in report.rebuilt_levels, report.to_json()
        if same_binary:
            assert report.differing_levels == ["llir"] and same and same[0].verdict == "pass"
            assert report.verdict is Verdict.EQUIVALENT, report.to_json()
        else:
            assert "cubin" in report.differing_levels and not same and report.verdict is Verdict.UNPROVEN


def test_a_check_that_cannot_import_its_module_is_skipped_not_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    """An incomplete install (xdsl missing) must not count as catching a candidate."""
    from kstrata.backends import verify as verify_mod

    report = VerifyReport("k", "cuda:90", ["ttir"], [])

    def missing() -> str:
        raise ModuleNotFoundError("No module named 'xdsl'")

    verify_mod._add(report, "accepted", "ttir", missing)
    assert report.checks[0].verdict == "skipped" and "xdsl" in report.checks[0].detail
    assert report.verdict is Verdict.UNPROVEN


@pytest.mark.slow
def test_verify_goes_through_the_engine_cache(entry: Path, tmp_path: Path) -> None:
    """`kstrata verify` is the engine's check of the candidate against its base: the same candidate content,
    options and launch get the kept verdict (same JSON, same exit code); other options, `--no-cache`, or a
    unproven verdict where a check could not run are decided again."""
    from kstrata.ir.triton_layout import load_any, write_override

    original = load_any(entry)[0][0]
    new = run_pipeline(original, parse_pipeline("ptx(cache-hints)")).bundle
    override = write_override(new, tmp_path / "o", levels=["ptx", "cubin"])
    cache = tmp_path / "engine"
    args = (str(entry), str(override), "--static-only", "--engine-cache", str(cache))
    first = _cli(*args, "--json")
    assert first.returncode == 0, first.stderr
    assert len(list((cache / "checks").glob("*.json"))) == 1
    again = _cli(*args, "--json")
    assert again.returncode == 0 and json.loads(again.stdout) == json.loads(first.stdout)
    human = _cli(*args)
    assert human.returncode == 0 and "verdict from the engine cache" in human.stderr, human.stderr
    assert "verdict: unproven (static evidence accepted: --static-only)" in human.stdout
    fresh = _cli(*args, "--no-cache")
    assert fresh.returncode == 0 and "engine cache" not in fresh.stderr
    # the same candidate copied elsewhere is the same content: deduplicated, served from the cache
    copy = Path(shutil.copytree(override, tmp_path / "copy"))
    assert "verdict from the engine cache" in _cli(str(entry), str(copy), *args[2:]).stderr
    # without --static-only and with no launch record the dynamic check cannot run: never kept
    unproven = _cli(str(entry), str(override), "--engine-cache", str(cache), "--no-symbolic", "--seeds", "1",
                    "--device", "cpu")
    again = _cli(str(entry), str(override), "--engine-cache", str(cache), "--no-symbolic", "--seeds", "1",
                 "--device", "cpu")
    assert unproven.returncode == again.returncode and "engine cache" not in again.stderr
    # an equivalent verdict stands although the GPU run was skipped (--device cpu is the caller's choice): kept
    from kstrata.testsuite.kernels.launch import suite_launch_record

    launch = suite_launch_record(get_kernel("softmax_online"), "cuda:90").save(tmp_path / "launch" / "s.json")
    good = write_override(run_pipeline(original, parse_pipeline("ttir(load-eviction)")).bundle, tmp_path / "good")
    cpu = (str(entry), str(good), "--launch", str(launch), "--seeds", "1", "--device", "cpu", "--engine-cache",
           str(cache))
    first = _cli(*cpu)
    assert first.returncode == 0 and "engine cache" not in first.stderr, first.stdout + first.stderr
    kept = _cli(*cpu)
    assert kept.returncode == 0 and "verdict from the engine cache" in kept.stderr
    assert "verdict: equivalent" in kept.stdout and "skipped cubin  differential" in kept.stdout


def test_ir_evidence_does_not_cover_an_assembly_edit_below_it(entry: Path, tmp_path: Path) -> None:
    """A pipeline `ttir(a),ptx(b)` edits the PTX after the TTIR: its binary is not the TTIR's, so the
    interpreter's TTIR evidence is not evidence for it (the PTX edit is checked only by a GPU run)."""
    from kstrata.backends.verify import pipeline_levels, verify
    from kstrata.ir.launch import LaunchRecord
    from kstrata.ir.triton_layout import load_any
    from kstrata.testsuite.kernels.launch import suite_launch_record

    original = load_any(entry)[0][0]
    record = LaunchRecord.load(suite_launch_record(get_kernel("softmax_online"), "cuda:90").save(tmp_path / "l.json"))
    spec = "ttir(load-eviction),ptx(cache-hints)"
    assert pipeline_levels(spec) == ["ttir", "ptx"]
    new = run_pipeline(original, parse_pipeline(spec)).bundle
    report = verify(original, new, record, device="cpu", seeds=1, edited=pipeline_levels(spec))  # as the CLI does
    assert report.truth_level == "ptx", report.to_json()
    assert any(c.name.startswith("interpreter") and c.verdict == "pass" for c in report.checks), report.checks
    # each dynamic check carries its own wall time (where an acceptance check's minutes go, at a published size)
    assert all(c.seconds is not None and c.seconds > 0 for c in report.checks if c.name.startswith("interpreter"))
    assert report.verdict is Verdict.UNPROVEN, report.to_json()
    assert any("does not cover the candidate's own ptx edit" in r for r in report.unproven_reasons())
    # the same TTIR edit alone: the interpreter's evidence is complete
    alone = run_pipeline(original, parse_pipeline("ttir(load-eviction)")).bundle
    r2 = verify(original, alone, record, device="cpu", seeds=1, edited=["ttir"])
    assert r2.truth_level == "ttir" and r2.verdict is Verdict.EQUIVALENT, r2.to_json()


def test_amd_num_warps_changes_the_workgroup_size_on_purpose() -> None:
    # as the PTX launch bounds: a code object's max workgroup size may follow a changed warp count (num-warps),
    # and only when it equals the candidate's warps x wave size
    import dataclasses

    from kstrata.backends.verify import verify_static
    from kstrata.testsuite.kernels.build import bundle_for

    hip = bundle_for(get_kernel("softmax_online"), Target.parse("hip:gfx942"))
    new = run_pipeline(hip, parse_pipeline("ttgir(num-warps{n=8})")).bundle
    report = verify_static(hip, new)
    abi = next(c for c in report.checks if c.name == "abi")
    assert abi.verdict == "pass" and "4 -> 8 warps, and the max workgroup size 512 matches it" in abi.detail
    lying = dataclasses.replace(new, metadata={**new.metadata, "num_warps": 2})  # 128 threads, but the code says 512
    abi = next(c for c in verify_static(hip, lying).checks if c.name == "abi")
    assert abi.verdict == "fail" and "max workgroup size 256 → 512" in abi.detail


def test_a_report_round_trips_through_json() -> None:
    # a cached verify report (the engine's) is rebuilt from its JSON: every field must come back
    import dataclasses

    report = VerifyReport("k", "cuda:90", ["ttir", "ptx"], [Check("interpreter (seed 0)", "ttir", "pass", "equal"),
                                                           Check("differential", "cubin", "skipped", "no GPU")],
                          rebuilt_levels=["cubin"], launch_source="the given launch record", notes=["n"],
                          static_only=False, truth_level="ptx")
    data = json.loads(json.dumps(report.to_json()))
    assert {f.name for f in dataclasses.fields(VerifyReport)} <= set(data)
    again = VerifyReport.from_json(data)
    assert again == report and again.to_json() == report.to_json()


def test_a_large_launchs_interpreter_jobs_run_in_parallel_children(entry: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """At a published size one interpreter run is tens of seconds (gap task 01: 35 s a level and input set on
    this machine's CPU, 140 s for the four of a TTIR edit's check in a row): a launch of at least
    `PARALLEL_INTERP_BYTES` runs its interpreter jobs in as many children as the CPUs and the memory allow, and
    the report is the same, in the same order, each check with its own seconds."""
    import kstrata.backends.dynamic as dynamic
    from kstrata.backends.dynamic import interpreter_workers
    from kstrata.backends.verify import verify
    from kstrata.ir.launch import LaunchRecord
    from kstrata.ir.triton_layout import load_any
    from kstrata.testsuite.kernels.launch import suite_launch_record

    original = load_any(entry)[0][0]
    record = LaunchRecord.load(suite_launch_record(get_kernel("softmax_online"), "cuda:90").save(tmp_path / "l.json"))
    assert interpreter_workers(record, 4, cpus=16, available=1 << 40) == 1  # small: one child's start-up is cheaper
    monkeypatch.setattr(dynamic, "PARALLEL_INTERP_BYTES", 0)
    assert interpreter_workers(record, 4, cpus=16, available=1 << 40) == 4
    assert interpreter_workers(record, 4, cpus=2, available=1 << 40) == 2
    assert interpreter_workers(record, 4, cpus=16, available=0) == 1  # memory unknown: one at a time
    assert interpreter_workers(record, 1, cpus=16, available=1 << 40) == 1
    new = run_pipeline(original, parse_pipeline("ttir(load-eviction)")).bundle
    children: list[int] = []
    real = dynamic.run_jobs

    def counted(jobs: list[dict[str, Any]], *args: Any, **kwargs: Any) -> Any:
        children.append(len(jobs))
        return real(jobs, *args, **kwargs)

    monkeypatch.setattr(dynamic, "run_jobs", counted)
    monkeypatch.setattr(dynamic, "host_available_memory", lambda: 1 << 40)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _p: {0, 1})
    told: list[str] = []  # progress: each check as it ends, from the runner's threads
    report = verify(original, new, record, device="cpu", seeds=1, on_check=lambda c: told.append(c.name + c.level))
    interpreted = [c for c in report.checks if c.name.startswith("interpreter")]
    assert children == [len(interpreted) // 2 + len(interpreted) % 2, len(interpreted) // 2], children
    assert sorted(t for t in told if t.startswith("interpreter")) == sorted(c.name + c.level for c in interpreted)
    # the planned order: each level's input sets, TTIR first
    assert [c.level for c in interpreted] == sorted((c.level for c in interpreted), key=["ttir", "ttgir"].index)
    assert all(c.verdict == "pass" and c.seconds for c in interpreted) and report.verdict is Verdict.EQUIVALENT
    # a miscompile (the online max turned into a min) is still caught when its jobs run apart
    from kstrata.backends.rebuild import rebuild_from

    wrong_ttir = original.text("ttir").replace("arith.maxnumf", "arith.minnumf")
    assert wrong_ttir != original.text("ttir")
    children.clear()
    caught = verify(original, rebuild_from(original, "ttir", wrong_ttir), record, device="cpu", seeds=1)
    assert caught.verdict is Verdict.DIFFERENT and len(children) == 2
    assert any(c.name.startswith("interpreter") and c.verdict == "fail" for c in caught.checks)
