"""`kstrata run-passes --launches DIR --measure`: launch records matched to cache entries by cache key,
the timing columns of the report (with an injected timing on the CPU), the clear skip without a GPU,
and, on an NVIDIA GPU, the whole chain: `kstrata record` of a compiled program, then timing of the
original and rewritten binaries on replays of the recorded launch."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kstrata.agents.run_passes import (
    declared_tolerances,
    load_launch_records,
    match_record,
    run_passes,
    suspicious_reasons,
)
from kstrata.ir.errors import KstrataError
from kstrata.ir.launch import LaunchRecord, ScalarArg, TensorArg
from kstrata.ir.triton_layout import load_cache_root

from .conftest import copy_suite_subset, has_cuda

PIPELINE = "ptx(cache-hints)"


@pytest.fixture(scope="module")
def add_cache(suite_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_suite_subset(suite_cache, tmp_path_factory.mktemp("add-cache"), ("vector_add", "softmax_online"),
                             ("cuda:90",))


def _record_for(cache: Path, kernel: str, out: Path, *, by: str = "cache_key",
                extra: dict[str, Any] | None = None) -> Path:
    """A launch record of `kernel` as `kstrata record` writes it for that cache entry's binary."""
    bundles, _ = load_cache_root(cache)
    bundle = next(b for b in bundles if b.name == kernel)
    args = tuple(TensorArg(p.name, "float32", (4096,), (1,), 0, 4096, p.name.startswith("out")) if p.is_pointer
                 else ScalarArg(p.name, p.triton_type, 4096) for p in bundle.params)
    keys = {"cache_key": str(bundle.metadata["hash"])} if by == "cache_key" else {"override_key": "NOSUCHKEY"}
    return LaunchRecord(kernel, "cuda:90", (4, 1, 1), args, num_warps=bundle.num_warps, extra=extra or {},
                        **keys).save(out / f"{kernel}-1.json")


def _fake_timing(before: float, after: float) -> Any:
    def measure(outcome: dict[str, Any], record: str) -> dict[str, Any]:
        assert Path(record).exists() and Path(outcome["candidate_entry"]).is_dir()
        return {"time_before_us": before, "time_after_us": after, "speedup": before / after,
                "speedup_range": [before / after * 0.99, before / after * 1.01], "spread_before_pct": 1.5,
                "spread_after_pct": 2.0, "rounds": 6, "runs_per_round": 50, "outputs_equal": True,
                "device": "Fake GPU", "torch": "x", "triton": "y", "write_bound_us": 0.01}

    return measure


def test_records_match_cache_entries_by_cache_key(add_cache: Path, tmp_path: Path) -> None:
    launches = tmp_path / "launches"
    _record_for(add_cache, "vector_add_kernel", launches)
    (launches / "broken-1.json").write_text("{}")
    index, unreadable = load_launch_records(launches)
    assert len(unreadable) == 1 and "broken-1.json" in unreadable[0]
    entries = {b.name: Path(b.origin or "") for b in load_cache_root(add_cache)[0]}
    assert match_record(str(entries["vector_add_kernel"]), index) == str(launches / "vector_add_kernel-1.json")
    assert match_record(str(entries["softmax_online_kernel"]), index) is None
    # a dump entry is named by its override key
    assert match_record("/some/dump/NOSUCHKEY", {"override:NOSUCHKEY": "r.json"}) == "r.json"


