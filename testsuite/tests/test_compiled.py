"""The compiled-kernel optimizer (`kstrata optimize CACHE_DIR --launches RECORDS`): static hot windows, the
llvm-mca surrogate, the ncu sampling parser, alias evidence from launch records, shares, the search's gate
and guard (on a scripted engine), and end to end on the CPU: a gfx942 kernel optimized statically
(surrogate-ranked, hazard-checked, unmeasured) and a CUDA kernel through the CPU path."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kstrata.agents.compiled.program import Program, ProgramKernel, assign_shares
from kstrata.agents.compiled.search import SearchConfig, search_kernel
from kstrata.agents.compiled.spaces import Atom, Space, alias_evidence, pipeline_of
from kstrata.agents.engine import BuildResult, CheckResult, Evidence, Measurement, Verdict
from kstrata.backends.hotwindow import find_loops, parse_ncu_source_csv, static_hot_window, window_from_samples
from kstrata.backends.verify import GPU_DIFFERENTIAL
from kstrata.ir.launch import LaunchRecord, ScalarArg, TensorArg

from .conftest import copy_suite_subset, has_cuda

AMD_NESTED = """\
kern:                                   ; @kern
.Lfunc_begin0:
\ts_load_dwordx2 s[0:1], s[0:1], 0x0
\tv_mov_b32_e32 v1, 0
.LBB0_1:                                ; =>This Loop Header: Depth=1
\tv_add_f32_e32 v1, v1, v1
.LBB0_2:                                ;   Parent Loop BB0_1 Depth=1
                                        ; =>  This Inner Loop Header: Depth=2
