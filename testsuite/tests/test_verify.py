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

import pytest

from kstrata.backends.verify import load_candidate, verify_static
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
    assert report.ok and report.differing_levels == ["llir", "ptx", "cubin"]
    proc = _cli(str(entry), str(override), "--json")
    assert proc.returncode == 0, proc.stderr
    assert {c["name"] for c in json.loads(proc.stdout)["checks"]} >= {"signature", "accepted", "abi", "resources"}


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
    from kstrata.ir.candidate import CandidateInfo
    from kstrata.agents.run_passes import run_passes

    out = tmp_path / "out"
    report = run_passes(entry.parent, "ttgir(num-warps{n=8})", out, kernel_filter="softmax_online")
    override = Path(next(k["override_entry"] for k in report.kernels if k["status"] == "changed"))
    info = CandidateInfo.read(override)
    assert info is not None and info.metadata == {"num_warps": 8} and info.tolerance == "ulp=4,rtol=1e-05,atol=1e-06"
    proc = _cli(str(entry), str(override), "--json")
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
    assert report.ok and any(c.name == "differential" and "AMD GPU" in c.detail for c in report.checks)
    cuda = bundle_for(kernel, Target.parse("cuda:90"))
    with pytest.raises(KstrataError, match="no NVIDIA GPU"):
        verify(cuda, cuda, suite_launch_record(kernel, "cuda:90"), device="cuda")


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
    assert "verdict: rejected" in proc.stdout


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
    proc = _cli(str(entry), str(ptx), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["differing_levels"] == ["ptx", "cubin"]
    proc = _cli(str(entry), str(tmp_path / "nothing.ptx"))
    assert proc.returncode == 2 and "nothing.ptx" in proc.stderr
