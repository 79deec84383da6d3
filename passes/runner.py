"""`kstrata run-passes`: a pipeline over every kernel of a Triton cache root or dump directory.

For each kernel: load it, run the pipeline (the lower levels are rebuilt with Triton's stages), run the
static checks (signature and launch ABI unchanged; resources before and after), check a TTIR/TTGIR
rewrite with the CPU interpreter on the kernel's launch record when there is one, and write the changed
levels in `TRITON_OVERRIDE_DIR` layout. Each kernel runs in its own child process with a timeout, so a
crash in a compiler (LLVM aborts the process on some bad input) is that kernel's failure, not the run's.
The run never writes into the directory it reads; it records each kernel's result under
`OUT/.kstrata-run/` and skips kernels already done when started again (resumable); at the end it
writes `OUT/run-passes-report.json` and `.md`.

With `launches` (a directory of `kstrata record` launch records) each kernel is matched to the record of
its binary (the record's cache key is the cache entry's name; for a dump entry, its override key). With
`measure` too, each changed kernel that has a record is timed on an NVIDIA GPU, original binary against
the rewritten one, on replays of the recorded launch: one child process per kernel, one kernel at a
time (never two timings at once), outputs compared byte for byte first, then A/B rounds in alternating
order (ABBA…, so that clock and thermal drift falls on both alike), each round `time_gpu` (L2 flush,
warm-up, median of many). The report gives both medians, the speedup and its spread over rounds, and
flags a result more than 10x either way, or faster than the time to write the kernel's outputs once at
the device's memory bandwidth, as suspicious (DESIGN.md, guarded measurement).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kstrata.ir.errors import KstrataError

REPORT_SCHEMA = "kstrata.run-passes/1"
STATE_DIR = ".kstrata-run"


@dataclass
class KernelOutcome:
    """What happened to one kernel."""

    entry: str
    name: str = "?"
    target: str = "?"
    status: str = "failed"  # "changed", "unchanged", "failed"
    passes: list[dict[str, Any]] = field(default_factory=list)
    first_changed: str | None = None
    override_entry: str | None = None
    resources_before: dict[str, Any] = field(default_factory=dict)
    resources_after: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    repro: str | None = None
    seconds: float = 0.0
    #: A full cache entry of the rewritten kernel (every level and Triton's metadata), kept for timing.
    candidate_entry: str | None = None
    launch_record: str | None = None
    time_before_us: float | None = None
    time_after_us: float | None = None
    speedup: float | None = None
    #: How the times were taken: rounds, runs, spread, device; or why the kernel was not timed.
    timing: dict[str, Any] = field(default_factory=dict)
    suspicious: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def target_slug(target: Any) -> str:
    """The per-target override root's name: `cuda-90`, `hip-gfx942`."""
    return f"{target.backend}-{target.arch}"


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def _resources(bundle: Any) -> dict[str, Any]:
    from kstrata.backends.resources import resource_usage

    usage = resource_usage(bundle).to_json()
    keep = ("registers", "sgprs", "agprs", "shared_bytes", "local_bytes", "stack_bytes", "vgpr_spills", "sgpr_spills")
    out = {k: usage[k] for k in keep if usage.get(k) is not None}
    out["triton_shared"] = bundle.shared
    out["num_warps"] = bundle.num_warps
    return out


def _static_checks(before: Any, after: Any) -> dict[str, Any]:
    """What must not change for a launcher, checked; raises `KstrataError` on a violation."""
    checks: dict[str, Any] = {}
    if before.signature != after.signature:
        raise KstrataError(f"kernel {before.name}: the signature changed {before.signature} -> {after.signature}")
    checks["signature"] = "unchanged"
    from kstrata.backends import checks as shared

    if before.target.backend == "cuda":
        # option passes may change the block size on purpose: launch bounds are reported, not refused
        changed = shared.ptx_entry_changes(before.text("ptx"), after.text("ptx"), launch_bounds=False)
        if changed:
            raise KstrataError(f"kernel {before.name}: the PTX entry changed: {'; '.join(changed)}")
        checks["ptx_entry"] = "name and parameters unchanged"
        bounds = shared.ptx_entry_changes(before.text("ptx"), after.text("ptx"))
        checks["block_threads"] = "; ".join(bounds) or "unchanged"
    else:
        abi, other = shared.amd_metadata_changes(shared.binary(before.level("hsaco")),
                                                 shared.binary(after.level("hsaco")), workgroup=False)
        if abi:
            raise KstrataError(f"kernel {before.name}: the code object's ABI changed: {'; '.join(abi)}")
        checks["code_object_abi"] = "kernarg layout and wave size unchanged"
        checks["resource_changes"] = other
    return checks