def test_report_shows_measured_times_and_flags_the_suspicious(add_cache: Path, tmp_path: Path) -> None:
    launches = tmp_path / "launches"
    _record_for(add_cache, "vector_add_kernel", launches)
    report = run_passes(add_cache, PIPELINE, tmp_path / "out", launches=launches, measure=True,
                        measure_fn=_fake_timing(30.0, 20.0))
    by_name = {k["name"]: k for k in report.kernels}
    add, softmax = by_name["vector_add_kernel"], by_name["softmax_online_kernel"]
    assert add["status"] == "changed" and add["time_before_us"] == 30.0 and add["speedup"] == pytest.approx(1.5)
    assert add["suspicious"] == []
    assert softmax["timing"] == {"skipped": "no launch record of this binary in --launches"}
    data = json.loads((tmp_path / "out" / "run-passes-report.json").read_text())
    assert data["measure"]["timed"] == 1 and data["measure"]["matched"] == 1
    assert data["kernels"][0]["time_after_us"] is not None or data["kernels"][1]["time_after_us"] is not None
    md = (tmp_path / "out" / "run-passes-report.md").read_text()
    assert "before µs | after µs | speedup" in md and "30.00 ±1.5% | 20.00 ±2.0% | 1.500x" in md
    assert "on Fake GPU" in md and "not timed: no launch record" in md
    # a 20x result is flagged, not reported as a win
    flagged = run_passes(add_cache, PIPELINE, tmp_path / "out2", launches=launches, measure=True,
                         measure_fn=_fake_timing(400.0, 20.0))
    add2 = next(k for k in flagged.kernels if k["name"] == "vector_add_kernel")
    assert add2["suspicious"] and "beyond 10x" in add2["suspicious"][0]
    assert "SUSPICIOUS" in (tmp_path / "out2" / "run-passes-report.md").read_text()