\tv_mul_f32_e32 v2, v1, v1
\tv_fma_f32 v3, v2, v1, v3
\ts_add_i32 s4, s4, 1
\ts_cmp_lg_u32 s4, s5
\ts_cbranch_scc1 .LBB0_2
\ts_add_i32 s6, s6, 1
\ts_cmp_lg_u32 s6, s7
\ts_cbranch_scc1 .LBB0_1
.LBB0_3:
\tglobal_store_dword v0, v3, s[0:1]
\ts_endpgm
.LBB0_4:                                ; out-of-line block jumping back: not a loop
\ts_branch .LBB0_3
.Lfunc_end0:
"""

PTX_LOOP = """\
.visible .entry k(.param .u64 k_param_0)
{
\t.reg .b32 %r<4>;
\tmov.u32 %r1, 0;
$L__BB0_1:                              // =>This Inner Loop Header: Depth=1
\tadd.s32 %r1, %r1, 1;
\tld.global.f32 %f1, [%rd1];
\tsetp.lt.s32 %p1, %r1, %r2;
\t@%p1 bra $L__BB0_1;
\tst.global.f32 [%rd1], %f1;
\tret;
}
"""


def test_static_hot_window_weights_nested_loops_and_ignores_back_jumps() -> None:
    loops = {lp.header: lp for lp in find_loops(AMD_NESTED, "amdgcn")}
    assert set(loops) == {".LBB0_1", ".LBB0_2"}  # .LBB0_4's branch back to .LBB0_3 is not a loop (no LLVM mark)
    assert loops[".LBB0_2"].depth == 2 and loops[".LBB0_2"].instructions == 5
    w = static_hot_window(AMD_NESTED, "amdgcn")
    assert w.header == ".LBB0_1"  # the outer loop holds the inner one: its weight is the larger
    assert w.weight == 1 * 8 + 5 * 64 + 3 * 8  # its own 4 instructions at 8, the inner 5 at 8*8
    assert "v_fma_f32 v3, v2, v1, v3" in w.instructions and "global_store_dword v0, v3, s[0:1]" not in w.instructions
    assert w.source.startswith("static") and "assumed" in w.source
    p = static_hot_window(PTX_LOOP, "ptx")
    assert p.header == "$L__BB0_1" and p.first_line == 5 and p.last_line == 9
    assert p.instructions[0] == "add.s32 %r1, %r1, 1;" and not any(i.startswith("st.") for i in p.instructions)
    flat = static_hot_window("k:\n\tv_mov_b32 v0, 0\n\ts_endpgm\n.Lfunc_end0:\n\tamdhsa.target: x\n", "amdgcn")
    assert flat.instructions == ("v_mov_b32 v0, 0", "s_endpgm") and flat.header is None  # not the metadata


def test_ncu_source_sampling_picks_the_sampled_loop() -> None:
    csv = ('==PROF== Connected to process 1\n"#","Address","Source","Warp Stall Sampling (All Samples)",'
           '"Warp Stall Sampling (Not-issued Samples)"\n"4","","mov.u32 %r1, 0;","10","1"\n'
           '"6","","add.s32 %r1, %r1, 1;","300","20"\n"7","","ld.global.f32 %f1, [%rd1];","900","800"\n'
           '"10","","st.global.f32 [%rd1], %f1;","40","3"\n')
    samples = parse_ncu_source_csv(csv)
    assert samples == {4: 10.0, 6: 300.0, 7: 900.0, 10: 40.0}
    w = window_from_samples(PTX_LOOP, samples)
    assert w.header == "$L__BB0_1" and w.source.startswith("ncu sampling: 96%")
    assert window_from_samples(PTX_LOOP, {}).source.startswith("static")  # nothing sampled: said so


def test_llvm_mca_surrogate_ranks_a_longer_window_as_costlier() -> None:
    from kstrata.backends.mca import mca_estimate
    from kstrata.backends.tools import ToolNotFound

    try:
        one = mca_estimate(["v_fma_f32 v3, v2, v1, v3"] * 4)
    except ToolNotFound as exc:
        pytest.skip(f"llvm-mca is not installed ({exc}); make setup installs llvm-22")
    two = mca_estimate(["v_fma_f32 v3, v2, v1, v3"] * 8 + ["s_cbranch_scc1 .LBB0_2"])
    assert one.mcpu == "gfx942" and one.instructions == 4 and two.instructions == 8  # the branch is not modeled
    assert two.cycles_per_iteration > one.cycles_per_iteration > 0


def _record(tmp_path: Path, name: str, storage: dict[str, list[int]] | None) -> str:
    args = (TensorArg("x", "float32", (64,), (1,), 0, 64, False), TensorArg("y", "float32", (64,), (1,), 0, 64, True),
            ScalarArg("n", "i32", 64))
    return str(LaunchRecord("k", "cuda:90", (1, 1, 1), args, extra={"storage": storage} if storage else {})
               .save(tmp_path / f"{name}.json"))


def test_noalias_edits_need_launch_records_that_show_no_overlap(tmp_path: Path) -> None:
    apart = _record(tmp_path, "apart", {"x": [4096, 256], "y": [8192, 256]})
    overlap = _record(tmp_path, "overlap", {"x": [4096, 256], "y": [4224, 256]})
    bare = _record(tmp_path, "bare", None)
    assert alias_evidence([apart]) is None
    assert "overlaps" in (alias_evidence([apart, overlap]) or "")
    assert "no buffer addresses" in (alias_evidence([bare]) or "")
    assert "no launch record" in (alias_evidence([]) or "")


def test_shares_measured_skip_small_kernels_and_equal_shares_say_why() -> None:
    kernels = [ProgramKernel(f"/c/{n}", n, n, "cuda:90", record="r", launches=c) for n, c in (("a", 10), ("b", 1), ("c", 1))]
    program = Program("/c", "/l", kernels)
    assign_shares(program, {"/c/a": 10.0, "/c/b": 50.0, "/c/c": 0.5}, "unused")
    assert program.share_source == "measured"
    assert [k.name for k in program.ranked()] == ["a", "b"]  # 100 us, 50 us; c has 0.5 us of 150.5
    assert kernels[2].skip and "under 1%" in kernels[2].skip
    fresh = Program("/c", None, [ProgramKernel(f"/c/{n}", n, n, "cuda:90") for n in "xy"])
    assign_shares(fresh, None, "no GPU here")
    assert fresh.share_source == "equal" and fresh.share_note == "no GPU here"
    assert all(k.share == 0.5 for k in fresh.kernels)


# ---------------------------------------------------------------------------------------------------
# The search's gate and guard, on a scripted engine (no processes)
# ---------------------------------------------------------------------------------------------------
class ScriptedEngine:
    """Answers build/check/measure from a table keyed by pipeline spelling; counts what it was asked."""

    def __init__(self, verdicts: dict[str, Verdict], speedups: dict[str, list[float]],
                 siblings: dict[str, list[float]] | None = None) -> None:
        self.verdicts, self.speedups = verdicts, speedups
        #: sibling base -> the rounds' speedups of any candidate over that sibling's original, on its own record
        self.siblings = siblings or {}
        self.sibling_measured: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = []
        self.measured: list[str] = []
        self.checked: list[str] = []
        self.built: list[str] = []
        #: (pipeline, the compute-sanitizer tool its check asked for: None = verify's default, "auto")
        self.sanitizer: list[tuple[str, str | None]] = []
        #: pipelines whose binary compute-sanitizer finds at fault
        self.sanitizer_fails: set[str] = set()
        #: whether each GPU check asked for the interpreter runs of TTIR/TTGIR edits
        self.interpreter: list[bool] = []
        #: pipeline -> the tolerance its timing was told its passes declare
        self.tolerances: dict[str, str | None] = {}

    def build(self, cand: Any, env: Any = None) -> BuildResult:
        spec = cand.edit.spec
        self.built.append(spec)
        return BuildResult(cand.key, "changed", entry=f"/builds/{spec}", binary_digest=hashlib.sha256(spec.encode()).hexdigest())

    def check(self, base: str, built: BuildResult, launches: Any, **kw: Any) -> CheckResult:
        spec = built.entry.removeprefix("/builds/")  # type: ignore[union-attr]
        self.checked.append(spec)
        tool = kw["verify"].sanitizer if kw.get("verify") is not None else None
        self.sanitizer.append((spec, tool))
        if kw.get("verify") is not None:
            self.interpreter.append(kw["verify"].interpreter)
        v = self.verdicts.get(spec, Verdict.EQUIVALENT)
        # the name the real GPU differential run gives its evidence (backends/verify.py)
        ev = (Evidence(f"{GPU_DIFFERENTIAL}: seed 0 random", "cubin", "pass", ""),) if kw.get("device") == "cuda" else ()
        if tool != "none" and kw.get("device") == "cuda":
            fails = spec in self.sanitizer_fails
            ev += (Evidence("compute-sanitizer memcheck", "cubin", "fail" if fails else "pass",
                            "Invalid __global__ read of size 4" if fails else ""),)
            v = Verdict.DIFFERENT if fails else v
        return CheckResult(v, v.value, ev)

    def measure(self, base: str, built: BuildResult, launches: Any, budget: Any,
                original_launches: Any = (), declared_tolerance: str | None = None) -> Measurement:
        spec = built.entry.removeprefix("/builds/")  # type: ignore[union-attr]
        self.tolerances[spec] = declared_tolerance
        if original_launches:  # another config's original, on its own record
            self.sibling_measured.append((base, spec, tuple(launches), tuple(original_launches)))
            rounds = self.siblings[base]
        else:
            self.measured.append(spec)
            rounds = self.speedups.get(spec, [1.0, 1.0])
        s = sorted(rounds)[len(rounds) // 2]
        return Measurement("timed", "", 10.0, 10.0 / s, s, {"speedup_range": [min(rounds), max(rounds)],
                                                             "spread_before_pct": 1.0, "spread_after_pct": 1.0})

    def built_entry(self, built: BuildResult) -> str:
        return built.entry or ""


def _atoms() -> list[Space]:
    nw = tuple(Atom("options", "ttgir", "num-warps", f"num-warps{{n={n}}}", "ulp=4") for n in (2, 8))
    ev = (Atom("ttir", "ttir", "load-eviction", "load-eviction{policy=evict_first}"),)
    ch = (Atom("ptx", "ptx", "cache-hints", "cache-hints{loads=cs stores=none}"),)
    return [Space("options", nw), Space("ttir", ev), Space("ptx", ch)]


def test_search_gates_before_timing_and_the_guard_needs_every_round_faster() -> None:
    spaces = _atoms()
    nw8, ev = "ttgir(num-warps{n=8})", "ttir(load-eviction{policy=evict_first})"
    engine = ScriptedEngine({ev: Verdict.DIFFERENT},
                            {nw8: [1.30, 1.25, 1.32], "ttgir(num-warps{n=2})": [1.2, 0.95, 1.3],
                             "ptx(cache-hints{loads=cs stores=none})": [1.01, 1.01]})
    cfg = SearchConfig(budget=8, seed=3, device="cuda")
    result = search_kernel(engine, "b" * 64, "k", "/c/k", "cuda:90", "/l/k.json", spaces, cfg,  # type: ignore[arg-type]
                           mode="measured", mode_note="test")
    by = {t.pipeline: t for t in result.trials}
    assert by[ev].status == "different" and ev not in engine.measured  # a different candidate is never timed
    assert set(engine.measured) <= set(engine.checked)  # nothing timed before its check
    # the timing knows the tolerance the candidate's passes declare (other bytes from num-warps are no suspicion)
    assert engine.tolerances[nw8] == "ulp=4,rtol=1e-05,atol=1e-06" and engine.tolerances["ptx(cache-hints{loads=cs stores=none})"] is None
    assert result.best is not None and result.best.pipeline == nw8 and result.best.speedup == pytest.approx(1.30)
    # one slower round: not a winner; 1% is inside the noise: not a winner
    assert by["ttgir(num-warps{n=2})"].measured and by["ttgir(num-warps{n=2})"] is not result.best
    # a PTX edit with the GPU differential run's evidence is proven and timed (an H200 run found every PTX edit
    # left unproven: the search looked for evidence named "gpu...", which verify never writes)
    ptx = by["ptx(cache-hints{loads=cs stores=none})"]
    assert ptx.status == "equivalent" and ptx.measured
    assert len(result.trials) <= cfg.budget
    assert any(t.phase == "anneal" and "," in t.pipeline for t in result.trials)  # sequences of edits were tried
    # where each trial's time went: build always, the gate when built, the timing when it passed, the sanitizer for
    # the winner
    assert set(by[nw8].phase_seconds) == {"build", "gate", "measure", "sanitize"}
    assert set(by[ev].phase_seconds) == {"build", "gate"}
    assert set(by["ttgir(num-warps{n=2})"].phase_seconds) == {"build", "gate", "measure"}
    again = search_kernel(ScriptedEngine(engine.verdicts, engine.speedups), "b" * 64, "k", "/c/k", "cuda:90",  # type: ignore[arg-type]
                          "/l/k.json", spaces, cfg, mode="measured", mode_note="test")
    assert [t.pipeline for t in again.trials] == [t.pipeline for t in result.trials]  # seeded: reproducible


def test_on_the_cpu_low_level_edits_are_unproven_and_nothing_is_timed() -> None:
    engine = ScriptedEngine({}, {})
    cfg = SearchConfig(budget=6, device="cpu", unmeasured_reason="unmeasured: no GPU")
    result = search_kernel(engine, "b" * 64, "k", "/c/k", "cuda:90", "/l/k.json", _atoms(), cfg,  # type: ignore[arg-type]
                           mode="unranked", mode_note="test")
    by = {t.pipeline: t for t in result.trials}
    assert by["ptx(cache-hints{loads=cs stores=none})"].status == "unproven"  # EQUIVALENT, but no GPU evidence
    assert "only the GPU differential run checks" in by["ptx(cache-hints{loads=cs stores=none})"].reason
    assert by["ttgir(num-warps{n=2})"].status == "equivalent"
    assert not engine.measured and result.best is None
    assert all(t.unmeasured == "unmeasured: no GPU" for t in result.trials if t.status in ("equivalent", "unproven"))


def test_only_a_passing_gpu_differential_run_counts_as_gpu_evidence() -> None:
    from kstrata.backends.verify import ran_on_gpu

    assert ran_on_gpu([Evidence(f"{GPU_DIFFERENTIAL}: seed 0 random", "cubin", "pass", "")])
    assert not ran_on_gpu([Evidence(GPU_DIFFERENTIAL, "cubin", "skipped", "needs an NVIDIA GPU (--device cpu)")])
    assert not ran_on_gpu([Evidence(f"{GPU_DIFFERENTIAL}: seed 0 random", "cubin", "fail", "element 3 differs"),
                           Evidence("interpreter: seed 0", "ttgir", "pass", "")])


def test_pipeline_of_orders_stages_by_level() -> None:
    a = _atoms()
    assert pipeline_of([a[2].atoms[0], a[0].atoms[1], a[1].atoms[0]]) == \
        "ttir(load-eviction{policy=evict_first}),ttgir(num-warps{n=8}),ptx(cache-hints{loads=cs stores=none})"


# ---------------------------------------------------------------------------------------------------
# End to end on the CPU
# ---------------------------------------------------------------------------------------------------
def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(root)).encode() + f.read_bytes())
    return h.hexdigest()


def _program(suite_cache: Path, tmp_path: Path, name: str, target: str) -> tuple[Path, Path]:
    """A cache holding the suite kernel `name` for `target`, and the launch record `kstrata record` would
    write for a program that launched it (its cache key, the suite's own arguments)."""
    from kstrata.ir.triton_layout import read_index
    from kstrata.testsuite.kernels import get_kernel
    from kstrata.testsuite.kernels.launch import suite_launch_record

    cache = copy_suite_subset(suite_cache, tmp_path / "cache", (name,), (target,))
    records = tmp_path / "records"
    for key, rec in read_index(cache).items():
        meta = json.loads((cache / key / f"{rec['name']}.json").read_text())
        r = dataclasses.replace(suite_launch_record(get_kernel(name), target), cache_key=meta["hash"])
        r.save(records / f"{rec['name']}-1.json")
    return cache, records


def _optimize(cache: Path, records: Path, tmp_path: Path, *args: str) -> dict[str, Any]:
    before = _tree_digest(cache)
    proc = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "optimize", str(cache), "--launches", str(records),
                           "--out", str(tmp_path / "out"), "--device", "cpu", "--engine-cache", str(tmp_path / "engine"),
                           "--json", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _tree_digest(cache) == before  # the input cache is only read
    report: dict[str, Any] = json.loads(proc.stdout)
    assert report["share_source"] == "equal" and "no timing possible" in report["share_note"]
    assert not report["timed"] and not report["outputs"]["tuned"] and not report["outputs"]["overrides"]
    return report


@pytest.mark.slow
def test_optimize_a_gfx942_kernel_statically(suite_cache: Path, tmp_path: Path) -> None:
    cache, records = _program(suite_cache, tmp_path, "row_sum_bf16", "hip:gfx942")
    report = _optimize(cache, records, tmp_path, "--budget", "3", "--spaces", "amdgcn,ttir")
    (kernel,) = report["kernels"]
    amd = kernel["search"]
    assert amd["mode"] == "surrogate" and amd["base_surrogate"]["cycles_per_iteration"] > 0
    window = amd["base_surrogate"]["window"]
    assert window["source"].startswith("static") and window["header"] == ".LBB0_2"  # row_sum's column loop
    ranked = [t for t in amd["trials"] if t["score"] is not None]
    assert len(ranked) == 2 and all(t["pipeline"].startswith("amdgcn(nontemporal-hints") for t in ranked)
    assert all("s_waitcnt: no new uses" in t["reason"] and "no AMD GPU" in t["unmeasured"] for t in ranked)
    assert all(t["status"] == "unproven" and not t["measured"] for t in ranked)  # no AMD GPU: never "equivalent"
    written = [Path(p) for p in report["outputs"]["unmeasured"]]
    assert len(written) == 2 and all((p / "surrogate.json").is_file() and any(p.glob("*.hsaco")) for p in written)
    info = json.loads((written[0] / "surrogate.json").read_text())
    assert info["status"] == "unmeasured" and info["candidate"]["cost"] > 0
    assert "unmeasured; surrogate best" in kernel["result"]
    out = Path(report["out"])
    assert len((out / "trajectory.jsonl").read_text().splitlines()) == len(amd["trials"]) == 3


def test_the_reorder_passes_are_in_the_kernel_spaces(suite_cache: Path) -> None:
    """`kstrata optimize` enumerates the reordering edits from the passes' schedule spaces: offered where
    the hot window has something to move, skipped with the reason where it has not."""
    from kstrata.agents.compiled.spaces import kernel_spaces
    from kstrata.ir.triton_layout import load_cache_entry, read_index

    index = read_index(suite_cache)

    def bundle(name: str, target: str) -> Any:
        key = next(k for k, r in index.items() if r.get("suite_kernel") == name and r.get("target") == target)
        return load_cache_entry(suite_cache / key)

    ptx = {s.name: s for s in kernel_spaces(bundle("vector_add", "cuda:90"), [], only=("ptx",))}["ptx"]
    assert "ptx-reorder{strategy=hoist-loads scope=hot}" in [a.spelling for a in ptx.atoms]
    assert "no redundant conversion" in dict(ptx.skipped)["redundant-cvt"]
    amd = {s.name: s for s in kernel_spaces(bundle("layernorm_bwd_dx", "hip:gfx942"), [], only=("amdgcn",))}["amdgcn"]
    assert [a.spelling for a in amd.atoms if a.pass_name == "amdgcn-reorder"] == ["amdgcn-reorder{strategy=hoist-loads scope=hot}"]
    row_sum = {s.name: s for s in kernel_spaces(bundle("row_sum_bf16", "hip:gfx942"), [], only=("amdgcn",))}["amdgcn"]
    assert "nothing to move in the hot window" in dict(row_sum.skipped)["amdgcn-reorder"]


@pytest.mark.slow
def test_optimize_a_gfx942_kernel_ranks_a_reordering_statically(suite_cache: Path, tmp_path: Path) -> None:
    cache, records = _program(suite_cache, tmp_path, "layernorm_bwd_dx", "hip:gfx942")
    report = _optimize(cache, records, tmp_path, "--budget", "1", "--spaces", "amdgcn")
    (kernel,) = report["kernels"]
    search = kernel["search"]
    assert search["mode"] == "surrogate" and search["base_surrogate"]["cycles_per_iteration"] > 0
    (trial,) = [t for t in search["trials"] if t["pipeline"] == "amdgcn(amdgcn-reorder{strategy=hoist-loads scope=hot})"]
    assert trial["status"] == "unproven" and not trial["measured"] and "no AMD GPU" in trial["unmeasured"]
    assert "s_waitcnt: no new uses" in trial["reason"]  # the hazard check ran on the reordered code
    assert trial["score"] is not None and trial["surrogate"]["cycles_per_iteration"] > 0  # ranked by llvm-mca
    assert any(Path(p).is_dir() for p in report["outputs"]["unmeasured"])


def _reapplied(original: bytes, written: Path, name: str, vendor: str, arch: str) -> bytes:
    """The binary written under `written`, asserted to be what its own `patch.json` makes of `original`."""
    from kstrata.backends.binpatch import BinaryPatch, apply_binary_patch

    patched = (written / name).read_bytes()
    again, _ = apply_binary_patch(original, BinaryPatch.from_json(json.loads((written / "patch.json").read_text())),
                                  vendor, arch)
    assert again == patched
    return patched


def test_a_bare_hsaco_gets_in_place_nontemporal_patches(suite_cache: Path, tmp_path: Path) -> None:
    """`kstrata optimize KERNEL.hsaco --launches R` (in process): nt added to the memory instructions by
    same-size re-encodings, every byte outside the patched words and every non-code section unchanged, the
    code object's metadata equal, each written hsaco reproduced by its own patch.json, all unmeasured."""
    from kstrata.agents.compiled.binary import optimize_binary
    from kstrata.backends.amd import code_object_metadata, compare_metadata, disassemble_hsaco
    from kstrata.backends.elf import read_elf
    from kstrata.backends.tools import ToolNotFound

    cache, records = _program(suite_cache, tmp_path, "vector_add", "hip:gfx942")
    hsaco_path = next(cache.glob("*/vector_add_kernel.hsaco"))
    original = hsaco_path.read_bytes()
    try:
        report = optimize_binary(hsaco_path, records, tmp_path / "out")
    except ToolNotFound as exc:
        pytest.skip(f"llvm-mc/llvm-objdump are not installed ({exc})")
    assert hsaco_path.read_bytes() == original  # the input is only read
    by = {c["edit"]: c for c in report.candidates}
    stores, loads = by["nontemporal{stores=true loads=false}"], by["nontemporal{stores=false loads=true}"]
    both = by["nontemporal{stores=true loads=true}"]
    assert stores["edits"] + loads["edits"] == both["edits"] > 0
    before = {i.address: i for i in disassemble_hsaco(original, "gfx942")}
    for cand in (stores, loads, both):
        assert cand["status"] == "unproven" and "no AMD GPU" in cand["unmeasured"]
        written = Path(cand["written"])
        patched = _reapplied(original, written, "vector_add_kernel.hsaco", "amd", "gfx942")
        assert not compare_metadata(code_object_metadata(original), code_object_metadata(patched))
        ea, eb = read_elf(original), read_elf(patched)
        for sec in ea.sections:
            if sec.name and sec.name != ".text":
                assert sec.data == eb.section(sec.name).data, sec.name
        after = {i.address: i for i in disassemble_hsaco(patched, "gfx942")}
        changed = [a for a in before if before[a].words != after[a].words]
        assert len(changed) == cand["edits"]
        for a in changed:
            assert after[a].text == before[a].text + " nt" and after[a].mnemonic.startswith(("global_", "buffer_"))
        assert json.loads((written / "surrogate.json").read_text())["status"] == "unmeasured"


def test_a_bare_cubin_gets_in_place_evict_first_patches(suite_cache: Path, tmp_path: Path) -> None:
    """`kstrata optimize KERNEL.cubin --launches R` (in process): the policy field learned from ptxas sets
    evict-first on the loads, the stores or both; only those 16-byte instructions change, each disassembles to its
    old text with `.EF`, each written cubin is reproduced by its patch.json, all unmeasured. The learned field is
    ptxas's own: patching the plain probe gives ptxas's `.cs` build byte for byte."""
    from kstrata.agents.compiled.binary import optimize_binary
    from kstrata.backends.binpatch import apply_binary_patch, nvidia_listing
    from kstrata.backends.elf import read_elf
    from kstrata.backends.nvidia import PtxasOptions, assemble_ptx
    from kstrata.backends.sass_policy import _PROBE, evict_first_patch, learn_evict_first

    cache, records = _program(suite_cache, tmp_path, "vector_add", "cuda:90")
    cubin_path = next(cache.glob("*/vector_add_kernel.cubin"))
    original = cubin_path.read_bytes()
    report = optimize_binary(cubin_path, records, tmp_path / "out")
    assert cubin_path.read_bytes() == original  # the input is only read
    assert report.target == "cuda:90" and report.kernel == "vector_add_kernel"
    by = {c["edit"]: c for c in report.candidates}
    stores, loads = by["evict-first{stores=true loads=false}"], by["evict-first{stores=false loads=true}"]
    both = by["evict-first{stores=true loads=true}"]
    assert stores["edits"] >= 1 and loads["edits"] >= 2 and stores["edits"] + loads["edits"] == both["edits"]
    before = nvidia_listing(original)["vector_add_kernel"]
    for cand in (stores, loads, both):
        assert cand["status"] == "unproven" and "not built yet" in cand["unmeasured"]
        written = Path(cand["written"])
        patched = _reapplied(original, written, "vector_add_kernel.cubin", "nvidia", "sm_90a")
        ea, eb = read_elf(original), read_elf(patched)
        for sec in ea.sections:
            if sec.name and sec.name != ".text.vector_add_kernel":
                assert sec.data == eb.section(sec.name).data, sec.name
        code_a, code_b = ea.section(".text.vector_add_kernel").data, eb.section(".text.vector_add_kernel").data
        changed = {o for o in range(0, len(code_a), 16) if code_a[o:o + 16] != code_b[o:o + 16]}
        after = nvidia_listing(patched)["vector_add_kernel"]
        assert len(changed) == cand["edits"] and set(after) == set(before)
        for o in before:
            if o in changed:
                assert after[o] == before[o].replace(".E ", ".E.EF ", 1)
                assert re.match(r"(@!?P\w+ )?(LDG|STG)\.E ", before[o]), before[o]  # predicated or not
            else:
                assert after[o] == before[o]
        assert json.loads((written / "status.json").read_text())["status"] == "unmeasured"
    # nothing left to patch the second time: every memory instruction has a policy already
    again_patch, skipped = evict_first_patch(Path(both["written"], "vector_add_kernel.cubin").read_bytes(),
                                             loads=True, stores=True)
    assert again_patch is None and len(skipped) == both["edits"]
    plain, streaming = (assemble_ptx(_PROBE.format(arch="sm_90a", lop=op, sop=op),
                                     PtxasOptions(arch="sm_90a", lineinfo=False)).cubin for op in ("", ".cs"))
    patch, _ = evict_first_patch(plain, loads=True, stores=True)
    assert patch is not None and apply_binary_patch(plain, patch, "nvidia", "sm_90a")[0] == streaming
    assert set(learn_evict_first("sm_90a")) == {"LDG", "STG"}


@pytest.mark.slow
def test_optimize_a_cuda_kernel_through_the_cpu_path(suite_cache: Path, tmp_path: Path) -> None:
    cache, records = _program(suite_cache, tmp_path, "vector_add", "cuda:90")
    report = _optimize(cache, records, tmp_path, "--budget", "1", "--spaces", "ttir")
    (kernel,) = report["kernels"]
    cuda = kernel["search"]
    assert cuda["mode"] == "unranked" and "no NVIDIA GPU" in cuda["mode_note"]
    (trial,) = cuda["trials"]
    assert trial["pipeline"].startswith("ttir(load-eviction") and trial["status"] == "equivalent"
    assert trial["verdict"] == "equivalent" and "dynamic checks passed" in trial["reason"]  # the interpreter ran
    assert not trial["measured"] and "no NVIDIA GPU" in trial["unmeasured"]
    window = kernel["hot_window"]  # no GPU: the static window, and why it is not ncu's
    assert window["level"] == "ptx" and window["source"].startswith("static") and window["why_static"] == "no NVIDIA GPU here"
    assert "| singleton |" in (Path(report["out"]) / "optimize-compiled.md").read_text()


def test_the_gpu_benchmark_says_it_needs_a_gpu_and_renders_its_tables(tmp_path: Path) -> None:
    from kstrata.tools import bench_compiled

    proc = subprocess.run([sys.executable, "-m", "kstrata.tools.bench_compiled", "--results", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "needs an NVIDIA GPU" in proc.stderr
    # the tables it writes after each model, from rows shaped as the run makes them (values made up here)
    rows = [{"model": "mlp_fp16", "share_source": "measured",
             "kernels": [{"kernel": "triton_red_0", "key": "K" * 12, "share": "61.0%", "trials": 9, "space": "options",
                          "edit": "ttgir(num-warps{n=8})", "speedup": 1.3, "range": [1.25, 1.33], "verdict": "equivalent",
                          "verdicts": {}, "baseline": "KKKK: num_warps 4",
                          "siblings": [{"config": "JJJJ: num_warps 8", "status": "beaten", "speedup": 1.1,
                                        "range": [1.05, 1.12], "time_us": 11.0, "winner_us": 10.0}]},
                         {"kernel": "triton_poi_1", "key": "L" * 12, "share": "39.0%", "trials": 9,
                          "result": "no candidate beat the original beyond the noise", "verdicts": {}}],
             "recheck": [{"kernel": "triton_red_0", "verdict": "equivalent"}],
             "end_to_end": {"speedup": 1.1, "tuned_kernels": 1, "untouched_kernels": 1, "bitwise_equal": True,
                            "max_abs_diff": 0.0, "timing": {"speedup_range": [1.05, 1.12]},
                            "autotune": [{"name": "triton_red_0", "reason": "restricted to the tuned config"}]}},
            # nothing tuned: the same code timed twice is no speedup, and stays out of the geomean
            {"model": "transformer_block_bf16", "share_source": "measured", "kernels": [], "recheck": [],
             "end_to_end": {"speedup": None, "same_code_ratio": 1.33, "tuned_kernels": 0, "untouched_kernels": 4,
                            "bitwise_equal": True, "max_abs_diff": 0.0, "timing": {"speedup_range": [1.2, 1.4]}}},
            {"model": "conv_block_fp32", "error": "RuntimeError: boom"}]
    env = {"date": "2026-12-01T00:00:00+00:00", "device": "test", "torch": "t", "triton": "t", "cuda": "t"}
    summary = bench_compiled._write(tmp_path, env, rows, final=True, seconds=60.0)
    assert summary["changed_kernels"] == 1 and summary["geomean_changed"] == pytest.approx(1.3)
    assert summary["wrong_results"] == 0 and summary["geomean_end_to_end"] == pytest.approx(1.1)
    md = (tmp_path / "compiled-bench-2026-12-01.md").read_text()
    assert "1.300x (1.250-1.330)" in md and "error: RuntimeError: boom" in md and "1.100x (1.050-1.120; 1 tuned / 1" in md
    assert "no kernel tuned: identical code, timed 1.330x" in md
    # which config the kernel was timed against, the winner against the other configs, and the autotuner's choice
    assert ("`triton_red_0`: timed against KKKK: num_warps 4; the best against the other configs: JJJJ: num_warps 8: "
            "1.100x (1.050-1.120) beaten") in md
    assert "`triton_red_0` Inductor's autotuning: restricted to the tuned config" in md


def test_optimize_a_command_records_it_first_and_says_when_nothing_ran(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "optimize", "--out", str(tmp_path / "o"), "--",
                           sys.executable, "-c", "print('no kernels here')"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "launched no Triton kernel: nothing to optimize" in proc.stderr
    assert (tmp_path / "o" / "records").is_dir() and not (tmp_path / "o" / "optimized").exists()
    bad = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "optimize", "--out", str(tmp_path / "p"), "--",
                          str(tmp_path / "missing-program"), "x"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "cannot run" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
def test_on_a_gpu_candidates_are_gated_by_the_differential_run_then_timed(suite_cache: Path, tmp_path: Path) -> None:
    from kstrata.agents.compiled.run import CompiledOptions, optimize_cache

    cache, records = _program(suite_cache, tmp_path, "softmax_online", "cuda:90")
    before = _tree_digest(cache)
    report = optimize_cache(cache, records, tmp_path / "out", CompiledOptions(
        budget=6, device="cuda", spaces=("options", "ptx"), engine_cache=str(tmp_path / "engine")))
    assert _tree_digest(cache) == before
    (kernel,) = report.kernels
    s = kernel["search"]
    assert s["mode"] == "measured" and report.share_source == "measured" and kernel["time_us"] > 0
    timed = [t for t in s["trials"] if t["measured"]]
    assert timed, s["trials"]
    assert all(t["status"] == "equivalent" and t["speedup"] > 0 and t["speedup_range"] for t in timed)
    assert not any(t["measured"] for t in s["trials"] if t["status"] in ("unproven", "failed"))
    # timed and then `different`: only by compute-sanitizer, which runs on a candidate about to win
    assert all(t["sanitizer"].startswith("failed") for t in s["trials"] if t["measured"] and t["status"] == "different")
    if s["winner"] is not None:  # a winner is deployed: an override (the suite cache knows the key) and tuned
        assert report.outputs["overrides"] and report.outputs["tuned"]
        assert min(s["trials"][s["winner"]]["speedup_range"]) > 1.0
        assert s["trials"][s["winner"]]["sanitizer"].startswith("passed")
    assert kernel["hot_window"]["level"] == "ptx"


def test_the_program_reads_launch_counts_and_skips_kernels_it_never_launched(suite_cache: Path, tmp_path: Path) -> None:
    from kstrata.agents.compiled.program import COUNTS_FILE, load_program

    cache, records = _program(suite_cache, tmp_path, "row_sum_bf16", "cuda:90")
    copy_suite_subset(suite_cache, cache, ("vector_add",), ("cuda:90",))  # in the cache, never launched
    key = next(p.name for p in cache.iterdir() if (p / "row_sum_kernel.ttir").exists())
    (records / COUNTS_FILE).parent.mkdir()
    (records / COUNTS_FILE).write_text(json.dumps({"schema": "kstrata.launch-counts/1", "kernels": [
        {"kernel": "row_sum_kernel", "cache_key": key, "launches": 7}]}))
    program = load_program(cache, records)
    by = {k.name: k for k in program.kernels}
    assert by["row_sum_kernel"].launches == 7 and by["row_sum_kernel"].record and by["row_sum_kernel"].skip is None
    assert by["vector_add_kernel"].skip and "not launched by the recorded program" in by["vector_add_kernel"].skip
    # a config that only Inductor's autotuner launched (benchmarking it) is not the program's: skipped, and why
    (records / COUNTS_FILE).write_text(json.dumps({"schema": "kstrata.launch-counts/1", "kernels": [
        {"kernel": "row_sum_kernel", "cache_key": key, "launches": 0, "benchmark_launches": 40}]}))
    skip = {k.name: k for k in load_program(cache, records).kernels}["row_sum_kernel"].skip
    assert skip and "only by Inductor's autotuner (40 benchmark launches)" in skip


def test_a_kernels_search_stops_starting_candidates_at_the_runs_time_budget(suite_cache: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The H200's first bench_compiled call ran one kernel's whole budget past `--minutes` (each GPU check takes
    tens of seconds) and was killed before writing anything: the run's deadline reaches the kernel's search."""
    import time

    import kstrata.agents.compiled.run as run
    from kstrata.agents.compiled.run import CompiledOptions, optimize_cache

    cache, records = _program(suite_cache, tmp_path, "vector_add", "cuda:90")
    seen: list[float | None] = []
    real = run.search_one

    def spy(*args: Any, **kw: Any) -> Any:
        seen.append(kw.get("deadline"))
        return real(*args, **kw)

    monkeypatch.setattr(run, "search_one", spy)
    before = time.perf_counter()
    optimize_cache(cache, records, tmp_path / "out", CompiledOptions(budget=1, minutes=0.5, device="cpu",
                                                                     spaces=("options",),
                                                                     engine_cache=str(tmp_path / "engine")))
    assert seen and seen[0] is not None and before < seen[0] <= time.perf_counter() + 30.0


def test_the_runs_winners_are_tried_first_on_the_next_kernel() -> None:
    """With one to three trials per kernel on the H200, the edit that won on the run's first kernel
    (`num-warps{n=2}` on the silu) came late or never on the others: a prior from the kernels searched
    before puts it first (the rest keeps its round-robin order)."""
    from kstrata.agents.compiled.search import SearchPrior

    cache_hints = "ptx(cache-hints{loads=cs stores=none})"
    engine = ScriptedEngine({}, {cache_hints: [1.3, 1.31, 1.29], "ttgir(num-warps{n=2})": [0.9, 0.9]})
    cfg = SearchConfig(budget=1, device="cuda")
    plain = search_kernel(engine, "b" * 64, "k", "/c/k", "cuda:90", "/l/k.json", _atoms(), cfg,  # type: ignore[arg-type]
                          mode="measured", mode_note="test")
    assert [t.pipeline for t in plain.trials] == ["ttgir(num-warps{n=2})"]  # round-robin: the options space first
    prior = SearchPrior()
    first = search_kernel(engine, "b" * 64, "k0", "/c/k0", "cuda:90", "/l/k0.json", _atoms(),  # type: ignore[arg-type]
                          SearchConfig(budget=6, device="cuda"), mode="measured", mode_note="test")
    prior.learn(first)
    assert first.best is not None and prior.for_kernel("k") == {cache_hints: pytest.approx(first.best.score)}
    second = search_kernel(engine, "b" * 64, "k", "/c/k", "cuda:90", "/l/k.json", _atoms(), cfg,  # type: ignore[arg-type]
                           mode="measured", mode_note="test", prior=prior.for_kernel("k"))
    assert [t.pipeline for t in second.trials] == [cache_hints]


@dataclasses.dataclass(frozen=True)
class _TimeRunsOut(SearchConfig):
    """A search config whose deadline passes once `engine` has built `after` candidates."""

    engine: Any = None
    after: int = 0

    def out_of_time(self) -> bool:
        return len(self.engine.built) >= self.after


def test_a_search_cut_by_its_deadline_returns_what_it_has_and_says_why() -> None:
    """On the H200 (2026-12-03) the transformer's gelu kernel began its search with 6 s of the run left: the
    singleton loop stopped at once, and choosing where annealing starts looked up singletons never tried
    (`KeyError: 'ttgir(num-warps{n=2})'`, the prior's first); the whole model's row was lost. Cut before or
    during its singletons, a search returns its trials and the reason."""
    from kstrata.agents.compiled.run import _result_line

    nw2 = "ttgir(num-warps{n=2})"
    prior = {nw2: 0.19}  # the run's winner so far: tried first
    for after in (0, 1):
        engine = ScriptedEngine({nw2: Verdict.DIFFERENT}, {})  # the one trial run is not scored: no annealing start
        cfg = _TimeRunsOut(budget=8, device="cuda", engine=engine, after=after)
        result = search_kernel(engine, "b" * 64, "k", "/c/k", "cuda:90", "/l/k.json", _atoms(), cfg,  # type: ignore[arg-type]
                               mode="measured", mode_note="test", prior=prior)
        assert [t.pipeline for t in result.trials] == [nw2][:after]
        assert result.best is None and result.stopped is not None
        assert f"the kernel's time ran out after {after} of its 4 single edits" in result.stopped
        assert ("no candidate was tried" in result.stopped) == (after == 0)
        assert result.to_json()["stopped"] == result.stopped
        assert result.stopped in _result_line(result)


def test_a_winner_must_beat_every_autotuning_config_of_its_kernel() -> None:
    """On the H200 (2026-12-03) `ttgir(num-warps{n=2})` won 1.215x on the MLP's silu kernel against the 8-warp
    config the recording ran; Inductor's autotuner had also compiled (and benchmarked) a 4-warp config, chose it
    at deployment, and end to end the win never ran (1.000x). The winner is now timed against each sibling
    config's original on that config's own record, and is a win only if it beats every one beyond the noise."""
    from kstrata.agents.compiled.run import _config_lines, _result_line
    from kstrata.agents.compiled.search import Sibling

    nw2 = "ttgir(num-warps{n=2})"
    baseline = {"words": "EIGHT: num_warps 8, grid [65536, 1, 1]", "entry": "/c/k8"}
    sibling = Sibling("s" * 64, "/l/k-1.json", {"words": "FOUR: num_warps 4, grid [32768, 1, 1]", "entry": "/c/k4"})
    for rounds, win in (([0.97, 0.96, 0.99], False), ([1.1, 1.08, 1.12], True), ([1.3, 0.99, 1.2], False)):
        engine = ScriptedEngine({}, {nw2: [1.22, 1.2, 1.25]}, siblings={"s" * 64: rounds})
        result = search_kernel(engine, "b" * 64, "k", "/c/k8", "cuda:90", "/l/k-2.json", _atoms(),  # type: ignore[arg-type]
                               SearchConfig(budget=4, device="cuda"), mode="measured", mode_note="test",
                               siblings=[sibling], baseline=baseline)
        # the best against its own config, timed against the 4-warp original on the 4-warp config's record
        assert result.compared is not None and result.trials[result.compared].pipeline == nw2
        assert engine.sibling_measured == [("s" * 64, nw2, ("/l/k-2.json",), ("/l/k-1.json",))]
        [timing] = result.siblings
        assert timing.speedup == pytest.approx(sorted(rounds)[1]) and timing.speedup_range == [min(rounds), max(rounds)]
        assert timing.status == ("beaten" if win else "not beaten")
        assert (result.best is not None) == win and result.baseline == baseline
        line = _result_line(result)
        assert ("beats all 1 other configs" in line) if win else ("not a win" in line and "FOUR" in line)
        shown = "\n".join(_config_lines(result.to_json()))
        assert "baseline: the recorded config EIGHT" in shown and "against FOUR" in shown
    # no sibling: as before, and nothing else is timed
    engine = ScriptedEngine({}, {nw2: [1.22, 1.2, 1.25]})
    alone = search_kernel(engine, "b" * 64, "k", "/c/k8", "cuda:90", "/l/k-2.json", _atoms(),  # type: ignore[arg-type]
                          SearchConfig(budget=4, device="cuda"), mode="measured", mode_note="test")
    assert alone.best is not None and alone.best.pipeline == nw2 and not engine.sibling_measured


def _scale_by_three() -> Any:
    """Another kernel named `triton_poi_scale` (other code: `* 3.0`), as a second graph of a program may have."""
    import triton
    import triton.language as tl

    @triton.jit
    def triton_poi_scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3.0 + 1.0, mask=mask)

    return triton_poi_scale


def test_the_other_autotuning_configs_of_a_kernel_are_its_siblings(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The siblings a winner must beat: the entries of the same name whose records give the same arguments and
    whose TTIR is the same apart from integer constants (the block sizes), benchmark-only configs included; not
    a kernel of the same name with other code or launched with other arguments. The search gets them, each
    registered with the engine, with the recorded config as its baseline."""
    import kstrata.agents.compiled.run as run
    from kstrata.agents.compiled.program import constants_apart, load_program
    from kstrata.agents.compiled.run import CompiledOptions, optimize_cache
    from kstrata.agents.compiled.search import KernelSearch
    from kstrata.ir.triton_layout import compile_jit

    from .test_tuned import SIG, autotuned_configs, triton_poi_scale

    entries = autotuned_configs(tmp_path)
    records = tmp_path / "records"
    n = 1 << 16
    for number, (fn, block, size) in enumerate(((_scale_by_three(), 512, n), (triton_poi_scale, 256, n // 2)), start=3):
        entry = Path(str(compile_jit(fn, SIG, "cuda:90", {"BLOCK": block}, cache_dir=tmp_path / "cache").origin))
        meta = json.loads((entry / "triton_poi_scale.json").read_text())
        args = (TensorArg("x_ptr", "float32", (size,), (1,), 0, size, False),
                TensorArg("out_ptr", "float32", (size,), (1,), 0, size, True), ScalarArg("n", "i32", size))
        LaunchRecord("triton_poi_scale", "cuda:90", (size // block, 1, 1), args, 4, meta["num_stages"],
                     meta["hash"]).save(records / f"triton_poi_scale-{number}.json")
    program = load_program(tmp_path / "cache", records)
    by_key = {k.key: k for k in program.kernels}
    w8, w4 = by_key[entries["w8"].name], by_key[entries["w4"].name]
    assert w4.skip and "only by Inductor's autotuner" in w4.skip and w4.benchmark_launches == 25
    configs, not_configs = program.siblings(w8)
    assert [(c.key, c.num_warps, c.grid, c.constants, c.launches) for c in configs] == \
        [(w4.key, 4, (64, 1, 1), ((512, 1024),), 0)]
    assert "1024 (searched config: 512)" in configs[0].words()
    assert sorted(n.split(": ", 1)[1] for n in not_configs) == [
        "launched with other arguments (another specialization, not a config)",
        "other code (its TTIR differs beyond integer constants)"]
    ttir = (entries["w8"] / "triton_poi_scale.ttir").read_text()
    assert constants_apart(ttir, ttir) == () and constants_apart(ttir, ttir.replace("2.0", "2.5")) is None
    # the search of the 8-warp config gets the 4-warp one, on its own record, registered with the engine
    seen: dict[str, Any] = {}

    def fake_search(engine: Any, base: str, name: str, entry: str, target: str, record: Any, spaces: Any, cfg: Any,
                    **kw: Any) -> KernelSearch:
        seen[entry] = kw
        return KernelSearch(name, entry, target, kw["mode"], kw["mode_note"], [], baseline=kw.get("baseline"))

    monkeypatch.setattr(run, "search_kernel", fake_search)
    report = optimize_cache(tmp_path / "cache", records, tmp_path / "out",
                            CompiledOptions(budget=1, device="cpu", engine_cache=str(tmp_path / "engine")))
    [sibling] = seen[str(entries["w8"])]["siblings"]
    assert sibling.record == w4.record and sibling.config["key"] == w4.key and sibling.config["entry"] == w4.entry
    assert seen[str(entries["w8"])]["baseline"]["num_warps"] == 8
    row = next(k for k in report.kernels if k["key"] == w8.key)
    assert row["search"]["baseline"]["grid"] == [128, 1, 1]
    assert "baseline: the recorded config" in (tmp_path / "out" / "optimize-compiled.md").read_text()


def test_a_sibling_config_is_timed_on_its_own_launch_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`Engine.measure(..., original_launches=[R])`: the timing job gets the other config's record for the original
    side (another grid), the session's memo keeps the two timings apart, and outputs that differ between two
    configs (another summation order) are no suspicion; they are between a candidate and its own original."""
    from types import SimpleNamespace

    import kstrata.agents.engine as engine_module
    from kstrata.agents.engine import Engine, suspicious_reasons

    payloads: list[dict[str, Any]] = []

    def run(target: str, payload: dict[str, Any], **kw: Any) -> Any:
        payloads.append(payload)
        return SimpleNamespace(ok=True, value={"time_before_us": 11.0, "time_after_us": 10.0, "speedup": 1.1,
                                               "outputs_equal": False, "original_record": payload["original_launch"]})

    monkeypatch.setattr(engine_module, "measurement_unavailable", lambda target: None)
    (tmp_path / "k4").mkdir()
    for name in ("k8", "k4"):
        _record(tmp_path, name, None)
    with Engine(tmp_path / "engine") as engine:
        monkeypatch.setattr(engine.pool, "run", run)
        base = engine.add_kernel(tmp_path / "k4")
        built = BuildResult("c" * 32, "changed", entry=str(tmp_path / "built"), target="cuda:90", binary_digest="d" * 64)
        own = engine.measure(base, built, [tmp_path / "k8.json"])
        other = engine.measure(base, built, [tmp_path / "k8.json"], original_launches=[tmp_path / "k4.json"])
        assert engine.measure(base, built, [tmp_path / "k8.json"], original_launches=[tmp_path / "k4.json"]) is other
    assert [p["original_launch"] for p in payloads] == [None, str(tmp_path / "k4.json")]
    assert [p["launch"] for p in payloads] == [str(tmp_path / "k8.json")] * 2
    assert other.status == "timed" and other.suspicious == ()
    assert any("wrote different bytes" in r for r in own.suspicious)  # against its own original it stays suspicious
    assert suspicious_reasons({"outputs_equal": False}) and not suspicious_reasons({"outputs_equal": False,
                                                                                   "original_record": "k4.json"})


def test_different_bytes_within_the_candidates_declared_tolerance_are_no_suspicion(tmp_path: Path,
                                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate whose passes declare a tolerance (`num-warps` on a reduction: another summation order) writes
    other bytes than its original on the same replay: expected, not a suspicion, when `Engine.measure` is told
    the tolerance (the compiled search passes its trial's). The timing is the binary's: one timing job for both
    calls, and the call without the tolerance still flags it (H100, 2026-12-08: level1/19's `num-warps{n=8}`,
    equivalent and 1.105x, was refused as suspicious because the search did not pass it)."""
    from types import SimpleNamespace

    import kstrata.agents.engine as engine_module
    from kstrata.agents.engine import Engine

    payloads: list[dict[str, Any]] = []

    def run(target: str, payload: dict[str, Any], **kw: Any) -> Any:
        payloads.append(payload)
        return SimpleNamespace(ok=True, value={"time_before_us": 11.0, "time_after_us": 10.0, "speedup": 1.1,
                                               "outputs_equal": False})

    monkeypatch.setattr(engine_module, "measurement_unavailable", lambda target: None)
    (tmp_path / "k8").mkdir()
    _record(tmp_path, "k8", None)
    with Engine(tmp_path / "engine") as engine:
        monkeypatch.setattr(engine.pool, "run", run)
        base = engine.add_kernel(tmp_path / "k8")
        built = BuildResult("c" * 32, "changed", entry=str(tmp_path / "built"), target="cuda:90", binary_digest="d" * 64)
        declared = engine.measure(base, built, [tmp_path / "k8.json"], declared_tolerance="ulp=4,rtol=1e-05,atol=1e-06")
        bare = engine.measure(base, built, [tmp_path / "k8.json"])
    assert len(payloads) == 1
    assert declared.status == "timed" and declared.suspicious == () and declared.speedup == 1.1
    assert declared.detail["declared_tolerance"] == "ulp=4,rtol=1e-05,atol=1e-06"
    assert any("wrote different bytes" in r for r in bare.suspicious) and "declared_tolerance" not in bare.detail


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
def test_on_a_gpu_a_variant_is_timed_against_another_config_on_its_own_record(tmp_path: Path) -> None:
    """The GPU twin: the num-warps-2 variant of the 8-warp config (grid 128) timed against the 4-warp config's
    original on the 4-warp record (grid 64); both write the same bytes (a pointwise kernel)."""
    from kstrata.agents.engine import Candidate, Engine, PipelineEdit

    from .test_tuned import autotuned_configs

    entries = autotuned_configs(tmp_path)
    records = {1: tmp_path / "records" / "triton_poi_scale-1.json", 2: tmp_path / "records" / "triton_poi_scale-2.json"}
    with Engine(tmp_path / "engine") as engine:
        built = engine.build(Candidate(engine.add_kernel(entries["w8"]), "ttgir", PipelineEdit("ttgir(num-warps{n=2})")))
        m = engine.measure(engine.add_kernel(entries["w4"]), built, [records[1]], original_launches=[records[2]])
    assert m.status == "timed", m.reason
    assert m.detail["grid"] == [128, 1, 1] and m.detail["original_grid"] == [64, 1, 1]
    assert m.detail["outputs_equal"] is True and m.speedup and m.speedup > 0


def test_compute_sanitizer_runs_on_the_candidate_about_to_win_before_it_is_accepted() -> None:
    """A compiled trial took 20-50 s on the H200 (build, gate, timing), and most kernels got one or two. The gate of
    every candidate keeps redzones, the differential and determinism runs; compute-sanitizer (a child process
    started under memcheck) runs on the candidate about to win, before it is accepted, never skipped for it: one
    that fails is `different`, and the next best is considered (and sanitized). `sanitize="every"` keeps it in
    every gate."""
    nw8, nw2 = "ttgir(num-warps{n=8})", "ttgir(num-warps{n=2})"
    speedups = {nw8: [1.30, 1.25, 1.32], nw2: [1.20, 1.15, 1.22]}
    engine = ScriptedEngine({}, speedups)
    engine.sanitizer_fails = {nw8}
    result = search_kernel(engine, "b" * 64, "k", "/c/k", "cuda:90", "/l/k.json", _atoms(),  # type: ignore[arg-type]
                           SearchConfig(budget=4, device="cuda"), mode="measured", mode_note="test")
    by = {t.pipeline: t for t in result.trials}
    gates = [g for g in engine.sanitizer if g[1] == "none"]
    assert gates == [(t.pipeline, "none") for t in result.trials]  # every gate without the sanitizer
    # the first trial to become the best (nw2) is checked under the sanitizer at once, inside the search's time;
    # the final best (nw8) after the search: it fails, and nw2, accepted already, wins without a second check
    assert [g for g in engine.sanitizer if g[1] != "none"] == [(nw2, "auto"), (nw8, "auto")]
    assert engine.sanitizer.index((nw2, "auto")) == engine.sanitizer.index((nw2, "none")) + 1
    assert engine.sanitizer[-1] == (nw8, "auto")
    assert by[nw8].status == "different" and by[nw8].sanitizer and by[nw8].sanitizer.startswith("failed")
    assert "Invalid __global__ read" in by[nw8].reason and result.best is by[nw2]
    assert by[nw2].sanitizer and by[nw2].sanitizer.startswith("passed") and "sanitize" in by[nw2].phase_seconds
    assert all(t.sanitizer == "deferred" for t in result.trials if t.pipeline not in (nw8, nw2))
    # the gates left the interpreter runs of TTIR/TTGIR edits to the same check (the GPU differential run checked
    # every binary); the acceptance checks ran them
    assert [i for i, (_, tool) in zip(engine.interpreter, engine.sanitizer, strict=True) if tool == "none"] == \
        [False] * len(result.trials)
    assert [i for i, (_, tool) in zip(engine.interpreter, engine.sanitizer, strict=True) if tool != "none"] == [True, True]
    assert by[nw2].interpreter is not None and by[nw2].interpreter.startswith("passed")
    # both in every gate, as before: the winner is not checked again
    every = ScriptedEngine({}, speedups)
    again = search_kernel(every, "b" * 64, "k", "/c/k", "cuda:90", "/l/k.json", _atoms(),  # type: ignore[arg-type]
                          SearchConfig(budget=4, device="cuda", sanitize="every", interpreter="every"),
                          mode="measured", mode_note="test")
    assert every.sanitizer == [(t.pipeline, "auto") for t in again.trials] and again.best is not None
    assert every.interpreter == [True] * len(again.trials)
    # on the CPU nothing changes: no GPU run, no sanitizer
    cpu = ScriptedEngine({}, {})
    search_kernel(cpu, "b" * 64, "k", "/c/k", "cuda:90", "/l/k.json", _atoms(), SearchConfig(budget=3),  # type: ignore[arg-type]
                  mode="unranked", mode_note="test")
    assert {tool for _, tool in cpu.sanitizer} == {None}


class _SlowAcceptance(ScriptedEngine):
    """An acceptance check (compute-sanitizer asked for) moves `clock` on by `seconds`; nothing else takes time."""

    seconds = 0.0
    clock: list[float] | None = None

    def check(self, base: str, built: BuildResult, launches: Any, **kw: Any) -> CheckResult:
        if kw.get("verify") is not None and kw["verify"].sanitizer != "none":
            if self.clock is not None:
                self.clock[0] += self.seconds
            result = super().check(base, built, launches, **kw)
            slow = Evidence("compute-sanitizer memcheck", "cubin", "pass", "", self.seconds)
            return CheckResult(result.verdict, result.reason, (*result.evidence, slow))
        return super().check(base, built, launches, **kw)


def test_the_search_keeps_back_the_time_of_the_final_winners_acceptance_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """On gap task 01 (H100, 2026-12-07) the winner's acceptance check (compute-sanitizer and the interpreter at
    the published size) took 194 s after a search of 205 s, and the benchmark's re-check and end to end were cut
    by the call's limit. The first trial to become the best is checked at once, inside the kernel's time, and
    what it took is kept back for the final best's check: the search stops starting candidates that much
    before its deadline while its best is unchecked. (The search's clock is the test's: only the acceptance
    checks move it.)"""
    from types import SimpleNamespace

    import kstrata.agents.compiled.search as search_module

    clock = [0.0]
    monkeypatch.setattr(search_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    nw8, nw2 = "ttgir(num-warps{n=8})", "ttgir(num-warps{n=2})"
    engine = _SlowAcceptance({}, {nw2: [1.20, 1.15, 1.22], nw8: [1.30, 1.25, 1.32]})
    engine.seconds, engine.clock = 100.0, clock
    cfg = SearchConfig(budget=8, device="cuda", deadline=180.0)
    result = search_kernel(engine, "b" * 64, "k", "/c/k", "cuda:90", "/l/k.json", _atoms(), cfg,  # type: ignore[arg-type]
                           mode="measured", mode_note="test")
    by = {t.pipeline: t for t in result.trials}
    # nw2 checked at once (100 s); then nw8 became the best, unchecked, with 80 s to the deadline, less than the
    # 100 s kept back: no more candidates (without the reserve all 8 would run, each taking no time)
    assert [t.pipeline for t in result.trials] == [nw2, "ttir(load-eviction{policy=evict_first})",
                                                   "ptx(cache-hints{loads=cs stores=none})", nw8]
    assert result.stopped and "ran out" in result.stopped
    assert result.best is by[nw8] and by[nw8].sanitizer and by[nw8].sanitizer.startswith("passed")
    assert clock[0] == 200.0  # nw8's check ran after the deadline: the one it was kept back for
    # where the acceptance check's time went, by kind of check
    assert by[nw2].phase_seconds["sanitize"] == 100.0 and by[nw2].phase_seconds["sanitize/compute-sanitizer"] == 100.0
    # with the deadline far enough, the search goes on to its budget
    clock[0] = 0.0
    far = search_kernel(_SlowAcceptance({}, engine.speedups), "b" * 64, "k", "/c/k", "cuda:90", "/l/k.json",  # type: ignore[arg-type]
                        _atoms(), SearchConfig(budget=8, device="cuda", deadline=1000.0), mode="measured",
                        mode_note="test")
    assert far.stopped is None and len(far.trials) > 4


def test_past_the_deadline_only_one_acceptance_check_runs() -> None:
    """After the deadline one acceptance check may run (the time kept back for it); a next best still unchecked is
    passed over, with the reason, for one that was accepted already."""
    from kstrata.agents.compiled.search import KernelSearch, Trial, _accepted

    def trial(pipeline: str, speedup: float, sanitizer: str) -> Trial:
        t = Trial(pipeline, ["options"], "ttgir", None, "singleton", status="equivalent", verdict="equivalent")
        t.measured, t.speedup, t.speedup_range, t.noise = True, speedup, [speedup - 0.01, speedup + 0.01], 0.02
        t.sanitizer = t.interpreter = sanitizer
        return t

    accepted, failing, unchecked = "ttgir(num-warps{n=2})", "ttgir(num-warps{n=8})", "ttgir(num-warps{n=4})"
    result = KernelSearch("k", "/c/k", "cuda:90", "measured", "test", [],
                          [trial(accepted, 1.10, "passed: compute-sanitizer memcheck pass"),
                           trial(failing, 1.30, "deferred"), trial(unchecked, 1.20, "deferred")])
    engine = ScriptedEngine({}, {})
    engine.sanitizer_fails = {failing}
    builds = {t.pipeline: BuildResult(t.pipeline, "changed", entry=f"/builds/{t.pipeline}") for t in result.trials}
    late = SearchConfig(device="cuda", deadline=time.perf_counter() - 1.0)
    assert _accepted(engine, "b" * 64, result, builds, "/l/k.json", (), late) == 0  # type: ignore[arg-type]
    assert engine.sanitizer == [(failing, "auto")]  # the one late check; the next best was not checked
    assert result.trials[1].status == "different"
    assert "did not fit the kernel's time" in result.trials[2].reason and result.trials[2].status == "equivalent"
    # before the deadline the next best is checked as before
    result.trials[1].status, result.trials[1].sanitizer, result.trials[1].interpreter = "equivalent", "deferred", "deferred"
    result.trials[2].reason = ""
    engine.sanitizer.clear()
    assert _accepted(engine, "b" * 64, result, builds, "/l/k.json", (), SearchConfig(device="cuda")) == 2  # type: ignore[arg-type]
    assert engine.sanitizer == [(failing, "auto"), (unchecked, "auto")]


def test_each_kernel_gets_its_share_of_the_time_left() -> None:
    """One kernel took the whole run (on the H200 the transformer's six other kernels, 78% of its kernel
    time, got nothing): a kernel's search stops starting candidates at its share of the time left among the
    kernels left; unused time goes to the next ones; without shares, equal parts."""
    from kstrata.agents.compiled.run import kernel_deadline

    assert kernel_deadline(100.0, 200.0, [0.5, 0.3, 0.2]) == pytest.approx(150.0)
    assert kernel_deadline(130.0, 200.0, [0.3, 0.2]) == pytest.approx(130.0 + 70.0 * 0.6)  # the first left 20 s
    assert kernel_deadline(100.0, 200.0, [None, 0.2]) == pytest.approx(150.0)
    assert kernel_deadline(250.0, 200.0, [0.5]) == pytest.approx(250.0)  # past the run's deadline: nothing left


def test_a_kernel_near_its_memory_bound_gets_less_of_the_time(tmp_path: Path) -> None:
    """The time is split by what a kernel could still save: its share times the part of its time above the
    bytes of its buffers at the copy bandwidth (at least MIN_HEADROOM); unknown headroom leaves the share."""
    from kstrata.agents.compiled.run import (
        MIN_HEADROOM,
        CompiledOptions,
        CompiledReport,
        _headroom,
        headroom_weights,
        kernel_deadline,
        kernel_sol,
    )

    def record(name: str, n: int) -> str:
        x = TensorArg("in_ptr0", "float32", (n,), (1,), 0, n, False)
        y = TensorArg("out_ptr0", "float32", (n,), (1,), 0, n, True)
        return str(LaunchRecord(name, "cuda:90", (n // 1024, 1, 1), (x, y, ScalarArg("xnumel", "i32", n)))
                   .save(tmp_path / f"{name}.json"))

    n = 1 << 24  # 64 MiB in, 64 MiB out: 33.6 us at 4 TB/s
    near = ProgramKernel("e1", "k1", "near", "cuda:90", record("near", n), time_us=35.0, share=0.5)
    far = ProgramKernel("e2", "k2", "far", "cuda:90", record("far", n), time_us=4 * 2 * n * 4 / 4.0e12 * 1e6, share=0.5)
    blind = ProgramKernel("e3", "k3", "blind", "cuda:90", None, time_us=10.0, share=0.2)
    assert kernel_sol(near, 4.0e12) == pytest.approx(2 * n * 4 / 4.0e12 * 1e6 / 35.0)
    assert kernel_sol(far, None) is None and kernel_sol(blind, 4.0e12) is None
    program = Program(str(tmp_path), None, [near, far, blind])
    note = _headroom(program, CompiledOptions(bandwidth=4.0e12), "cuda")
    assert "4.00 TB/s" in note and near.sol == pytest.approx(0.959, abs=1e-3) and far.sol == pytest.approx(0.25)
    w = headroom_weights([near, far, blind])
    assert w == pytest.approx([0.5 * MIN_HEADROOM, 0.5 * 0.75, 0.2])  # `blind` keeps its share
    # the near-bound kernel first: it gets its weighted part of the time, the far one most of what is left
    assert kernel_deadline(0.0, 100.0, w) == pytest.approx(100.0 * 0.05 / (0.05 + 0.375 + 0.2))
    assert "no bandwidth" in _headroom(program, CompiledOptions(), "cuda")
    report = CompiledReport("c", None, "o", "cuda", True, "measured", "")
    report.kernels = [{**far.to_json(), "result": "r", "search": {"mode": "search", "mode_note": "", "trials": []}}]
    assert "| 50.0% (memory SOL 25.0%) |" in report.to_markdown()


def test_the_end_to_end_comparison_uses_inputs_inductors_buffers_do_not_hold() -> None:
    """End to end, the tuned model ran right after Inductor's on the same inputs: the caching allocator hands it
    the blocks Inductor's intermediates just freed, holding their correct values, so a tuned kernel leaving
    elements unwritten would still compare equal. The comparison now runs on a fresh draw of the floating
    inputs (same shape, dtype and spread), the tuned model first."""
    import torch

    from kstrata.tools.gpu_torch_backend import redrawn

    x, idx = torch.randn(64, 32, dtype=torch.float16) * 3 + 1, torch.arange(5)
    a, b = redrawn((x, idx, 2.0)), redrawn((x, idx, 2.0))
    assert a[0].shape == x.shape and a[0].dtype == x.dtype and not torch.equal(a[0], x)
    assert torch.equal(a[0], b[0])  # seeded
    assert a[1] is idx and a[2] == 2.0
    assert abs(float(a[0].float().std()) - float(x.float().std())) < 0.3


class ConfigsEngine(ScriptedEngine):
    """A scripted engine over real cache entries: each compiled config is a base named by its cache key, with a
    time per launch (`times`); an edit runs `speedups[spec]` faster than the base it was built on, and any two
    binaries compare by their times, whichever records they run on (three rounds, 1% apart)."""

    def __init__(self, times: dict[str, float], speedups: dict[str, float]) -> None:
        super().__init__({}, {})
        self.times, self.speedup_of = times, speedups
        self.bases: list[str] = []  # the base of every candidate built
        #: (original base, the other config's base, the launches, the original's launches) of each config timing
        self.config_measured: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = []

    def add_kernel(self, entry: Any, override_key: str | None = None) -> str:
        return Path(entry).name

    def as_build(self, base: str) -> BuildResult:
        return BuildResult(f"config-{base}", "changed", entry=f"/builds/config:{base}", binary_digest=base)

    def build(self, cand: Any, env: Any = None) -> BuildResult:
        self.bases.append(cand.base)
        return super().build(cand, env)

    def measure(self, base: str, built: BuildResult, launches: Any, budget: Any,
                original_launches: Any = (), declared_tolerance: str | None = None) -> Measurement:
        spec = built.entry.removeprefix("/builds/")  # type: ignore[union-attr]
        self.tolerances[spec] = declared_tolerance
        if spec.startswith("config:"):
            after = self.times[spec.removeprefix("config:")]
            self.config_measured.append((base, spec.removeprefix("config:"), tuple(launches), tuple(original_launches)))
        else:
            after = self.times[self.bases[-1]] / self.speedup_of.get(spec, 1.0)
            (self.sibling_measured if original_launches else self.measured).append(
                (base, spec, tuple(launches), tuple(original_launches)) if original_launches else spec)  # type: ignore[arg-type]
        s = self.times[base] / after
        return Measurement("timed", "", self.times[base], after, s, {"speedup_range": [s * 0.99, s * 1.01],
                                                                      "spread_before_pct": 1.0, "spread_after_pct": 1.0})


def _configs_program(tmp_path: Path) -> tuple[Any, dict[str, Path]]:
    from kstrata.agents.compiled.program import load_program

    from .test_tuned import autotuned_configs

    entries = autotuned_configs(tmp_path)  # the program ran the 8-warp config; the autotuner also timed the 4-warp one
    return load_program(tmp_path / "cache", tmp_path / "records"), entries


def test_the_search_starts_from_a_faster_config_than_the_recorded_one(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """On the H200 (2026-12-03) three pointwise kernels ran Inductor's 8-warp config (XBLOCK 512) while the 4-warp
    config it had also compiled and benchmarked (XBLOCK 1024) was faster on its own record: `num-warps{n=2}` won
    1.065-1.227x on the 8-warp config and lost to the 4-warp one. Each other config's original is now timed
    against the recorded one first, and the search starts from the fastest: its edits apply to that config's
    binary and run on its record, the recorded config is one a winner must beat, and with no winning edit the
    faster config itself is the result (a config choice) that the tuned database records and names."""
    import kstrata.agents.compiled.run as run
    from kstrata.agents.compiled.run import CompiledOptions, _result_line, _write_outputs, search_one
    from kstrata.agents.tuned import TunedLookup
    from kstrata.ir.triton_layout import load_any

    monkeypatch.setattr(run, "measurement_unavailable", lambda target: None)  # timed, as on a GPU
    program, entries = _configs_program(tmp_path)
    by_key = {k.key: k for k in program.kernels}
    w8, w4 = by_key[entries["w8"].name], by_key[entries["w4"].name]
    opts = CompiledOptions(budget=3, device="cuda", spaces=("options",))
    engine = ConfigsEngine({w8.key: 10.0, w4.key: 7.0}, {})
    result = search_one(engine, w8, "cuda", opts, lambda _m: None, program=program)  # type: ignore[arg-type]
    # the 4-warp original timed once against the 8-warp one, each on its own record
    assert engine.config_measured[0] == (w8.key, w4.key, (w4.record,), (w8.record,))
    [timing] = result.configs
    assert timing.status == "faster" and timing.speedup == pytest.approx(10 / 7) and timing.config["key"] == w4.key
    # every candidate edits the 4-warp config and runs on its record; num-warps 4 is no edit of it any more
    assert engine.bases and set(engine.bases) == {w4.key}
    assert result.entry == str(entries["w4"]) and result.record == w4.record and result.started_from is not None
    assert result.started_from["key"] == w4.key and result.baseline is not None and result.baseline["key"] == w8.key
    assert "ttgir(num-warps{n=4})" not in [t.pipeline for t in result.trials]
    # no edit beat it: the 4-warp config as it is, against the recorded one (the timing before the search, reused)
    assert result.best is None and result.choice is not None
    assert result.choice.edit == f"config({w4.key[:12]})" and result.choice.speedup == pytest.approx(10 / 7)
    assert [(t.config["key"], t.status) for t in result.choice.siblings] == [(w8.key, "beaten")]
    line = _result_line(result)
    assert line.startswith(f"config choice `config({w4.key[:12]})`") and "1.429x" in line and "over the recorded" in line
    # the tuned database names the config to deploy (keyed by its content) and the recorded one it beat
    out = tmp_path / "out"
    outputs = _write_outputs(tmp_path / "cache", out, program, {w8.entry: result}, engine, opts, load_any)  # type: ignore[arg-type]
    assert outputs["overrides"] == [] and outputs["patched_cache"] is None  # nothing to override: Inductor's binary
    lookup = TunedLookup(out / "tuned")
    [(_, record)] = lookup.db.find("triton_poi_scale")
    assert record.config_choice and record.edit == result.choice.edit and record.spaces == ["config"]
    assert record.config is not None and record.config["key"] == w4.key and record.beats_siblings
    assert record.recorded_config is not None and record.recorded_config["key"] == w8.key
    assert record.speedup == pytest.approx(10 / 7) and record.speedup_vs_recorded == pytest.approx(10 / 7)
    meta = {tag: json.loads((entries[tag] / "triton_poi_scale.json").read_text()) for tag in entries}
    ttir = {tag: (entries[tag] / "triton_poi_scale.ttir").read_text() for tag in entries}
    variant, _ = lookup.match("triton_poi_scale", "cuda:90", ttir["w4"], meta["w4"])
    assert variant is not None and variant.record == record
    other, why = lookup.match("triton_poi_scale", "cuda:90", ttir["w8"], meta["w8"])
    assert other is None and why.startswith("another autotuning config of a tuned kernel")

    # an edit of the faster config that wins: a win over it (the best config) and, timed too, over the recorded one
    nw2 = "ttgir(num-warps{n=2})"
    engine = ConfigsEngine({w8.key: 10.0, w4.key: 7.0}, {nw2: 1.2})
    result = search_one(engine, w8, "cuda", opts, lambda _m: None, program=program)  # type: ignore[arg-type]
    assert result.best is not None and result.best.pipeline == nw2 and result.choice is None
    assert result.best.speedup == pytest.approx(1.2)  # over the 4-warp original, on its record
    recorded = result.against_recorded()
    assert recorded is not None and recorded.status == "beaten" and recorded.speedup == pytest.approx(10 / (7 / 1.2))
    assert engine.sibling_measured == [(w8.key, nw2, (w4.record,), (w8.record,))]
    line = _result_line(result)
    assert "on the faster config" in line and "1.714x over the recorded config" in line


def test_the_search_stays_on_the_recorded_config_when_no_other_is_faster(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A sibling config timed slower (or within the noise) leaves the search on the recorded config, as before;
    so does the task optimizer's `ir` space (`best_config=False`: it deploys into the recorded config's kernel),
    which times nothing before its search."""
    import kstrata.agents.compiled.run as run
    from kstrata.agents.compiled.run import CompiledOptions, search_one

    monkeypatch.setattr(run, "measurement_unavailable", lambda target: None)
    program, entries = _configs_program(tmp_path)
    by_key = {k.key: k for k in program.kernels}
    w8, w4 = by_key[entries["w8"].name], by_key[entries["w4"].name]
    for w4_us in (13.0, 9.9):  # slower; 1% faster, inside the noise
        engine = ConfigsEngine({w8.key: 10.0, w4.key: w4_us}, {})
        result = search_one(engine, w8, "cuda", CompiledOptions(budget=2, device="cuda", spaces=("options",)),  # type: ignore[arg-type]
                            lambda _m: None, program=program)
        [timing] = result.configs
        assert timing.status == "not faster" and timing.speedup == pytest.approx(10 / w4_us)
        assert set(engine.bases) == {w8.key} and result.entry == str(entries["w8"]) and result.record == w8.record
        assert result.started_from is None and result.choice is None and result.against_recorded() is None
    engine = ConfigsEngine({w8.key: 10.0, w4.key: 7.0}, {})
    result = search_one(engine, w8, "cuda", CompiledOptions(budget=2, device="cuda", spaces=("options",),  # type: ignore[arg-type]
                                                            best_config=False), lambda _m: None, program=program)
    assert not engine.config_measured and result.configs == [] and set(engine.bases) == {w8.key}
    # on the CPU nothing is timed, and the search stays where it was
    engine = ConfigsEngine({w8.key: 10.0, w4.key: 7.0}, {})
    result = search_one(engine, w8, "cpu", CompiledOptions(budget=2, device="cpu", spaces=("options",)),  # type: ignore[arg-type]
                        lambda _m: None, program=program)
    assert not engine.config_measured and result.started_from is None and set(engine.bases) == {w8.key}


def test_each_kind_of_kernel_tries_the_edits_most_likely_to_matter_first() -> None:
    """With one to three trials per kernel on the H200 the round-robin order decided what was tried: LayerNorm
    reductions got `max-registers` first (0.63x) while `num-warps{n=8}` had won 1.23-1.33x on them before. A
    reduction now tries more warps first, a pointwise kernel fewer warps and then the cache-policy edits; what won
    on the run's kernels of the same kind still comes before them, and a pointwise win is not a reduction's prior."""
    from kstrata.agents.compiled.search import SearchPrior
    from kstrata.agents.compiled.spaces import kernel_kind

    nw2, nw8 = "ttgir(num-warps{n=2})", "ttgir(num-warps{n=8})"
    cache_hints, eviction = "ptx(cache-hints{loads=cs stores=none})", "ttir(load-eviction{policy=evict_first})"
    assert [kernel_kind(n) for n in ("triton_poi_fused_silu_0", "triton_per_fused_native_layer_norm_1",
                                     "triton_red_fused_sum_2", "k")] == ["pointwise", "reduction", "reduction", "other"]

    def first(name: str, prior: dict[str, float] | None = None) -> list[str]:
        engine = ScriptedEngine({}, {nw2: [1.2, 1.2, 1.2]})
        result = search_kernel(engine, "b" * 64, name, "/c/k", "cuda:90", "/l/k.json", _atoms(),  # type: ignore[arg-type]
                               SearchConfig(budget=6, device="cuda"), mode="measured", mode_note="test", prior=prior)
        return [t.pipeline for t in result.trials if t.phase == "singleton"]

    assert first("triton_per_fused_native_layer_norm_1")[0] == nw8
    assert first("triton_poi_fused_silu_0")[:3] == [nw2, cache_hints, nw8]
    assert first("k")[:3] == [nw2, eviction, cache_hints]  # no kind: the round-robin order over the spaces
    prior = SearchPrior()
    won = search_kernel(ScriptedEngine({}, {eviction: [1.3, 1.3, 1.3]}), "b" * 64, "triton_poi_fused_gelu_5",  # type: ignore[arg-type]
                        "/c/k", "cuda:90", "/l/k.json", _atoms(), SearchConfig(budget=6, device="cuda"),
                        mode="measured", mode_note="test")
    prior.learn(won)
    assert won.best is not None and won.best.pipeline == eviction
    assert first("triton_poi_fused_silu_0", prior.for_kernel("triton_poi_fused_silu_0"))[0] == eviction
    assert prior.for_kernel("triton_per_fused_native_layer_norm_1") == {}
    assert first("triton_per_fused_native_layer_norm_1", prior.for_kernel("triton_per_x"))[0] == nw8


@pytest.mark.parametrize("gpu", [True, False])
def test_the_gate_leaves_interpreter_runs_to_the_winners_check_only_when_the_gpu_checks_the_binary(
        gpu: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the H200 a TTIR edit's gate took 42.6 s (7 dynamic checks, 4 of them the CPU interpreter's) and a PTX
    edit's 8.8 s (3). `verify(..., interpreter=False)` plans no interpreter run when the GPU differential run checks
    the rebuilt binary, and says so; without a GPU run the interpreter is the dynamic evidence and still runs."""
    from types import SimpleNamespace

    import kstrata.backends.verify as verify_module
    from kstrata.backends.dynamic import Outcome
    from kstrata.backends.verify import VerifyReport, _dynamic
    from kstrata.ir.target import Target

    kinds: list[str] = []
    monkeypatch.setattr(verify_module, "_gpu_available", lambda backend: gpu)
    monkeypatch.setattr(verify_module, "run_jobs", lambda jobs, timeout, **kw: kinds.extend(j["kind"] for j in jobs))

    def parallel(jobs: list[dict[str, Any]], timeout: float, workers: int, on_outcome: Any = None) -> list[Outcome]:
        kinds.extend(j["kind"] for j in jobs)  # the interpreter's jobs (in parallel children when large)
        outs = [Outcome("timeout", None, {}) for _ in jobs]
        for k, outcome in enumerate(outs):
            on_outcome(k, outcome)
        return outs

    monkeypatch.setattr(verify_module, "run_jobs_parallel", parallel)
    record = LaunchRecord.load(_record(tmp_path, "k", None))
    bundle = SimpleNamespace(params=(SimpleNamespace(name="x", is_pointer=True, type="*fp32"),
                                     SimpleNamespace(name="y", is_pointer=True, type="*fp32"),
                                     SimpleNamespace(name="n", is_pointer=False, type="i32")),
                             target=Target.parse("cuda:90"))
    for interpreter in (True, False):
        kinds.clear()
        report = VerifyReport("k", "cuda:90", ["ttgir", "llir", "ptx", "cubin"], [])
        _dynamic(report, bundle, bundle, record, 1, "auto", None, "none", 60.0, None, None,  # type: ignore[arg-type]
                 interpreter=interpreter)
        skipped = gpu and not interpreter
        assert ("interp" in kinds) != skipped and ("gpu" in kinds) == gpu
        assert any("interpreter runs of ttgir left to a later check" in n for n in report.notes) == skipped