def _interpreter_check(before: Any, after: Any, record_path: str | None, tolerance: Any) -> str:
    """The CPU interpreter's verdict on a TTIR/TTGIR rewrite, on the kernel's recorded launch (random,
    edge-value and recorded inputs, through `kstrata verify`); raises `KstrataError` when it differs."""
    from kstrata.backends.verify import verify
    from kstrata.ir.launch import LaunchRecord

    if record_path is None:
        return "not run: no launch record for this kernel (run-passes --launches DIR from kstrata record)"
    report = verify(before, after, LaunchRecord.load(record_path), seeds=1, device="cpu", tolerance=tolerance,
                    launch_dir=Path(record_path).parent)
    checks = [c for c in report.checks if c.name.startswith("interpreter")]
    failed = [c for c in checks if c.verdict == "fail"]
    if failed:
        raise KstrataError(f"kernel {before.name}: the interpreter finds the rewrite not equivalent at "
                           f"{failed[0].level} ({failed[0].name}): {failed[0].detail}")
    passed = sum(1 for c in checks if c.verdict == "pass")
    skipped = [f"{c.name}: {c.detail}" for c in checks if c.verdict == "skipped"]
    # verify's verdict on the interpreter's evidence: a rewrite no input set could check is unproven, not verified
    proven = "interpreter" in report.evidence()
    return ("" if proven else "unproven: ") + f"{passed} of {len(checks)} input sets equivalent" + \
        (f"; skipped {'; '.join(skipped)}" if skipped else "")


def process_kernel(entry: str, pipeline_spec: str, out_dir: str, repro_dir: str,
                   override_key: str | None = None, candidate_dir: str | None = None,
                   record_path: str | None = None) -> dict[str, Any]:
    """Run the pipeline on one kernel (in this process); returns a `KernelOutcome` as JSON. With
    `candidate_dir`, a changed kernel is also written there as a full cache entry (for timing). A rewrite
    of TTIR or TTGIR is checked by the CPU interpreter on the kernel's launch record (`record_path`)
    before anything is written; one it finds not equivalent fails and writes no override."""
    from kstrata.ir.candidate import CANDIDATE_FILE, CandidateInfo, changed_metadata
    from kstrata.ir.triton_layout import load_any, write_cache_entry, write_override

    from .pipeline import PassFailure, parse_pipeline, run_pipeline

    start = time.perf_counter()
    outcome = KernelOutcome(entry)
    try:
        bundles, errors = load_any(entry)
        if errors:
            raise errors[0]
        bundle = bundles[0]
        bundle.override_key = bundle.override_key or override_key
        outcome.name, outcome.target = bundle.name, str(bundle.target)
        result = run_pipeline(bundle, parse_pipeline(pipeline_spec), repro_dir)
        outcome.passes = [r.__dict__ for r in result.records]
        outcome.resources_before = _resources(bundle)
        if not result.changed:
            outcome.status = "unchanged"
        else:
            outcome.first_changed = result.first_changed
            outcome.checks = _static_checks(bundle, result.bundle)
            outcome.resources_after = _resources(result.bundle)
            levels = bundle.target.levels
            assert result.first_changed is not None
            written = [lv for lv in levels[levels.index(result.first_changed):] if lv in result.bundle.levels]
            if bundle.override_key is None:
                raise KstrataError(f"kernel {bundle.name}: Triton's override key is unknown for this cache entry; run "
                                   "the program with TRITON_KERNEL_DUMP=1 too and pass its dump directory "
                                   "(--dump-dir), or use a cache built through kstrata", path=entry)
            # Triton keys overrides by source only, not by target: one override root per target.
            target_dir = Path(out_dir) / target_slug(bundle.target)
            pipeline = parse_pipeline(pipeline_spec)
            tolerance = pipeline.tolerance()
            if result.first_changed in ("ttir", "ttgir"):
                outcome.checks["interpreter"] = _interpreter_check(bundle, result.bundle, record_path, tolerance)
            info = CandidateInfo(bundle.name, pipeline.spelling(), tolerance.spelling() if tolerance else None,
                                 tolerance.why if tolerance else None,
                                 changed_metadata(bundle.metadata, result.bundle.metadata))
            outcome.override_entry = str(write_override(result.bundle, target_dir, levels=written, overwrite=True,
                                                        extra_files={CANDIDATE_FILE: info.encode()}))
            if candidate_dir is not None:
                outcome.candidate_entry = str(write_cache_entry(result.bundle, candidate_dir, overwrite=True))
            outcome.status = "changed"
    except PassFailure as exc:
        outcome.error, outcome.repro = str(exc), exc.repro
    except Exception as exc:  # every other failure is this kernel's, reported with its reason
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.seconds = time.perf_counter() - start
    return outcome.to_json()


