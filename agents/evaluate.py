"""The hardened evaluator: is a `ModelNew` candidate correct for a KernelBench task, and how fast is it?

`evaluate(task, candidate)` judges a candidate file as KernelBench's `eval_kernel_against_ref` does,
hardened against the ways a candidate can look correct or fast without being either:

- **Isolation.** The reference and the candidate each run in a fresh *spawned* Python process
  (`kstrata.agents.eval_worker`), one after the other, under a timeout. A crash, a hang, a CUDA error or a
  `sys.exit` in the candidate is a failed verdict with the reason, never a crash of the harness. The
  reference's outputs reach only this (parent) process, and their files are deleted before the candidate
  starts: a candidate cannot find the reference's result in its own memory or on disk. The values are
  compared here, in a process that never imported candidate code (a candidate can patch anything in its
  own process, `torch.allclose` included).
- **Trials.** `DEFAULT_TRIALS` (6) trials, each with fresh inputs made from the task's own `get_inputs()`
  under a per-trial seed (KernelBench's first seed is 42). Trial 0 uses them as they are; the next trials
  keep their shapes, dtypes, integer tensors and sign domain but replace the floating values by
  `DISTRIBUTIONS`: shifted and scaled, uniform with an offset, heavy-tailed, exact zeros (and -0.0) with
  flipped signs, then the task's own distribution under another seed. A shortcut that holds for zero-mean
  normal inputs (a constant, a dropped term) fails there.
- **Same addresses, new data.** Every trial writes its inputs *into the same input tensors* (in place), so
  a cache keyed by pointer, shape or tensor identity returns stale results and fails.
- **Poisoned allocations.** Before each call the candidate process empties the caching allocator and
  then allocates, fills with 0xFF bytes (NaN in every float format) and frees a large block and a set of
  small ones, so an output made by `torch.empty` and not fully written holds NaN, not a leftover result.
- **Integrity checks** (each trial): inputs are hashed before and after the call (a candidate must not
  write to its inputs); an output must not share storage with an input or with an earlier trial's output
  (those are kept alive); the outputs are copied on the current stream the moment `forward` returns,
  *before* any synchronize, and after a device-wide synchronize (and a pause on the CPU) the copy must
  equal the output: work left running on another stream or in a background thread changes it; the copy
  is what is judged. `torch.cuda.current_stream()` must be unchanged, and no thread started by the
  candidate's own code may outlive the call.
- **Timer integrity.** The worker takes references to `time.perf_counter`, `torch.cuda.Event` (and its
  `record`, `elapsed_time`, `synchronize`), `torch.cuda.synchronize`, `torch.cuda.current_stream` and the
  tensor methods it relies on *before* importing the candidate, times only through those references, and
  checks after the import and after every call that the module attributes still are those objects.
- **Shape, dtype and structure** of every output must match the reference's.

Correctness policies (`POLICIES`). Both are computed for every trial and reported; `policy` picks which
one decides the verdict.

- `kernelbench`: KernelBench's own check, `torch.allclose(ref, out, atol=tol, rtol=tol)` with the
  tolerance by precision of `get_tolerance_for_precision` in KernelBench's `src/eval.py` (commit 01f92ad):
  fp32 1e-4, fp16 1e-2, bf16 1e-2 ("inspired by torchbench"; its comment notes that KernelBench v0 and
  v0.1 used atol = rtol = 1e-2 for fp32). We pass `equal_nan=True` (KernelBench does not) because the
  non-normal trials can make a reference produce NaN. `kernelbench_task_inputs` reports the same check on
  the task's own inputs only, the figure that compares with published KernelBench results.
- `strict` (default): the reference is also run in float64 (model and floating inputs cast to double)
  and both the fp32/fp16/bf16 PyTorch reference and the candidate are measured against it, by the
  largest absolute error and the relative L2 error over the finite elements. The candidate passes when
  for both measures `err_candidate <= STRICT_FACTOR * err_reference + STRICT_FLOOR_EPS * eps(dtype) * s`
  (s: the largest |value| for the absolute measure, 1 for the relative one). Measured on an H200 for a
  4096^3 fp32 GEMM, the relative errors are fp32 8.4e-7, TF32 2.8e-5, bf16 1.8e-3: the bound is
  4 * 8.4e-7 + 8 * 1.2e-7 = 4.3e-6, so TF32 (33x the fp32 error) and bf16 are rejected where
  KernelBench's 1e-4 lets TF32 pass. (kstrata's own run on an H200, 2026-11-30, torch 2.11, on the suite
  task `level1/01_square_gemm_fp32` with randn inputs, relative L2 error: fp32 1.15e-6, TF32 2.94e-4,
  bf16 2.88e-3; strict bound 5.5e-6 — both rejected, and at that error TF32 also fails KernelBench's
  elementwise 1e-4.) The floor admits a few ULPs of legitimate difference (a different
  but exact-enough `exp`) where PyTorch's own error is near zero (ReLU, copies). When the float64 run
  fails (an op without float64 support), strict falls back to the kernelbench check and says so.
  Under `strict` the reference process runs fp32 as IEEE fp32: TF32 off for matmuls and for cuDNN
  convolutions (PyTorch's default `torch.backends.cudnn.allow_tf32 = True` makes eager fp32 convolutions
  TF32; on the H200 the suite's fp32 convolution tasks ran up to 2x faster than the fp32 speed of light
  for that reason). A candidate that keeps PyTorch's TF32 convolutions is then a precision downgrade
  under `strict`; under `kernelbench` the reference keeps PyTorch's defaults, as KernelBench does.
  Integer and boolean outputs must match exactly under both policies. Where the reference is NaN or
  infinite the candidate must be the same non-finite value.

Timing (`Timing`, when a GPU is present): CUDA events, a device-wide synchronize before the end event,
the L2 flushed before every run, warm-up, the median of `runs` (>= 100) runs with the 10th/90th
percentiles, optionally through a CUDA graph. The reference is timed the same way in its own process.
The speedup and the roofline fraction (`kstrata.agents.roofline`) go into the verdict; a result above
speed of light or more than `roofline.SUSPICIOUS_SPEEDUP` faster is flagged and not accepted.

What the candidate process could still forge: its own report of the integrity checks (it can patch the
worker). The values it returns cannot be forged that way: they are judged here.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from kstrata.ir.errors import KstrataError

#: The version of `EvalVerdict.to_json()`'s layout.
EVAL_VERDICT_SCHEMA = "kstrata.eval-verdict/1"

#: KernelBench's `get_tolerance_for_precision` (src/eval.py, commit 01f92ad): used as atol = rtol.
KERNELBENCH_TOLERANCE: dict[str, float] = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}

#: The candidate's error against float64 may be this many times the PyTorch reference's own error ...
STRICT_FACTOR = 4.0
#: ... plus this many machine epsilons of the output dtype (times the largest |value| for absolute error).
STRICT_FLOOR_EPS = 8.0

POLICIES = ("strict", "kernelbench")
#: Trial i uses DISTRIBUTIONS[i % len(DISTRIBUTIONS)]; "task" is the task's own get_inputs() values.
DISTRIBUTIONS = ("task", "shifted-scaled", "uniform-offset", "heavy-tailed", "zeros-negatives", "task")
DEFAULT_TRIALS = 6
MIN_TRIALS = 5
#: KernelBench's seed.
DEFAULT_SEED = 42
DEFAULT_TIMEOUT_S = 600.0


class EvalError(KstrataError):
    """The harness itself could not run (bad task file, no such candidate, bad options): not a verdict."""


# ---------------------------------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    """One integrity check: its name, whether it held, and what a person should know when it did not."""

    name: str
    ok: bool
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class OutputComparison:
    """One output tensor of one trial, compared with the reference (and with the float64 reference)."""

    output: str
    dtype: str
    kernelbench_ok: bool
    kernelbench_tolerance: float | None
    strict_ok: bool
    strict_basis: str  # "float64" or why strict fell back to the kernelbench check
    max_abs_vs_ref: float
    candidate_max_abs: float | None = None  # against float64
    candidate_rel_l2: float | None = None
    reference_max_abs: float | None = None  # the PyTorch reference's own error against float64
    reference_rel_l2: float | None = None
    strict_bound_max_abs: float | None = None
    strict_bound_rel_l2: float | None = None
    nonfinite_mismatches: int = 0
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class TrialResult:
    """One trial: its inputs' distribution and seed, the integrity checks and the output comparisons."""

    index: int
    distribution: str
    seed: int
    checks: tuple[Check, ...]
    outputs: tuple[OutputComparison, ...]

    @property
    def integrity_ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def passes(self, policy: str) -> bool:
        key = "strict_ok" if policy == "strict" else "kernelbench_ok"
        return self.integrity_ok and bool(self.outputs) and all(getattr(o, key) for o in self.outputs)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "distribution": self.distribution, "seed": self.seed,
                "integrity_ok": self.integrity_ok, "strict_ok": self.passes("strict"),
                "kernelbench_ok": self.passes("kernelbench"),
                "checks": [c.to_json() for c in self.checks], "outputs": [o.to_json() for o in self.outputs]}


