"""The candidate engine: candidate keys, the worker pool's verdicts on crashes and hangs, the GPU queue,
the one timer's A/B interleaving and early stop, build caching and binary dedupe, run-passes over a plain
Triton cache (the patched cache Triton loads without compiling), and validated resume state."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from kstrata.agents.engine import (
    Budget,
    Candidate,
    Engine,
    EngineError,
    ModelNewEdit,
    OptionsEdit,
    PipelineEdit,
    Provenance,
    Verdict,
    WorkerPool,
)
from kstrata.agents.run_passes import run_passes
from kstrata.backends.timing import CudaClock, interleaved_ab, time_gpu
from kstrata.ir.errors import KstrataError

from .conftest import copy_suite_subset, has_cuda

DIGEST = "ab" * 32


# ---------------------------------------------------------------------------------------------------
# Candidates
# ---------------------------------------------------------------------------------------------------
def test_candidate_is_a_content_addressed_value() -> None:
    a = Candidate(DIGEST, "ptx", PipelineEdit("ptx(cache-hints)"), provenance=Provenance("p1", None, "ir"))
    b = Candidate(DIGEST, "ptx", PipelineEdit("ptx(cache-hints)"), provenance=Provenance("p2", "k0", "asm"))
    assert a == b and hash(a) == hash(b) and a.key == b.key  # who proposed it does not change the build
    assert len({a, b}) == 1
    assert Candidate(DIGEST, "ptx", PipelineEdit("ptx(ld-nc)")).key != a.key
    assert Candidate(DIGEST, "ptx", PipelineEdit("ptx(cache-hints)"), tolerance="ulp=2").key != a.key
    assert Candidate("cd" * 32, "ptx", PipelineEdit("ptx(cache-hints)")).key != a.key
    versions = dict(a.identity()["versions"])
    assert {"kstrata", "triton", "ptxas", "llvm-mc"} <= set(versions)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.level = "ttir"  # type: ignore[misc]
    assert Candidate.from_json(json.loads(json.dumps(a.to_json()))) == a
    opts = Candidate(DIGEST, "options", OptionsEdit.of({"num_warps": 8, "num_stages": 2}))
    assert Candidate.from_json(opts.to_json()).key == opts.key


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"level": "sass"}, "unknown candidate level"),
    ({"policy": "fp64"}, "unknown precision policy"),
    ({"level": "ttir", "edit": ModelNewEdit("class ModelNew: ...")}, "works at task"),
])
def test_candidate_refuses_what_cannot_be_built(kwargs: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {"base": DIGEST, "level": "ptx", "edit": PipelineEdit("ptx(cache-hints)"), **kwargs}
    with pytest.raises(EngineError, match=message):
        Candidate(**fields)


# ---------------------------------------------------------------------------------------------------
# The worker pool
# ---------------------------------------------------------------------------------------------------
@pytest.fixture
def jobs_module(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "enginejobs.py").write_text(textwrap.dedent("""
        import os, signal, time

        def echo(p):
            return {"got": p, "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}

        def raises(p):
            raise ValueError("bad candidate " + str(p))

        def segfault(p):
            os.kill(os.getpid(), signal.SIGSEGV)

        def hang(p):
            time.sleep(600)

        def span(p):
            start = time.time()
            time.sleep(p)
            return [start, time.time()]
    """))
    return {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_a_crash_a_hang_and_an_exception_are_verdicts(jobs_module: dict[str, str]) -> None:
    pool = WorkerPool(cpu_workers=2)
    try:
        futures = {name: pool.submit(f"enginejobs:{name}", 7, timeout=3 if name == "hang" else 60, env=jobs_module)
                   for name in ("echo", "raises", "segfault", "hang")}
        results = {name: f.result() for name, f in futures.items()}
    finally:
        pool.close()
    assert results["echo"].ok and results["echo"].value["got"] == 7
    assert results["raises"].status == "error" and "ValueError: bad candidate 7" in (results["raises"].error or "")
    assert results["segfault"].status == "crashed" and "SIGSEGV" in results["segfault"].reason()
    assert results["hang"].status == "timeout" and "timed out after 3 s" in results["hang"].reason()


def test_gpu_jobs_are_serialized_per_gpu(jobs_module: dict[str, str]) -> None:
    pool = WorkerPool(cpu_workers=4, gpus=[0])
    try:
        spans = [pool.submit("enginejobs:span", 1.0, timeout=60, kind="gpu", env=jobs_module) for _ in range(3)]
        results = [f.result() for f in spans]
        gpu = pool.run("enginejobs:echo", None, timeout=60, kind="gpu", env=jobs_module)
    finally:
        pool.close()
    intervals = sorted(tuple(r.value) for r in results)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(intervals)), intervals  # never overlap
    assert gpu.value["gpu"] == "0"


# ---------------------------------------------------------------------------------------------------
# The one timer (a CPU clock stands in for CUDA events)
# ---------------------------------------------------------------------------------------------------
class _CpuEvent:
    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: _CpuEvent) -> float:
        return (other.t - self.t) * 1000.0


CPU_CLOCK = CudaClock(_CpuEvent, lambda: None, lambda: None)


def _sleeper(seconds: float, calls: list[str], label: str) -> Any:
    def fn() -> None:
        calls.append(label)
        time.sleep(seconds)

    return fn


def test_time_gpu_reports_median_and_spread() -> None:
    timing = time_gpu(_sleeper(0.002, [], "a"), runs=9, warmup=1, clock=CPU_CLOCK)
    assert timing.runs == 9 and 1900 < timing.median_us < 20000 and timing.min_us <= timing.median_us <= timing.p90_us


def test_the_device_span_records_the_end_before_the_host_synchronizes() -> None:
    """The call span's end event waits for the host's synchronize (the host's side of the call is timed);
    the device span's is recorded right after the call returns, so a synchronize that takes long (a host
    waking up late) is not on its clock."""
    def slow_sync() -> None:
        time.sleep(0.004)

    clock = CudaClock(_CpuEvent, slow_sync, lambda: None)
    call = time_gpu(lambda: None, runs=5, warmup=0, clock=clock, flush_l2_bytes=0)
    device = time_gpu(lambda: None, runs=5, warmup=0, clock=clock, flush_l2_bytes=0, span="device")
    assert call.span == "call" and device.span == "device"
    assert call.median_us > 3500 and device.median_us < 3000, (call, device)
    ab = interleaved_ab(lambda: None, lambda: None, rounds=2, runs=2, warmup=0, clock=clock, flush_l2_bytes=0,
                        span="device")
    assert ab.to_json()["span"] == "device" and max(ab.a_us + ab.b_us) < 3000
    with pytest.raises(ValueError, match="span"):
        time_gpu(lambda: None, runs=1, clock=clock, span="wall")


def test_the_timer_probe_says_it_needs_a_gpu(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`tools/timer_probe.py` compares the spans with the profiler on a GPU; without one it says so and exits 2."""
    import torch

    from kstrata.tools import timer_probe

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert timer_probe.main([]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().out


def test_interleaved_rounds_alternate_and_stop_early_when_clearly_slower() -> None:
    calls: list[str] = []
    even = interleaved_ab(_sleeper(0.001, calls, "a"), _sleeper(0.001, calls, "b"), rounds=4, runs=3, warmup=0,
                          margin=100.0, clock=CPU_CLOCK)  # (no early stop: a loaded machine makes sleeps uneven)
    assert even.order == list("ABBAABBA") and even.rounds == 4 and even.stopped_early is None
    slow = interleaved_ab(_sleeper(0.001, [], "a"), _sleeper(0.004, [], "b"), rounds=6, runs=3, warmup=0,
                          clock=CPU_CLOCK)
    assert slow.rounds == 2 and slow.stopped_early and "the best" in slow.stopped_early
    assert slow.speedup < 0.6
    # against a best candidate known to be fast, an even race stops too
    best = interleaved_ab(_sleeper(0.002, [], "a"), _sleeper(0.002, [], "b"), rounds=6, runs=3, warmup=0,
                          best_us=500.0, clock=CPU_CLOCK)
    assert best.rounds == 2 and best.stopped_early


# ---------------------------------------------------------------------------------------------------
# Builds: cached by key, deduplicated by binary
# ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def add_entry(suite_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = copy_suite_subset(suite_cache, tmp_path_factory.mktemp("engine-add"), ("vector_add",), ("cuda:90",))
    return next(p for p in root.iterdir() if p.is_dir())


def test_build_is_cached_and_two_edits_with_one_binary_are_deduplicated(add_entry: Path, tmp_path: Path) -> None:
    with Engine(tmp_path / "engine", jobs=2) as engine:
        base = engine.add_kernel(add_entry)
        by_pass = Candidate(base, "ttgir", PipelineEdit("ttgir(num-warps{n=8})"))
        by_options = Candidate(base, "options", OptionsEdit.of({"num_warps": 8}))
        first, second = sorted(engine.build_many([by_pass, by_options]), key=lambda b: b.duplicate_of is not None)
        assert first.status == second.status == "changed", (first.error, second.error)
        assert first.binary_digest == second.binary_digest and first.key != second.key
        assert second.duplicate_of == first.key and first.duplicate_of is None and engine.stats.deduplicated == 1
        if first.key != by_pass.key:
            by_pass = by_options
        assert engine.built_entry(second) == first.entry
        again = engine.build(by_pass)
        assert again.cached and again.entry == first.entry and engine.stats.build_cache_hits == 1
        # a truncated binary in the cache is noticed: built again, not served
        cubin = next(Path(first.entry or "").glob("*.cubin"))
        cubin.write_bytes(cubin.read_bytes()[:100])
        rebuilt = engine.build(by_pass)
        assert not rebuilt.cached and hashlib.sha256(next(Path(rebuilt.entry or "").glob("*.cubin")).read_bytes()
                                                     ).hexdigest() == first.binary_digest
        # an unchanged build is equivalent by identical code; without a launch a change is unproven
        same = engine.build(Candidate(base, "ttgir", PipelineEdit("ttgir(num-warps{n=4})")))
        assert same.status == "unchanged" and engine.check(base, same).verdict is Verdict.EQUIVALENT
        verdict = engine.check(base, first)
        # without a launch the symbolic checker decides the TTGIR edit: proved (evidence) or undecided (unproven)
        sym = [e for e in verdict.evidence if e.name == "symbolic"]
        assert sym and any("signature" in e.name for e in verdict.evidence)
        assert verdict.verdict is (Verdict.EQUIVALENT if any(e.verdict == "pass" for e in sym) else Verdict.UNPROVEN)
        assert engine.measure(base, first, [], Budget()).status == "skipped"


def test_a_whole_level_of_text_is_an_edit_rebuilt_like_a_pass(add_entry: Path, tmp_path: Path) -> None:
    """What a generated (LLM) pass writes is the whole text of a level: the engine rebuilds the levels below it,
    and the same TTGIR by text or by pass is one binary; text that does not parse is a failed build."""
    from kstrata.agents.engine import IrTextEdit

    with Engine(tmp_path / "engine") as engine:
        base = engine.add_kernel(add_entry)
        by_pass = engine.build(Candidate(base, "ttgir", PipelineEdit("ttgir(num-warps{n=8})")))
        ttgir = next(Path(by_pass.entry or "").glob("*.ttgir")).read_text()
        by_text = engine.build(Candidate(base, "ttgir", IrTextEdit(ttgir)))
        assert by_text.status == "changed" and by_text.binary_digest == by_pass.binary_digest, by_text.error
        assert by_text.duplicate_of == by_pass.key
        original = next(add_entry.glob("*.ttgir")).read_text()
        assert engine.build(Candidate(base, "ttgir", IrTextEdit(original))).status == "unchanged"
        bad = engine.build(Candidate(base, "ttgir", IrTextEdit(original.replace("tt.load", "tt.lod", 1))))
        assert bad.status == "failed" and "does not rebuild" in (bad.error or "")
        with pytest.raises(EngineError, match="ir-text edit works at"):
            Candidate(base, "options", IrTextEdit(original))


def test_unknown_base_and_unsupported_edits_are_clear(add_entry: Path, tmp_path: Path) -> None:
    with Engine(tmp_path / "engine") as engine:
        with pytest.raises(EngineError, match="unknown base"):
            engine.build(Candidate(DIGEST, "ptx", PipelineEdit("ptx(cache-hints)")))
        task = tmp_path / "task.py"
        task.write_text("import torch\n")
        base = engine.add_task(task)
        built = engine.build(Candidate(base, "task", ModelNewEdit("class ModelNew: pass\n")))
        assert built.status == "changed" and Path(built.entry or "").read_text() == "class ModelNew: pass\n"
        fields = {"level": "task", "edit": "class ModelNew: pass\n", "policy": "strict",
                  "provenance": {"proposer": "p", "parent": None, "space": "triton"}}  # the optimizer's engine_fields()
        same = Candidate.task(base, **fields)
        assert same.key == Candidate(base, "task", ModelNewEdit("class ModelNew: pass\n")).key
        assert engine.build(same).cached and same.provenance.space == "triton"


# ---------------------------------------------------------------------------------------------------
# run-passes over a plain Triton cache
# ---------------------------------------------------------------------------------------------------
PROGRAM = '''
import hashlib, json, sys
import triton
import triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


hits = []
knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
digests = []
for block in (256, 1024):  # two variants of one kernel: one override key, two cache keys
    src = ASTSource(scale_kernel, {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                    {"BLOCK": block})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    digests.append(hashlib.sha256(k.asm["cubin"]).hexdigest())
print(json.dumps({"cache_hit": hits, "cubins": digests}))
'''


def _run_program(program: Path, cache: Path) -> dict[str, Any]:
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    for var in ("TRITON_KERNEL_OVERRIDE", "TRITON_OVERRIDE_DIR", "TRITON_ALWAYS_COMPILE", "TRITON_KERNEL_DUMP"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=300, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_run_passes_on_a_plain_cache_writes_a_patched_cache_triton_loads(tmp_path: Path) -> None:
    program, cache, out = tmp_path / "prog.py", tmp_path / "plain-cache", tmp_path / "out"
    program.write_text(PROGRAM)
    first = _run_program(program, cache)
    assert first["cache_hit"] == [False, False] and not (cache / "kstrata-index.json").exists()
    before = _tree(cache)
    report = run_passes(cache, "ptx(cache-hints)", out, jobs=2)
    assert _tree(cache) == before  # the input is byte-identical afterwards
    assert report.counts() == {"changed": 2, "unchanged": 0, "failed": 0}, report.kernels
    assert report.patched_cache == str((out / "patched-cache").resolve())
    assert len({k["key"] for k in report.kernels}) == 2 and {k["launch_options"].get("num_warps")
                                                           for k in report.kernels} == {4}
    rewritten = {hashlib.sha256(next(Path(k["patched_entry"]).glob("*.cubin")).read_bytes()).hexdigest()
                 for k in report.kernels}
    assert not rewritten & set(first["cubins"])  # the patched entries hold the rewritten binaries
    # Triton, given the patched cache, finds both kernels under their keys and compiles nothing
    second = _run_program(program, Path(report.patched_cache))
    assert second["cache_hit"] == [True, True] and set(second["cubins"]) == rewritten
    assert _tree(cache) == before
    markdown = (out / "run-passes-report.md").read_text()
    assert "TRITON_CACHE_DIR=" in markdown and markdown.count("| scale_kernel |") == 2

    # resume: a second run reads the state; a truncated state or a truncated output is redone
    from kstrata.agents.run_passes import _state_file

    state = _state_file(out, report.kernels[0]["entry"], "ptx(cache-hints)")
    state.write_text(state.read_text()[:40])
    cubin = next(Path(report.kernels[1]["patched_entry"]).glob("*.cubin"))
    cubin.write_bytes(cubin.read_bytes()[:64])
    again = run_passes(cache, "ptx(cache-hints)", out, jobs=2)
    notes = [k.get("note") or "" for k in again.kernels]
    assert sum("redone" in n for n in notes) == 2, notes
    assert again.engine["build_cache_hits"] == 2 and again.engine["builds"] == 0  # the engine cache served both
    assert hashlib.sha256(cubin.read_bytes()).hexdigest() in rewritten


def test_only_names_kernels_like_suite_build(suite_cache: Path, tmp_path: Path) -> None:
    cache = copy_suite_subset(suite_cache, tmp_path / "cache", ("vector_add", "transpose_2d"), ("cuda:90",))
    with pytest.raises(KstrataError, match="did you mean vector_add_kernel"):
        run_passes(cache, "ptx(cache-hints)", tmp_path / "o", only=["vector_ad"])
    report = run_passes(cache, "ptx(cache-hints)", tmp_path / "o", only=["vector_add"])
    assert [k["name"] for k in report.kernels] == ["vector_add_kernel"]


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
def test_patched_cache_runs_the_rewritten_binary_on_the_gpu(tmp_path: Path) -> None:
    program = tmp_path / "prog.py"
    program.write_text(textwrap.dedent('''
        import hashlib, json
        import torch, triton, triton.language as tl
        from triton import knobs

        @triton.jit
        def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)

        hits = []
        knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
        x = torch.randn(100_000, device="cuda")
        y = torch.empty_like(x)
        k = scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        torch.cuda.synchronize()
        print(json.dumps({"cache_hit": hits, "cubins": [hashlib.sha256(k.asm["cubin"]).hexdigest()],
                          "ok": bool(torch.equal(y, x * 2.0))}))
    '''))
    cache, out = tmp_path / "plain-cache", tmp_path / "out"
    first = _run_program(program, cache)
    assert first["ok"] and first["cache_hit"] == [False]
    report = run_passes(cache, "ptx(cache-hints)", out)
    assert report.counts()["changed"] == 1 and report.patched_cache
    second = _run_program(program, Path(report.patched_cache))
    patched = hashlib.sha256(next(Path(report.kernels[0]["patched_entry"]).glob("*.cubin")).read_bytes()).hexdigest()
    assert second["ok"] and second["cache_hit"] == [True] and second["cubins"] == [patched]


# ---------------------------------------------------------------------------------------------------
# Triton-source candidates: a @triton.jit function compiled for a kernel base
# ---------------------------------------------------------------------------------------------------
SAME_ADD = '''
@triton.jit
def vector_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # the same kernel written differently: one expression, the mask inline, the operands swapped
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(y_ptr + offs, mask=offs < n) + tl.load(x_ptr + offs, mask=offs < n),
             mask=offs < n)
'''


def _source_candidate(base: str, source: str, **kw: Any) -> Candidate:
    from kstrata.agents.engine import TritonSourceEdit

    return Candidate(base, "triton", TritonSourceEdit.of(source, {"BLOCK": 1024}), **kw)


def test_a_triton_source_is_built_for_the_base_cached_and_deduplicated(add_entry: Path, tmp_path: Path) -> None:
    with Engine(tmp_path / "engine", jobs=2) as engine:
        base = engine.add_kernel(add_entry)
        same = _source_candidate(base, SAME_ADD)
        loose = _source_candidate(base, SAME_ADD, tolerance="ulp=1")  # another key, the same binary
        first, second = sorted(engine.build_many([same, loose]), key=lambda b: b.duplicate_of is not None)
        assert first.status == second.status == "changed", (first.error, second.error)
        assert first.first_changed == "ttir" and first.static_checks["signature"] == "unchanged"
        assert second.duplicate_of == first.key and engine.stats.deduplicated == 1
        assert not first.same_binary_as_base  # another source file: other line tables
        from kstrata.ir.triton_layout import load_any

        built = load_any(first.entry or "")[0][0]
        assert built.name == "vector_add_kernel" and built.num_warps == 4  # the base's options
        assert engine.build(same).cached
        # the round trip of the edit keeps the constexprs (the key is the same after JSON)
        assert Candidate.from_json(json.loads(json.dumps(same.to_json()))).key == same.key


@pytest.mark.parametrize(("source", "message"), [
    ("@triton.jit\ndef vector_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):\n    offs = (\n",
     "does not parse: line 3"),
    (SAME_ADD.replace("n, BLOCK", "n_elements, BLOCK").replace("< n)", "< n_elements)"),
     "runtime parameters (x_ptr, y_ptr, out_ptr, n_elements) differ from kernel vector_add_kernel's "
     "(x_ptr, y_ptr, out_ptr, n)"),
    (SAME_ADD.replace("def vector_add_kernel", "def add"), "no @triton.jit function named vector_add_kernel "
                                                            "(it defines: add)"),
    (SAME_ADD.replace("tl.load(y_ptr", "tl.lod(y_ptr"), "line 6: CompilationError: AttributeError(\"module 'triton.language' has no attribute 'lod'"),
])
def test_a_bad_triton_source_is_one_clear_error(add_entry: Path, tmp_path: Path, source: str, message: str) -> None:
    with Engine(tmp_path / "engine") as engine:
        base = engine.add_kernel(add_entry)
        built = engine.build(_source_candidate(base, source))
        assert built.status == "failed" and message in (built.error or ""), built.error
        assert "Traceback" not in (built.error or "") and "\n" not in (built.error or "")
        assert engine.check(base, built).verdict is Verdict.ERROR


@pytest.mark.slow
def test_a_triton_source_is_checked_like_any_kernel_candidate(add_entry: Path, tmp_path: Path) -> None:
    from kstrata.testsuite.kernels import get_kernel
    from kstrata.testsuite.kernels.launch import suite_launch_record

    launch = suite_launch_record(get_kernel("vector_add"), "cuda:90").save(tmp_path / "launch" / "add-0.json")
    with Engine(tmp_path / "engine", jobs=2) as engine:
        base = engine.add_kernel(add_entry)
        good, wrong = engine.build_many([_source_candidate(base, SAME_ADD),
                                         _source_candidate(base, SAME_ADD.replace(") + tl.load", ") - tl.load"))])
        assert good.status == wrong.status == "changed", (good.error, wrong.error)
        ok = engine.check(base, good, [launch], device="cpu", seeds=1)
        assert ok.verdict is Verdict.EQUIVALENT, ok.reason
        assert any(e.name.startswith("interpreter") and e.verdict == "pass" for e in ok.evidence)
        bad = engine.check(base, wrong, [launch], device="cpu", seeds=1)
        assert bad.verdict is Verdict.DIFFERENT and "interpreter" in bad.reason, bad.reason
        # verify's own options reach the check's worker: static evidence only, so no dynamic run
        from kstrata.agents.engine import VerifyOptions

        static = engine.check(base, wrong, [launch], verify=VerifyOptions(device="cpu", seeds=1, static_only=True))
        assert static.verdict is Verdict.UNPROVEN and not any(e.name.startswith("interpreter")
                                                              for e in static.evidence), static.evidence


def test_an_adopted_candidate_is_checked_by_verify_and_its_report_cached(add_entry: Path, tmp_path: Path) -> None:
    """`kstrata verify`'s path through the engine, in process: the loaded original and candidate
    registered by content, the whole verify report carried back, kept, and served to an equal candidate."""
    import dataclasses as dc

    from kstrata.agents.engine import VerifyOptions
    from kstrata.ir.triton_layout import load_any

    original = load_any(add_entry)[0][0]
    ptx = original.text("ptx")
    edited = dc.replace(original, levels={**original.levels, "ptx": ptx.replace("\tret;", "\t// kstrata\n\tret;")})
    assert edited.text("ptx") != ptx
    with Engine(tmp_path / "engine") as engine:
        base = engine.add_bundle(original)
        same = engine.adopt(base, dc.replace(original))
        assert same.same_binary_as_base and same.binary_digest == base
        identical = engine.check(base, same, verify=VerifyOptions(device="cpu"))
        assert identical.verdict is Verdict.EQUIVALENT and identical.report is not None
        assert identical.report["differing_levels"] == [] and identical.report["verdict"] == "equivalent"
        options = VerifyOptions(device="cpu", static_only=True)
        first = engine.check(base, engine.adopt(base, edited), verify=options)
        assert first.verdict is Verdict.UNPROVEN and not first.cached and first.report is not None
        assert first.report["accepted"] and first.report["differing_levels"][0] == "ptx"
        assert first.report["rebuilt_levels"] == ["cubin"]  # the stale cubin: rebuilt from the edited PTX
        again = engine.check(base, engine.adopt(base, dc.replace(edited, origin="elsewhere")), verify=options)
        assert again.cached and again.report == first.report and engine.stats.check_cache_hits == 1
        fresh = engine.check(base, engine.adopt(base, edited), verify=options, use_cache=False)
        assert not fresh.cached and fresh.report == first.report
        with pytest.raises(EngineError, match="unknown base"):
            engine.adopt(DIGEST, edited)