def _mark_key_collisions(outcomes: list[dict[str, Any]]) -> None:
    """Kernels that share an override entry cannot be overridden separately (Triton keys overrides by the
    source hash, which autotuning variants of one kernel share): fail all of them and drop the entry."""
    import shutil

    by_entry: dict[str, list[dict[str, Any]]] = {}
    for o in outcomes:
        if o.get("override_entry"):
            by_entry.setdefault(o["override_entry"], []).append(o)
    for entry, group in by_entry.items():
        if len(group) < 2:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        for o in group:
            others = [g["entry"] for g in group if g is not o]
            o["status"] = "failed"
            o["error"] = (f"override key collision with {', '.join(others)}: Triton keys overrides by source hash only, "
                          "so variants of one kernel (e.g. autotuning configs) cannot be overridden separately")
            o["override_entry"] = None


def _state_file(out: Path, entry: str, pipeline_spec: str) -> Path:
    digest = hashlib.sha256(f"{Path(entry).resolve()}|{pipeline_spec}".encode()).hexdigest()[:24]
    return out / STATE_DIR / f"{digest}.json"


def _run_child(entry: str, pipeline_spec: str, out_dir: str, repro_dir: str, timeout: float,
               override_key: str | None, candidate_dir: str | None = None,
               env: dict[str, str] | None = None, record_path: str | None = None) -> dict[str, Any]:
    args = json.dumps([entry, pipeline_spec, out_dir, repro_dir, override_key, candidate_dir, record_path])
    try:
        proc = subprocess.run([sys.executable, "-m", "kstrata.passes.runner", args], capture_output=True, text=True,
                              timeout=timeout, check=False, env=env)
    except subprocess.TimeoutExpired:
        return KernelOutcome(entry, error=f"timed out after {timeout:g} s").to_json()
    if proc.returncode != 0:
        reason = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        return KernelOutcome(entry, error=f"the kernel's worker process died ({reason}): {tail}").to_json()
    last = proc.stdout.strip().splitlines()[-1]
    return dict(json.loads(last))


# ---------------------------------------------------------------------------------------------------
# Launch records and per-kernel timing
# ---------------------------------------------------------------------------------------------------
#: Speedups beyond this factor (either way) are flagged until explained (DESIGN.md, guarded measurement).
SUSPICIOUS_FACTOR = 10.0
#: Peak memory bandwidth by device name, bytes/s, for the output-write bound; an unknown device gets
#: the highest in the table, which makes the bound lower and so flags less, never more.
_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "MI300": 5.3e12, "B200": 8.0e12}
MeasureFn = Callable[[dict[str, Any], str], dict[str, Any]]


def load_launch_records(launches: str | Path) -> tuple[dict[str, str], list[str]]:
    """Index the launch records under `launches`: key -> record path, where the key is the base32 cache
    key (a cache entry's directory name) and, for records of kernels from a dump, the override key. The
    first record of each key wins (`kstrata record` numbers them in launch order). Also returns the
    records that could not be read, with the reason."""
    from kstrata.ir.launch import LaunchRecord, LaunchRecordError
    from kstrata.ir.triton_layout import base32_key

    root = Path(launches)
    if not root.is_dir():
        raise KstrataError("no such launch record directory", path=root)
    index: dict[str, str] = {}
    unreadable: list[str] = []
    for path in sorted(root.glob("*.json"), key=lambda p: (p.stem.rpartition("-")[0], _record_number(p))):
        try:
            record = LaunchRecord.load(path)
        except LaunchRecordError as exc:
            unreadable.append(f"{path}: {exc}")
            continue
        if record.cache_key:
            index.setdefault(base32_key(record.cache_key), str(path))
        if record.override_key:
            index.setdefault(f"override:{record.override_key}", str(path))
    return index, unreadable