@dataclass(frozen=True)
class Timing:
    """Times in microseconds over `runs` timed runs (CUDA events, L2 flushed before each)."""

    median_us: float
    p10_us: float
    p90_us: float
    min_us: float
    runs: int
    cuda_graph: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timing:
        return cls(**data)


@dataclass(frozen=True)
class EvalVerdict:
    """Whether a candidate is accepted for a task, why (or why not), and what was measured."""

    task: str
    candidate: str
    policy: str
    accepted: bool
    reason: str  # one line a person can act on
    correct_strict: bool
    correct_kernelbench: bool
    correct_kernelbench_task_inputs: bool
    failure: str | None  # "crash", "timeout", "import", "integrity", "mismatch", "shape", "flagged", None
    trials: tuple[TrialResult, ...] = ()
    checks: tuple[Check, ...] = ()  # checks over the whole run (timer integrity after import, ...)
    reference_timing: Timing | None = None
    candidate_timing: Timing | None = None
    speedup: float | None = None
    roofline: dict[str, Any] | None = None
    flags: tuple[str, ...] = ()
    device: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    log_tail: str = ""
    schema: str = EVAL_VERDICT_SCHEMA

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema, "task": self.task, "candidate": self.candidate, "policy": self.policy,
            "accepted": self.accepted, "reason": self.reason, "failure": self.failure,
            "correct": {"strict": self.correct_strict, "kernelbench": self.correct_kernelbench,
                        "kernelbench_task_inputs": self.correct_kernelbench_task_inputs},
            "checks": [c.to_json() for c in self.checks], "trials": [t.to_json() for t in self.trials],
            "reference_timing": self.reference_timing.to_json() if self.reference_timing else None,
            "candidate_timing": self.candidate_timing.to_json() if self.candidate_timing else None,
            "speedup": self.speedup, "roofline": self.roofline, "flags": list(self.flags),
            "device": self.device, "versions": self.versions, "log_tail": self.log_tail,
        }