def test_rebuild_uses_the_ptxas_of_the_recorded_program(add_cache: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor runs Triton with torch's ptxas (TRITON_PTXAS_PATH); the record keeps it and the kernel's
    rebuild uses it (the PTX may be of an ISA version the ptxas Triton bundles refuses)."""
    from triton import knobs

    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    log = tmp_path / "ptxas-calls"
    wrapper = tmp_path / "ptxas"
    wrapper.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\nexec {knobs.nvidia.ptxas.path} \"$@\"\n")
    wrapper.chmod(0o755)
    launches = tmp_path / "launches"
    _record_for(add_cache, "vector_add_kernel", launches, extra={"TRITON_PTXAS_PATH": str(wrapper)})
    report = run_passes(add_cache, PIPELINE, tmp_path / "out", launches=launches, kernel_filter="vector_add")
    assert report.counts()["changed"] == 1, report.kernels
    assert log.exists() and "sm_90" in log.read_text()  # the rebuild ran this ptxas


def test_suspicious_reasons() -> None:
    ok = {"speedup": 1.2, "time_before_us": 12.0, "time_after_us": 10.0, "write_bound_us": 5.0, "outputs_equal": True}
    assert suspicious_reasons(ok) == []
    assert "below the time to write" in suspicious_reasons(ok | {"time_after_us": 2.0})[0]
    assert "different bytes" in suspicious_reasons(ok | {"outputs_equal": False})[0]
    assert "beyond 10x" in suspicious_reasons(ok | {"speedup": 0.05})[0]
    # bits may move only where a pass says so (num-warps reassociates reductions)
    assert suspicious_reasons(ok | {"outputs_equal": False, "declared_tolerance": "num-warps{n=8}: ulp=4"}) == []
    assert declared_tolerances("ptx(cache-hints)") is None
    assert "num-warps" in (declared_tolerances("ttgir(num-warps{n=8})") or "")


@pytest.mark.skipif(has_cuda(), reason="checks the message given when there is no NVIDIA GPU")
def test_measure_without_a_gpu_says_it_is_skipped_and_why(add_cache: Path, tmp_path: Path) -> None:
    launches = tmp_path / "launches"
    _record_for(add_cache, "vector_add_kernel", launches)
    report = run_passes(add_cache, PIPELINE, tmp_path / "out", launches=launches, measure=True)
    add = next(k for k in report.kernels if k["name"] == "vector_add_kernel")
    assert add["status"] == "changed" and add["time_after_us"] is None
    assert "no NVIDIA GPU" in add["timing"]["skipped"]
    assert report.measure is not None and "no NVIDIA GPU" in report.measure["reasons"]["cuda:90"]
    assert "timing skipped for cuda:90: no NVIDIA GPU" in (tmp_path / "out" / "run-passes-report.md").read_text()
    cli = [sys.executable, "-m", "kstrata.tools.cli", "run-passes", str(add_cache), "--pipeline", PIPELINE]
    proc = subprocess.run([*cli, "--out", str(tmp_path / "o"), "--launches", str(launches), "--measure"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "--measure: timing skipped" in proc.stderr and "no NVIDIA GPU" in proc.stderr
    assert "Measurement:" in proc.stdout


def test_measure_needs_launches(add_cache: Path, tmp_path: Path) -> None:
    with pytest.raises(KstrataError, match="give --launches"):
        run_passes(add_cache, PIPELINE, tmp_path / "out", measure=True)
    proc = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "run-passes", str(add_cache), "--pipeline",
                           PIPELINE, "--out", str(tmp_path / "o"), "--measure"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2 and "add --launches" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
def test_record_then_measure_on_the_gpu(tmp_path: Path) -> None:
    """A compiled program under `kstrata record` (fresh Triton cache), then run-passes times its kernel."""
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent("""
        import torch
        from kstrata.testsuite.kernels import get_kernel
        k = get_kernel("vector_add")
        n = 1 << 24
        x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        out = torch.empty_like(x)
        for _ in range(3):
            k.fn[((n + 1023) // 1024,)](x, y, out, n, BLOCK=1024)
        torch.cuda.synchronize()
        assert torch.equal(out, x + y)
    """))
    cache, launches = tmp_path / "cache", tmp_path / "launches"
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    rec = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "record", "--out", str(launches), "--json", "--",
                          sys.executable, str(prog)], capture_output=True, text=True, timeout=600, check=False, env=env)
    assert rec.returncode == 0, rec.stderr
    record = LaunchRecord.load(launches / "vector_add_kernel-1.json")
    assert record.cache_key and record.override_key and record.target == "cuda:90" and record.grid[0] == (1 << 24) // 1024
    assert not (launches / "vector_add_kernel-2.json").exists()  # one per binary by default
    report = run_passes(cache, PIPELINE, tmp_path / "out", launches=launches, measure=True)
    add = next(k for k in report.kernels if k["name"] == "vector_add_kernel")
    assert add["status"] == "changed" and add["launch_record"], add
    assert add["time_before_us"] > 0 and add["time_after_us"] > 0, add["timing"]
    assert add["timing"]["outputs_equal"] is True and add["timing"]["rounds"] >= 2
    assert "before µs" in (tmp_path / "out" / "run-passes-report.md").read_text()


@pytest.mark.slow
def test_ttir_rewrites_are_checked_by_the_interpreter_on_their_launch(add_cache: Path, tmp_path: Path) -> None:
    launches = tmp_path / "launches"
    record = _record_for(add_cache, "vector_add_kernel", launches)
    report = run_passes(add_cache, "ttir(load-eviction)", tmp_path / "out", launches=launches)
    by_name = {k["name"]: k for k in report.kernels}
    checked = by_name["vector_add_kernel"]
    assert checked["status"] == "changed", checked.get("error")
    assert checked["checks"]["interpreter"].endswith("input sets equivalent")
    assert by_name["softmax_online_kernel"]["checks"]["interpreter"].startswith("not run: no launch record")
    # a TTIR rewrite the interpreter finds wrong is DIFFERENT, with the interpreter's evidence
    from kstrata.agents.engine import Candidate, Engine, PipelineEdit, Verdict
    from kstrata.backends.rebuild import rebuild_from
    from kstrata.ir.triton_layout import write_cache_entry

    bundles, _ = load_cache_root(add_cache)
    original = next(b for b in bundles if b.name == "vector_add_kernel")
    wrong = rebuild_from(original, "ttir", original.text("ttir").replace("arith.addf", "arith.subf", 1))
    wrong_entry = write_cache_entry(wrong, tmp_path / "wrong")
    with Engine(tmp_path / "engine") as engine:
        base = engine.add_kernel(Path(original.origin or ""))
        right = engine.build(Candidate(base, "ttir", PipelineEdit("ttir(load-eviction)")))
        bad = dataclasses.replace(right, entry=str(wrong_entry), binary_digest="0" * 64)
        verdict = engine.check(base, bad, [record], device="cpu")
    assert verdict.verdict is Verdict.DIFFERENT, verdict
    assert any(e.name.startswith("interpreter") and e.verdict == "fail" for e in verdict.evidence)