def _record_number(path: Path) -> int:
    tail = path.stem.rpartition("-")[2]
    return int(tail) if tail.isdigit() else 0


def _record_override_key(record_path: str) -> str | None:
    from kstrata.ir.launch import LaunchRecord

    return LaunchRecord.load(record_path).override_key


def tool_env(record_path: str | None) -> dict[str, str] | None:
    """The environment a kernel's child processes need to rebuild it as the recorded program built it.

    A program under Inductor compiles with torch's own ptxas (Inductor sets `TRITON_PTXAS_PATH`), whose
    PTX ISA version the ptxas Triton bundles may not know; rebuilding that PTX then fails. `kstrata record`
    keeps the variable in the record's `extra`, and it is passed on here unless this process sets its own.
    """
    from kstrata.ir.launch import LaunchRecord

    if record_path is None or os.environ.get("TRITON_PTXAS_PATH"):
        return None
    ptxas = LaunchRecord.load(record_path).extra.get("TRITON_PTXAS_PATH")
    if not ptxas or not Path(ptxas).is_file():
        return None
    return {**os.environ, "TRITON_PTXAS_PATH": str(ptxas)}


def match_record(entry: str, index: dict[str, str]) -> str | None:
    """The launch record of a cache entry (named by its cache key) or a dump entry (by its override key)."""
    name = Path(entry).name
    return index.get(name) or index.get(f"override:{name}")


def measurement_unavailable(target: str) -> str | None:
    """Why kernels of `target` cannot be timed on this machine, or None when they can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed, and timing launches binaries through it"
    if not target.startswith("cuda"):
        return f"timing {target} binaries needs an AMD GPU; only NVIDIA GPUs are supported for timing so far"
    if torch.version.hip is not None or not torch.cuda.is_available():
        return (f"no NVIDIA GPU is visible to torch (torch {torch.__version__}, torch.cuda.is_available() is "
                f"{torch.cuda.is_available()}); timing runs the original and rewritten binaries on the GPU")
    return None


def _output_write_bound_us(record: Any, device_name: str) -> float | None:
    """A lower bound on the kernel's time: writing its outputs once at the device's peak bandwidth."""
    from kstrata.ir.launch import TensorArg

    bandwidth = next((bw for key, bw in _BANDWIDTH.items() if key in device_name), max(_BANDWIDTH.values()))
    written = 0
    for arg in record.args:
        if isinstance(arg, TensorArg) and arg.written:
            numel = 1
            for n in arg.shape:
                numel *= n
            written += numel * _itemsize(arg.dtype)
    return written / bandwidth * 1e6 if written else None


def _itemsize(dtype: str) -> int:
    import torch

    return int(getattr(torch, dtype).itemsize)


def suspicious_reasons(timing: dict[str, Any]) -> list[str]:
    """What makes a timing result doubtful until explained."""
    reasons = []
    speedup = timing.get("speedup")
    if speedup and (speedup > SUSPICIOUS_FACTOR or speedup < 1 / SUSPICIOUS_FACTOR):
        reasons.append(f"speedup {speedup:.2f}x is beyond {SUSPICIOUS_FACTOR:g}x either way")
    bound = timing.get("write_bound_us")
    for which in ("time_before_us", "time_after_us"):
        t = timing.get(which)
        if bound and t is not None and t < bound:
            reasons.append(f"{which} {t:.2f} us is below the time to write the outputs once at peak bandwidth "
                           f"({bound:.2f} us)")
    if timing.get("outputs_equal") is False and not timing.get("declared_tolerance"):
        reasons.append("the rewritten binary wrote different bytes than the original on the same replay, and "
                       "no pass of the pipeline declares a tolerance")
    return reasons


def declared_tolerances(pipeline_spec: str) -> str | None:
    """The tolerances the pipeline's passes declare, as one line (None: every pass is bit-exact)."""
    from .pipeline import parse_pipeline

    declared = []
    for _, kernel_pass in parse_pipeline(pipeline_spec).passes:
        tolerance = kernel_pass.declared_tolerance()
        if tolerance:
            declared.append(f"{kernel_pass.spelling()}: {tolerance.spelling()}")
    return "; ".join(declared) or None