# ---------------------------------------------------------------------------------------------------
# Tolerances and the precision policy (pure arithmetic; no process, no GPU)
# ---------------------------------------------------------------------------------------------------
def kernelbench_tolerance(dtype: torch.dtype | str) -> float | None:
    """KernelBench's atol = rtol for an output dtype (None for integer and boolean outputs)."""
    name = str(dtype).removeprefix("torch.")
    if name in KERNELBENCH_TOLERANCE:
        return KERNELBENCH_TOLERANCE[name]
    if name == "float64":
        return KERNELBENCH_TOLERANCE["float32"]
    return None


def strict_bounds(dtype: torch.dtype, reference_max_abs: float, reference_rel_l2: float,
                  scale: float) -> tuple[float, float]:
    """The largest absolute and relative-L2 errors against float64 that `strict` admits for a candidate."""
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return (STRICT_FACTOR * reference_max_abs + STRICT_FLOOR_EPS * eps * scale,
            STRICT_FACTOR * reference_rel_l2 + STRICT_FLOOR_EPS * eps)


def _errors_against(x: torch.Tensor, truth: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """Largest absolute error and relative L2 error of `x` against `truth`, over `mask`."""
    if not bool(mask.any()):
        return 0.0, 0.0
    d = (x[mask] - truth[mask]).abs()
    t = truth[mask]
    max_abs = float(d.max())
    norm = float(torch.linalg.vector_norm(t))
    rel = float(torch.linalg.vector_norm(d)) / norm if norm > 0 else float(torch.linalg.vector_norm(d))
    return max_abs, rel


def _nonfinite_mismatches(ref: torch.Tensor, out: torch.Tensor) -> int:
    """Elements where the reference is NaN/inf and the candidate differs, or the candidate alone is."""
    ref_nan, out_nan = ref.isnan(), out.isnan()
    ref_inf, out_inf = ref.isinf(), out.isinf()
    bad = (ref_nan != out_nan) | (ref_inf != out_inf) | (ref_inf & out_inf & (ref.sign() != out.sign()))
    return int(bad.sum())


def compare_output(name: str, ref: Any, out: Any, ref64: Any, *, fp64_note: str = "") -> OutputComparison:
    """Compare one candidate output with the reference output (and the float64 reference, if given).

    Shapes and dtypes are checked by the caller. Works on CPU or GPU tensors and on plain values.
    """
    if not isinstance(ref, torch.Tensor):
        same = bool(ref == out) if not isinstance(ref, float) else (
            ref == out or (math.isnan(ref) and isinstance(out, float) and math.isnan(out)))
        return OutputComparison(name, type(ref).__name__, same, None, same, "exact (not a tensor)", 0.0 if same else math.inf,
                                detail="" if same else f"expected {ref!r}, got {out!r}")
    dtype = ref.dtype
    if not (dtype.is_floating_point or dtype.is_complex):
        eq = bool(torch.equal(ref, out))
        diff = 0 if eq else int((ref != out).sum())
        return OutputComparison(name, str(dtype).removeprefix("torch."), eq, None, eq, "exact (integer output)",
                                0.0 if eq else math.inf, detail="" if eq else f"{diff} of {ref.numel()} elements differ")
    r = ref.to(torch.float64)
    o = out.to(torch.float64)
    tol = kernelbench_tolerance(dtype)
    assert tol is not None
    kb_ok = bool(torch.allclose(r, o, atol=tol, rtol=tol, equal_nan=True))
    nonfinite = _nonfinite_mismatches(r, o)
    finite = r.isfinite() & o.isfinite()
    max_abs_vs_ref = _errors_against(o, r, finite)[0] if nonfinite == 0 else math.inf
    dname = str(dtype).removeprefix("torch.")
    if ref64 is None or not isinstance(ref64, torch.Tensor) or ref64.shape != ref.shape:
        why = fp64_note or "no float64 reference"
        detail = "" if kb_ok else _where_worst(r, o, tol)
        return OutputComparison(name, dname, kb_ok, tol, kb_ok, f"kernelbench ({why})", max_abs_vs_ref,
                                nonfinite_mismatches=nonfinite, detail=detail)
    t = ref64.to(device=r.device, dtype=torch.float64)
    mask = finite & t.isfinite()
    ref_abs, ref_rel = _errors_against(r, t, mask)
    cand_abs, cand_rel = _errors_against(o, t, mask)
    scale = float(t[mask].abs().max()) if bool(mask.any()) else 0.0
    bound_abs, bound_rel = strict_bounds(dtype, ref_abs, ref_rel, scale)
    strict_ok = nonfinite == 0 and cand_abs <= bound_abs and cand_rel <= bound_rel
    detail = ""
    if nonfinite:
        detail = f"{nonfinite} elements are NaN/inf where the reference is not, or the other way round"
    elif not strict_ok:
        detail = (f"error against float64 {cand_rel:.3g} relative (bound {bound_rel:.3g}), {cand_abs:.3g} max abs "
                  f"(bound {bound_abs:.3g}); PyTorch's own {dname} error is {ref_rel:.3g} relative, {ref_abs:.3g} max abs")
        if not kb_ok:  # where: what a person (or a model refining the candidate) needs to find the bug
            detail += "; " + _where_worst(r, o, tol)
    elif not kb_ok:
        detail = _where_worst(r, o, tol)
    return OutputComparison(name, dname, kb_ok, tol, strict_ok, "float64", max_abs_vs_ref, cand_abs, cand_rel,
                            ref_abs, ref_rel, bound_abs, bound_rel, nonfinite, detail)


def _where_worst(r: torch.Tensor, o: torch.Tensor, tol: float) -> str:
    excess = ((r - o).abs() - tol * r.abs()).nan_to_num(nan=math.inf)
    flat = int(excess.reshape(-1).argmax()) if excess.numel() else 0
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), r.shape)) if r.dim() else ()
    bad = int((excess > tol).sum())
    return (f"{bad} of {r.numel()} elements outside atol=rtol={tol:g}; worst at {list(idx)}: "
            f"expected {float(r.reshape(-1)[flat]):.6g}, got {float(o.reshape(-1)[flat]):.6g}")


# ---------------------------------------------------------------------------------------------------
# Running the two processes
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerRun:
    """What one worker process left: its report (None if it died before writing one) and how it ended."""

    role: str
    report: dict[str, Any] | None
    returncode: int | None
    timed_out: bool
    log_tail: str
    workdir: Path
    elapsed_s: float

    def failure(self) -> str | None:
        """None when the worker finished and reported; otherwise why it did not, in one line."""
        if self.timed_out:
            return f"the {self.role} timed out (killed)"
        if self.report is None:
            rc = self.returncode
            if rc is not None and rc < 0:
                try:
                    how = f"signal {signal.Signals(-rc).name}"
                except ValueError:
                    how = f"signal {-rc}"
            else:
                how = f"exit code {rc}"
            last = _last_line(self.log_tail)
            return f"the {self.role} process died ({how}) before reporting" + (f": {last}" if last else "")
        return None


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _scratch_root() -> str | None:
    """RAM-backed scratch space for the outputs when there is plenty of it, else the default temp dir."""
    shm = Path("/dev/shm")
    try:
        roomy = shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > (16 << 30)
    except OSError:
        roomy = False
    return str(shm) if roomy else None


def run_worker(role: str, task: Path, candidate: Path | None, *, device: str, trials: int, seed: int,
               timeout_s: float, timing: bool, runs: int, cuda_graph: bool, workdir: Path,
               policy: str = "strict", env: dict[str, str] | None = None) -> WorkerRun:
    """Spawn `python -m kstrata.agents.eval_worker` for one role and wait for it (or kill it at the timeout)."""
    import time

    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "kstrata.agents.eval_worker", "--role", role, "--task", str(task),
           "--workdir", str(workdir), "--device", device, "--trials", str(trials), "--seed", str(seed),
           "--runs", str(runs), "--policy", policy]
    if candidate is not None:
        cmd += ["--candidate", str(candidate)]
    if timing:
        cmd.append("--timing")
    if cuda_graph:
        cmd.append("--cuda-graph")
    log_path = workdir / "log.txt"
    # `env`: a restricted environment (kstrata.agents.llm.sandbox) for generated candidates.
    env = dict(os.environ) if env is None else dict(env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if device == "cpu":
        # Without a GPU Triton has no driver ("0 active drivers"): @triton.jit kernels run on CPU tensors
        # under Triton's interpreter, which reads this before the candidate's kernels are decorated.
        env["TRITON_INTERPRET"] = "1"
    start = time.monotonic()
    with log_path.open("wb") as log:
        # A new session: the timeout kills the worker and everything it started (a candidate's helpers too).
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    elapsed = time.monotonic() - start
    tail = log_path.read_text(errors="replace")[-4000:] if log_path.exists() else ""
    report_path = workdir / "report.json"
    report = None
    if report_path.exists() and not timed_out:
        try:
            report = json.loads(report_path.read_text())
        except (json.JSONDecodeError, OSError):
            report = None
    return WorkerRun(role, report, proc.returncode, timed_out, tail, workdir, elapsed)


def _load_trial(workdir: Path, index: int) -> dict[str, Any]:
    path = workdir / f"trial{index}.pt"
    data: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    path.unlink()
    return data


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def evaluate(task: str | Path, candidate: str | Path, *, policy: str = "strict", trials: int = DEFAULT_TRIALS,
             seed: int = DEFAULT_SEED, device: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
             timing: bool | None = None, runs: int = 100, cuda_graph: bool = False,
             ceilings: Any = None, env: dict[str, str] | None = None) -> EvalVerdict:
    """Judge `candidate` (a file defining `ModelNew`) against `task` (a KernelBench problem file).

    Returns a verdict; raises `EvalError` only when the harness cannot run at all (a missing file, a
    task that does not load, bad options).
    """
    from kstrata.agents.tasks import load_task

    task, candidate = Path(task), Path(candidate)
    if policy not in POLICIES:
        raise EvalError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if trials < MIN_TRIALS:
        raise EvalError(f"at least {MIN_TRIALS} trials are needed, got {trials}")
    if not candidate.is_file():
        raise EvalError("no such candidate file", path=candidate)
    spec = load_task(task).spec  # a bad task file is the user's error, reported before anything runs
    device = device or default_device()
    timing = (device == "cuda") if timing is None else timing
    scratch = Path(tempfile.mkdtemp(prefix="kstrata-eval-", dir=_scratch_root()))
    try:
        kw: dict[str, Any] = {"device": device, "trials": trials, "seed": seed, "timeout_s": timeout_s,
                              "timing": timing, "runs": runs, "cuda_graph": cuda_graph, "policy": policy,
                              "env": env}
        ref = run_worker("reference", task, None, workdir=scratch / "reference", **kw)
        base = {"task": str(task), "candidate": str(candidate), "policy": policy}
        if ref.failure() or not (ref.report or {}).get("ok"):
            why = ref.failure() or (ref.report or {}).get("error", "unknown error")
            raise EvalError(f"the reference itself failed, so nothing can be judged: {why}", path=task)
        assert ref.report is not None
        ref_trials = [_load_trial(ref.workdir, i) for i in range(trials)]
        shutil.rmtree(ref.workdir, ignore_errors=True)  # gone before the candidate starts
        cand = run_worker("candidate", task, candidate, workdir=scratch / "candidate", **kw)
        return _judge(base, spec, ref, ref_trials, cand, trials, ceilings)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _verdict(base: dict[str, Any], *, accepted: bool, reason: str, failure: str | None, **kw: Any) -> EvalVerdict:
    defaults: dict[str, Any] = {"correct_strict": False, "correct_kernelbench": False,
                                "correct_kernelbench_task_inputs": False}
    defaults.update(kw)
    return EvalVerdict(accepted=accepted, reason=reason, failure=failure, **base, **defaults)


def _judge(base: dict[str, Any], spec: Any, ref: WorkerRun, ref_trials: list[dict[str, Any]], cand: WorkerRun,
           n_trials: int, ceilings: Any) -> EvalVerdict:
    assert ref.report is not None
    env = {"device": ref.report.get("device_name", ""), "versions": ref.report.get("versions", {})}
    failure = cand.failure()
    if failure:
        kind = "timeout" if cand.timed_out else "crash"
        return _verdict(base, accepted=False, reason=failure, failure=kind, log_tail=cand.log_tail[-2000:], **env)
    report = cand.report
    assert report is not None
    run_checks = tuple(Check(**c) for c in report.get("checks", []))
    if not report.get("ok"):
        phase = report.get("phase", "run")
        return _verdict(base, accepted=False, reason=f"the candidate failed in {phase}: {report.get('error')}",
                        failure="import" if phase in ("import", "init") else "crash", checks=run_checks,
                        log_tail=cand.log_tail[-2000:], **env)
    results: list[TrialResult] = []
    for i in range(n_trials):
        rt = ref_trials[i]
        try:
            ct = _load_trial(cand.workdir, i)
            info = report["trials"][i]
        except Exception as exc:  # deleted, forged or unreadable (weights_only refuses arbitrary objects)
            return _verdict(base, accepted=False, failure="integrity", checks=run_checks, **env,
                            reason=f"trial {i}: the candidate's outputs could not be read back "
                                   f"({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}); return tensors (or plain numbers)")
        checks = [Check(**c) for c in info["checks"]]
        if rt["input_digest"] != ct["input_digest"]:
            checks.append(Check("same-inputs", False, "the candidate process saw different inputs than the reference "
                                "(non-deterministic get_inputs?)"))
        outputs: list[OutputComparison] = []
        shape_problem = _structure_problem(rt["outputs"], ct["outputs"])
        if shape_problem:
            checks.append(Check("shape-dtype", False, shape_problem))
        else:
            checks.append(Check("shape-dtype", True))
            ref64 = rt.get("outputs64")
            for j, (r, o) in enumerate(zip(rt["outputs"], ct["outputs"], strict=True)):
                r64 = ref64[j] if ref64 is not None else None
                outputs.append(compare_output(f"output{j}", _dev(r), _dev(o), _dev(r64), fp64_note=rt.get("fp64_note", "")))
        results.append(TrialResult(i, info["distribution"], info["seed"], tuple(checks), tuple(outputs)))
    strict_ok = all(t.passes("strict") for t in results) and all(c.ok for c in run_checks)
    kb_ok = all(t.passes("kernelbench") for t in results) and all(c.ok for c in run_checks)
    kb_task = all(t.passes("kernelbench") for t in results if t.distribution == "task") and all(c.ok for c in run_checks)
    correct = strict_ok if base["policy"] == "strict" else kb_ok
    ref_timing = Timing.from_json(ref.report["timing"]) if ref.report.get("timing") else None
    cand_timing = Timing.from_json(report["timing"]) if report.get("timing") else None
    speedup = ref_timing.median_us / cand_timing.median_us if ref_timing and cand_timing else None
    flags: list[str] = []
    roof = None
    if cand_timing and ceilings is not None:
        from kstrata.agents.roofline import assess

        point = assess(spec, ceilings, cand_timing.median_us * 1e-6, speedup)
        roof = point.to_json()
        flags.extend(point.flags)
    reason, failure_kind = _reason(results, run_checks, base["policy"], correct)
    accepted = correct and not flags
    if correct and flags:
        reason, failure_kind = "correct, but flagged and not accepted until explained: " + "; ".join(flags), "flagged"
    return _verdict(base, accepted=accepted, reason=reason, failure=failure_kind, correct_strict=strict_ok,
                    correct_kernelbench=kb_ok, correct_kernelbench_task_inputs=kb_task, trials=tuple(results),
                    checks=run_checks, reference_timing=ref_timing, candidate_timing=cand_timing, speedup=speedup,
                    roofline=roof, flags=tuple(flags), log_tail=cand.log_tail[-1000:], **env)


def _dev(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and torch.cuda.is_available():
        return x.to("cuda")
    return x


def _structure_problem(ref: list[Any], out: list[Any]) -> str:
    if len(ref) != len(out):
        return f"expected {len(ref)} outputs, got {len(out)}"
    for j, (r, o) in enumerate(zip(ref, out, strict=True)):
        if isinstance(r, torch.Tensor) != isinstance(o, torch.Tensor):
            return f"output {j}: expected {type(r).__name__}, got {type(o).__name__}"
        if isinstance(r, torch.Tensor):
            if tuple(r.shape) != tuple(o.shape):
                return f"output {j}: expected shape {list(r.shape)}, got {list(o.shape)}"
            if r.dtype != o.dtype:
                return f"output {j}: expected dtype {r.dtype}, got {o.dtype}"
    return ""


def _reason(results: list[TrialResult], run_checks: tuple[Check, ...], policy: str, correct: bool) -> tuple[str, str | None]:
    for c in run_checks:
        if not c.ok:
            return f"{c.name}: {c.detail}", "integrity"
    for t in results:
        for c in t.checks:
            if not c.ok:
                kind = "shape" if c.name == "shape-dtype" else "integrity"
                return f"trial {t.index} ({t.distribution}): {c.name}: {c.detail}", kind
    if correct:
        return f"correct under the {policy} policy on all {len(results)} trials", None
    key = "strict_ok" if policy == "strict" else "kernelbench_ok"
    for t in results:
        for o in t.outputs:
            if not getattr(o, key):
                what = "precision policy strict" if policy == "strict" and o.kernelbench_ok else "values differ"
                return f"trial {t.index} ({t.distribution} inputs), {o.output}: {what}: {o.detail}", "mismatch"
    return "incorrect", "mismatch"