def measure_kernel(original_entry: str, candidate_entry: str, record_path: str, rounds: int = 6,
                   runs: int = 50, seed: int = 0) -> dict[str, Any]:
    """Time the original and the rewritten binary of one kernel on replays of its launch record (in this
    process, on the current GPU). Both first run once on identical inputs and their outputs are compared
    byte for byte; then `rounds` rounds of `time_gpu` each, in ABBA order."""
    import statistics

    import torch

    from kstrata.backends.launch import LoadedKernel, time_gpu
    from kstrata.backends.replay import compare_outputs, replay_args
    from kstrata.ir.launch import LaunchRecord, TensorArg
    from kstrata.ir.triton_layout import load_any

    record = LaunchRecord.load(record_path)
    kernels = []
    for entry in (original_entry, candidate_entry):
        bundles, errors = load_any(entry)
        if errors:
            raise errors[0]
        record.check_against(bundles[0].params)
        kernels.append(LoadedKernel(bundles[0]))
    outputs = []
    replays = []
    for kernel in kernels:
        args = replay_args(record, "cuda", seed)  # identical contents for both: the same seed
        kernel.call_by_name(record.grid, args)
        torch.cuda.synchronize()
        outputs.append({a.name: args[a.name].clone() for a in record.args if isinstance(a, TensorArg) and a.written})
        replays.append(args)
    first = compare_outputs(outputs[0], outputs[1], list(outputs[0]))  # bytes; any NaN matches any NaN
    equal = first is None
    difference: dict[str, float] = {}
    for n, a in outputs[0].items():  # how far apart, when not bit-identical (floating outputs)
        b = outputs[1][n]
        if a.dtype.is_floating_point and not torch.equal(a, b):
            x, y = a.double(), b.double()
            both = torch.isfinite(x) & torch.isfinite(y)
            err = (x - y).abs()[both]
            rel = err / y.abs()[both].clamp_min(torch.finfo(a.dtype).tiny)
            difference[n] = max(difference.get(n, 0.0), float(err.max()) if err.numel() else 0.0)
            difference[f"{n}.rel"] = float(rel.max()) if rel.numel() else 0.0
    medians: list[list[float]] = [[], []]
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for which in order:
            kernel, args = kernels[which], replays[which]

            def once(kernel: LoadedKernel = kernel, args: dict[str, Any] = args) -> None:
                kernel.call_by_name(record.grid, args)

            medians[which].append(time_gpu(once, runs=runs).median_us)
    before, after = statistics.median(medians[0]), statistics.median(medians[1])
    ratios = sorted(a / b for a, b in zip(medians[0], medians[1], strict=True))
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    import triton

    timing: dict[str, Any] = {
        "time_before_us": before, "time_after_us": after, "speedup": before / after,
        "speedup_range": [ratios[0], ratios[-1]],
        "spread_before_pct": 100.0 * (max(medians[0]) - min(medians[0])) / before,
        "spread_after_pct": 100.0 * (max(medians[1]) - min(medians[1])) / after,
        "round_medians_us": medians, "rounds": rounds, "runs_per_round": runs, "outputs_equal": equal,
        "first_difference": first, "max_difference": difference,
        "grid": list(record.grid), "record": record_path, "device": props.name, "torch": torch.__version__,
        "triton": triton.__version__, "write_bound_us": _output_write_bound_us(record, props.name),
    }
    return timing


def _measure_child(outcome: dict[str, Any], record_path: str, timeout: float = 300.0) -> dict[str, Any]:
    """`measure_kernel` in a child process with a timeout: a fault in either binary is this kernel's."""
    job = json.dumps({"measure": [outcome["entry"], outcome["candidate_entry"], record_path]})
    try:
        proc = subprocess.run([sys.executable, "-m", "kstrata.passes.runner", job], capture_output=True, text=True,
                              timeout=timeout, check=False, env=tool_env(record_path))
    except subprocess.TimeoutExpired:
        return {"error": f"timing timed out after {timeout:g} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        return {"error": f"the timing process failed (exit code {proc.returncode}): {tail}"}
    return dict(json.loads(lines[-1]))


def _attach_timing(outcome: dict[str, Any], timing: dict[str, Any]) -> None:
    outcome["timing"] = timing
    for key in ("time_before_us", "time_after_us", "speedup"):
        outcome[key] = timing.get(key)
    outcome["suspicious"] = suspicious_reasons(timing) if "error" not in timing else []


def measure_outcomes(outcomes: list[dict[str, Any]], measure_fn: MeasureFn | None = None,
                     force: bool = False, tolerance: str | None = None) -> dict[str, Any]:
    """Time every changed kernel that has a launch record, one after the other; returns what the report
    says about measurement as a whole (how many were timed, or why none could be)."""
    measure_fn = measure_fn or _measure_child
    timed = skipped = failed = 0
    reasons: dict[str, str] = {}
    for o in outcomes:
        if o["status"] != "changed":
            continue
        if not o.get("launch_record"):
            o["timing"] = {"skipped": "no launch record of this binary in --launches"}
            skipped += 1
            continue
        if o.get("time_after_us") is not None and not force:
            timed += 1  # measured by an earlier run of the same pipeline (resumed)
            continue
        reason = measurement_unavailable(o["target"]) if measure_fn is _measure_child else None
        if reason is None and not o.get("candidate_entry"):
            reason = "the rewritten kernel was not kept (run again with --launches and --force)"
        if reason is not None:
            o["timing"] = {"skipped": reason}
            reasons[o["target"]] = reason
            skipped += 1
            continue
        timing = measure_fn(o, o["launch_record"])
        if tolerance and "error" not in timing:
            timing["declared_tolerance"] = tolerance
        _attach_timing(o, timing)
        if "error" in timing:
            failed += 1
        else:
            timed += 1
    return {"timed": timed, "skipped": skipped, "timing_failed": failed, "reasons": reasons}


@dataclass
class RunReport:
    cache_dir: str
    out_dir: str
    pipeline: str
    kernels: list[dict[str, Any]]
    seconds: float
    #: Launch records and timing: where the records came from, how many kernels were timed, or why not.
    measure: dict[str, Any] | None = None

    def counts(self) -> dict[str, int]:
        c = {"changed": 0, "unchanged": 0, "failed": 0}
        for k in self.kernels:
            c[k["status"]] = c.get(k["status"], 0) + 1
        return c

    def to_json(self) -> dict[str, Any]:
        return {"schema": REPORT_SCHEMA, "cache_dir": self.cache_dir, "out_dir": self.out_dir, "pipeline": self.pipeline,
                "seconds": round(self.seconds, 2), "counts": self.counts(), "measure": self.measure,
                "kernels": self.kernels}

    def to_markdown(self) -> str:
        c = self.counts()
        lines = [f"# run-passes: `{self.pipeline}`", "",
                 f"{self.cache_dir} → {self.out_dir} · {len(self.kernels)} kernels: {c['changed']} changed, "
                 f"{c['unchanged']} unchanged, {c['failed']} failed · {self.seconds:.1f} s", ""]
        timed = self.measure is not None and bool(self.measure.get("requested"))
        if self.measure is not None:
            lines += [self.measure_summary(), ""]
        lines += ["| kernel | target | status | passes that changed it | lines +/- | registers | shared | "
                  + ("before µs | after µs | speedup (range over rounds) | " if timed else "") + "checks / error |",
                  "|---|---|---|---|---|---|---|---|" + ("---|---|---|" if timed else "")]
        for k in self.kernels:
            changed = [p for p in k["passes"] if p["status"] == "changed"]
            names = ", ".join(p["spelling"] for p in changed) or "—"
            diff = " ".join(f"+{p['lines_added']}/-{p['lines_removed']}" for p in changed) or ""
            rb, ra = k["resources_before"], k["resources_after"] or k["resources_before"]
            regs = f"{rb.get('registers', '?')} → {ra.get('registers', '?')}" if rb else ""
            shared = f"{rb.get('triton_shared', '?')} → {ra.get('triton_shared', '?')}" if rb else ""
            detail = k["error"] or "; ".join(f"{a}: {b}" for a, b in k["checks"].items() if not isinstance(b, list))
            skipped = [f"{p['spelling']} skipped: {p['reason']}" for p in k["passes"] if p["status"] == "skipped"]
            if skipped and not changed:
                detail = (detail + " " if detail else "") + "; ".join(skipped)
            timing = k.get("timing") or {}
            if timing.get("outputs_equal") is False and not k.get("suspicious"):
                worst = max((v for n, v in (timing.get("max_difference") or {}).items() if not n.endswith(".rel")),
                            default=None)
                detail = (f"outputs not bit-identical (max |diff| {worst:.3g}; declared tolerance "
                          f"{timing.get('declared_tolerance')}); " if worst is not None else
                          "outputs not bit-identical; ") + detail
            if k.get("suspicious"):
                detail = "SUSPICIOUS: " + "; ".join(k["suspicious"]) + (f"; {detail}" if detail else "")
            times = _timing_cells(k) if timed else ""
            lines.append(f"| {k['name']} | {k['target']} | {k['status']} | {names} | {diff} | {regs} | {shared} | "
                         f"{times}{detail.replace('|', '/')[:300]} |")
        return "\n".join(lines) + "\n"

    def measure_summary(self) -> str:
        m = self.measure or {}
        parts = [f"launch records: {m['launches']} ({m.get('matched', 0)} kernels matched)" if m.get("launches")
                 else "launch records: none given"]
        if m.get("requested"):
            env = next((k["timing"] for k in self.kernels if k.get("timing", {}).get("device")), None)
            where = f" on {env['device']} (torch {env['torch']}, triton {env['triton']})" if env else ""
            parts.append(f"timed {m.get('timed', 0)} changed kernels{where}, skipped {m.get('skipped', 0)}, "
                         f"timing failed for {m.get('timing_failed', 0)}")
            parts += [f"timing skipped for {t}: {r}" for t, r in (m.get("reasons") or {}).items()]
            if env:
                parts.append(f"each time: median of {env['rounds']} rounds (ABBA order) of the median of "
                             f"{env['runs_per_round']} runs, L2 flushed before each run")
        return "Measurement: " + " · ".join(parts)


def _timing_cells(k: dict[str, Any]) -> str:
    t = k.get("timing") or {}
    if k.get("time_after_us") is not None:
        lo, hi = t.get("speedup_range", [k["speedup"], k["speedup"]])
        return (f"{k['time_before_us']:.2f} ±{t.get('spread_before_pct', 0):.1f}% | "
                f"{k['time_after_us']:.2f} ±{t.get('spread_after_pct', 0):.1f}% | "
                f"{k['speedup']:.3f}x ({lo:.3f}–{hi:.3f}) | ")
    why = t.get("error") or t.get("skipped") or ""
    return f"— | — | {('not timed: ' + why).replace('|', '/')[:120] if why else '—'} | "


def run_passes(cache_dir: str | Path, pipeline_spec: str, out_dir: str | Path, jobs: int = 1, timeout: float = 600.0,
               force: bool = False, on_kernel: Callable[[dict[str, Any]], None] | None = None,
               kernel_filter: str | None = None, dump_dir: str | Path | None = None,
               launches: str | Path | None = None, measure: bool = False,
               measure_fn: MeasureFn | None = None) -> RunReport:
    """Run `pipeline_spec` over every kernel under `cache_dir` and write overrides and a report to `out_dir`.

    With `launches` (a `kstrata record` directory), kernels are matched to their launch records; with
    `measure` too, changed kernels with a record are timed before and after (`measure_outcomes`;
    `measure_fn` replaces the timing child, for tests)."""
    from kstrata.ir.triton_layout import iter_cache_entries, override_keys_from_dump

    from .pipeline import parse_pipeline

    parse_pipeline(pipeline_spec)  # a bad pipeline fails here, before any work
    if measure and launches is None:
        raise KstrataError("--measure times kernels on replays of their recorded launches: give --launches DIR "
                           "(records from `kstrata record`)")
    record_index, unreadable = load_launch_records(launches) if launches is not None else ({}, [])
    src, out = Path(cache_dir), Path(out_dir)
    if not src.is_dir():
        raise KstrataError("no such cache or dump directory", path=src)
    if _inside(out, src) or _inside(src, out):
        raise KstrataError(f"the output directory {out} must not be inside the cache directory (or contain it): "
                           "kstrata never writes into a cache it reads", path=src)
    entries = [str(e) for e in iter_cache_entries(src)]
    if not entries:  # a dump directory: entries are directories holding a .ttgir
        entries = [str(d) for d in sorted(src.iterdir()) if d.is_dir() and any(d.glob("*.ttgir"))]
    if not entries:
        raise KstrataError("no kernels found (neither Triton cache entries nor dump entries)", path=src)
    if kernel_filter:
        entries = [e for e in entries if any(kernel_filter in f.name for f in Path(e).iterdir())]
    keys: dict[str, str | None] = {}
    if dump_dir is not None:
        by_binary = override_keys_from_dump(dump_dir)
        for entry in entries:
            binaries = [*Path(entry).glob("*.cubin"), *Path(entry).glob("*.hsaco")]
            digest = hashlib.sha256(binaries[0].read_bytes()).hexdigest() if binaries else ""
            keys[entry] = by_binary.get(digest)
    matched = {entry: match_record(entry, record_index) for entry in entries}
    for entry, record_path in matched.items():
        if record_path and not keys.get(entry):
            # `kstrata record` saw the source Triton compiled: its hash is the override key, so a plain
            # program run (no TRITON_KERNEL_DUMP) is enough for the kernels it launched
            keys[entry] = _record_override_key(record_path)
    (out / STATE_DIR).mkdir(parents=True, exist_ok=True)
    repro_dir = str(out / "repro")
    start = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    todo = []
    for entry in entries:
        state = _state_file(out, entry, pipeline_spec)
        if state.exists() and not force:
            results[entry] = json.loads(state.read_text())
            if on_kernel:
                on_kernel(results[entry])
        else:
            todo.append(entry)

    # the rewritten kernels are kept whole only when they may be timed
    candidate_root = out / STATE_DIR / "candidates" if launches is not None else None

    def save_state(entry: str, outcome: dict[str, Any]) -> None:
        state = _state_file(out, entry, pipeline_spec)
        tmp = state.with_suffix(f".tmp.{os.getpid()}.{id(entry)}")
        tmp.write_text(json.dumps(outcome, default=str))
        tmp.replace(state)

    def work(entry: str) -> dict[str, Any]:
        candidate_dir = str(candidate_root / _state_file(out, entry, pipeline_spec).stem) if candidate_root else None
        outcome = _run_child(entry, pipeline_spec, str(out), repro_dir, timeout, keys.get(entry), candidate_dir,
                             tool_env(matched[entry]), matched[entry])
        save_state(entry, outcome)
        return outcome

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for entry, outcome in zip(todo, pool.map(work, todo), strict=True):
            results[entry] = outcome
            if on_kernel:
                on_kernel(outcome)
    _mark_key_collisions([results[e] for e in entries])
    measure_info: dict[str, Any] | None = None
    if launches is not None:
        for entry in entries:
            results[entry]["launch_record"] = matched[entry]
        measure_info = {"launches": str(launches), "records": len(set(record_index.values())),
                        "matched": sum(1 for e in entries if matched[e]),
                        "unreadable": unreadable, "requested": measure}
        if measure:
            measure_info |= measure_outcomes([results[e] for e in entries], measure_fn, force,
                                             declared_tolerances(pipeline_spec))
            for entry in entries:
                save_state(entry, results[entry])
    report = RunReport(str(src), str(out), pipeline_spec, [results[e] for e in entries], time.perf_counter() - start,
                       measure_info)
    for name, text in (("run-passes-report.json", json.dumps(report.to_json(), indent=2, default=str) + "\n"),
                       ("run-passes-report.md", report.to_markdown())):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)
    return report


if __name__ == "__main__":
    # the per-kernel workers: python -m kstrata.passes.runner '[entry, pipeline, out, repro, key, candidates, record]'
    # or, for timing, '{"measure": [original entry, candidate entry, launch record]}'
    job = json.loads(sys.argv[1])
    if isinstance(job, dict):
        print(json.dumps(measure_kernel(*job["measure"]), default=str))
    else:
        print(json.dumps(process_kernel(*job), default=str))
