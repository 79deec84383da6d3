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
  for both measures `err_candidate <= STRICT_FACTOR * err_reference + floor * eps(dtype) * s`
  (s: the largest |value| for the absolute measure, 1 for the relative one; floor `STRICT_FLOOR_EPS` = 8
  for the absolute measure, `STRICT_FLOOR_EPS_REL_L2` = 2 for the relative one). Measured on an H200 for a
  4096^3 fp32 GEMM, the relative errors are fp32 8.4e-7, TF32 2.8e-5, bf16 1.8e-3: the bound is
  4 * 8.4e-7 + 2 * 1.2e-7 = 3.6e-6, so TF32 (33x the fp32 error) and bf16 are rejected where
  KernelBench's 1e-4 lets TF32 pass. (kstrata's own run on an H200, 2026-11-30, torch 2.11, on the suite
  task `level1/01_square_gemm_fp32` with randn inputs, relative L2 error: fp32 1.15e-6, TF32 2.94e-4,
  bf16 2.88e-3; strict bound 4.8e-6 (5.5e-6 with the relative floor of 8 ulps then) — both rejected, and at that error TF32 also fails KernelBench's
  elementwise 1e-4.) The floor admits a few ULPs of legitimate difference (a different
  but exact-enough `exp`) where PyTorch's own error is near zero (ReLU, copies). When the float64 run
  fails (an op without float64 support), strict falls back to the kernelbench check and says so.
  Under `strict` the reference process runs fp32 as IEEE fp32: TF32 off for matmuls and for cuDNN
  convolutions (PyTorch's default `torch.backends.cudnn.allow_tf32 = True` lets cuDNN run fp32
  convolutions in TF32, by shape and layout; on the H200 the suite's fp32 convolution tasks ran up to 2x
  faster than the fp32 speed of light for that reason). A candidate that keeps PyTorch's TF32 convolutions is then a precision downgrade
  under `strict`; under `kernelbench` the reference keeps PyTorch's defaults, as KernelBench does.
  Integer and boolean outputs must match exactly under both policies. Where the reference is NaN or
  infinite the candidate must be the same non-finite value.

Timing (`Timing`, when a GPU is present): CUDA events, a device-wide synchronize before the end event,
the L2 flushed before every run, warm-up, the median of `runs` (>= 100) runs with the 10th/90th
percentiles, optionally through a CUDA graph. The reference is timed the same way in its own process.
The speedup and the roofline fraction (`kstrata.agents.roofline`) go into the verdict; a result above
speed of light, or more than `roofline.SUSPICIOUS_SPEEDUP` faster than the reference without the roofline
explaining it (the reference far below SOL, the candidate not above it), is flagged and not accepted; an
explained one is accepted and its reason says why ("eager at 1.7% of SOL, candidate at 53%").

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

from kstrata.backends.child import host_available_memory, kill_tree, spawn
from kstrata.backends.timing import Timing
from kstrata.ir.errors import KstrataError

#: The version of `EvalVerdict.to_json()`'s layout.
EVAL_VERDICT_SCHEMA = "kstrata.eval-verdict/1"

#: KernelBench's `get_tolerance_for_precision` (src/eval.py, commit 01f92ad): used as atol = rtol.
KERNELBENCH_TOLERANCE: dict[str, float] = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}

#: The candidate's error against float64 may be this many times the PyTorch reference's own error ...
STRICT_FACTOR = 4.0
#: ... plus this many machine epsilons of the output dtype times the largest |value| (absolute error: a few
#: ULPs of legitimate difference in any one element, a different but exact-enough `exp`) ...
STRICT_FLOOR_EPS = 8.0
#: ... or this many for the relative L2 error over all elements: a correctly rounded result is within half
#: an ULP everywhere, so a candidate that differs by an ULP or two in every element stays within it, while a
#: systematic error is not hidden in the floor. With 8 here (the absolute floor's), fp16's floor of 7.8e-3 let
#: a GEMM + logsumexp that leaves out 6 of its 150 columns pass (relative L2 5.0e-3; PyTorch's own 3.1e-4).
STRICT_FLOOR_EPS_REL_L2 = 2.0

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
    #: What scales the strict bound: "pytorch" (the PyTorch reference's own error), or "tf32" (larger: the
    #: error of TF32 rounding in the operations the reference's precision settings let run in TF32).
    strict_scale: str = "pytorch"
    allowance_max_abs: float | None = None  # the TF32 rounding's error against float64, when computed
    allowance_rel_l2: float | None = None

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
    #: PyTorch's precision switches in the reference and the candidate process (TF32, reduced-precision reductions).
    precision: dict[str, Any] = field(default_factory=dict)
    #: Peak host and GPU memory of each process (bytes) and the plan made before anything ran.
    memory: dict[str, Any] = field(default_factory=dict)
    #: Why there is no timing, when there is none ("skipped: ...").
    timing_note: str = ""
    #: Where the reference's trials came from: "run" (this evaluation), or "cache KEY" (an identical untimed
    #: run kept by `kstrata.agents.reference_cache`).
    reference_source: str = "run"
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
            "precision": self.precision, "memory": self.memory, "timing_note": self.timing_note or None,
            "reference_source": self.reference_source,
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
            STRICT_FACTOR * reference_rel_l2 + STRICT_FLOOR_EPS_REL_L2 * eps)


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


def compare_output(name: str, ref: Any, out: Any, ref64: Any, *, fp64_note: str = "",
                   allowance: dict[str, float] | None = None) -> OutputComparison:
    """Compare one candidate output with the reference output (and the float64 reference, if given).

    Shapes and dtypes are checked by the caller. Works on CPU or GPU tensors and on plain values.
    `allowance`: the error against float64 that the reference's precision settings admit besides its own
    (`{"max_abs", "rel_l2"}` of TF32 rounding: `eval_worker.tf32_allowance`); the strict bound is scaled by
    the larger of the two. PyTorch's default `cudnn.allow_tf32 = True` lets cuDNN pick a TF32 algorithm for
    an fp32 convolution, or not, by shape and memory layout: on the H200 an eager NCHW convolution came
    out IEEE-exact (1.9e-7 relative) while torch.compile's, under the same settings, was TF32 (2.9e-4).
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
    tol = kernelbench_tolerance(dtype)
    assert tol is not None
    dname = str(dtype).removeprefix("torch.")
    t = ref64 if isinstance(ref64, torch.Tensor) and ref64.shape == ref.shape else None
    st = _chunked_stats(ref, out, t, tol)
    kb_ok, nonfinite = st["kb_ok"], st["nonfinite"]
    max_abs_vs_ref = st["max_abs_vs_ref"] if nonfinite == 0 else math.inf
    if t is None:
        why = fp64_note or "no float64 reference"
        return OutputComparison(name, dname, kb_ok, tol, kb_ok, f"kernelbench ({why})", max_abs_vs_ref,
                                nonfinite_mismatches=nonfinite, detail=st["worst"])
    ref_abs, cand_abs, scale = st["ref_abs"], st["cand_abs"], st["scale"]
    norm = math.sqrt(st["t_sq"])
    ref_rel = math.sqrt(st["ref_sq"]) / norm if norm > 0 else math.sqrt(st["ref_sq"])
    cand_rel = math.sqrt(st["cand_sq"]) / norm if norm > 0 else math.sqrt(st["cand_sq"])
    al_abs = float(allowance["max_abs"]) if allowance else None
    al_rel = float(allowance["rel_l2"]) if allowance else None
    tf32 = al_abs is not None and al_rel is not None and (al_abs > ref_abs or al_rel > ref_rel)
    bound_abs, bound_rel = strict_bounds(dtype, max(ref_abs, al_abs or 0.0), max(ref_rel, al_rel or 0.0), scale)
    strict_ok = nonfinite == 0 and cand_abs <= bound_abs and cand_rel <= bound_rel
    detail = ""
    if nonfinite:
        detail = f"{nonfinite} elements are NaN/inf where the reference is not, or the other way round"
    elif not strict_ok:
        detail = (f"error against float64 {cand_rel:.3g} relative (bound {bound_rel:.3g}), {cand_abs:.3g} max abs "
                  f"(bound {bound_abs:.3g}); PyTorch's own {dname} error is {ref_rel:.3g} relative, {ref_abs:.3g} max abs")
        if tf32:
            detail += f"; TF32 rounding, which its settings allow, gives {al_rel:.3g} relative, {al_abs:.3g} max abs"
        if not kb_ok and st["worst"]:  # where: what a person (or a model refining the candidate) needs
            detail += "; " + st["worst"]
    elif not kb_ok:
        detail = st["worst"]
    return OutputComparison(name, dname, kb_ok, tol, strict_ok, "float64", max_abs_vs_ref, cand_abs, cand_rel,
                            ref_abs, ref_rel, bound_abs, bound_rel, nonfinite, detail,
                            "tf32" if tf32 else "pytorch", al_abs, al_rel)


#: Outputs are compared in chunks of this many elements (float64 copies of a 6.4 GB fp32 output would
#: need 4 x 12.8 GB at once): the statistics are maxima and sums of squares, exact per chunk.
COMPARE_CHUNK = 1 << 26


def _chunked_stats(ref: torch.Tensor, out: torch.Tensor, ref64: torch.Tensor | None, tol: float) -> dict[str, Any]:
    """allclose, non-finite mismatches, max |out - ref|, and (with `ref64`) the errors of `ref` and `out`
    against it (max abs, sums of squares) and the largest |ref64|, over the finite elements, chunk by chunk."""
    st: dict[str, Any] = {"kb_ok": True, "nonfinite": 0, "max_abs_vs_ref": 0.0, "ref_abs": 0.0, "cand_abs": 0.0,
                          "ref_sq": 0.0, "cand_sq": 0.0, "t_sq": 0.0, "scale": 0.0, "worst": ""}
    rf, of = ref.reshape(-1), out.reshape(-1)
    tf = ref64.reshape(-1) if ref64 is not None else None
    device = "cuda" if torch.cuda.is_available() else rf.device
    for lo in range(0, max(rf.numel(), 1), COMPARE_CHUNK):
        r = rf[lo:lo + COMPARE_CHUNK].to(device=device, dtype=torch.float64)
        o = of[lo:lo + COMPARE_CHUNK].to(device=device, dtype=torch.float64)
        close = bool(torch.allclose(r, o, atol=tol, rtol=tol, equal_nan=True))
        if not close and st["kb_ok"] and rf.numel() <= COMPARE_CHUNK:
            st["worst"] = _where_worst(ref.to(device=device, dtype=torch.float64), out.to(device=device,
                                       dtype=torch.float64), tol)
        elif not close and st["kb_ok"]:
            st["worst"] = f"in elements {lo}..{lo + r.numel()} (flat): " + _where_worst(r, o, tol)
        st["kb_ok"] &= close
        st["nonfinite"] += _nonfinite_mismatches(r, o)
        finite = r.isfinite() & o.isfinite()
        if bool(finite.any()):
            st["max_abs_vs_ref"] = max(st["max_abs_vs_ref"], float((o[finite] - r[finite]).abs().max()))
        if tf is None:
            continue
        t = tf[lo:lo + COMPARE_CHUNK].to(device=device, dtype=torch.float64)
        mask = finite & t.isfinite()
        if not bool(mask.any()):
            continue
        tm = t[mask]
        dr, do = (r[mask] - tm).abs(), (o[mask] - tm).abs()
        st["ref_abs"], st["cand_abs"] = max(st["ref_abs"], float(dr.max())), max(st["cand_abs"], float(do.max()))
        st["ref_sq"] += float((dr * dr).sum())
        st["cand_sq"] += float((do * do).sum())
        st["t_sq"] += float((tm * tm).sum())
        st["scale"] = max(st["scale"], float(tm.abs().max()))
    return st


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
def _takes_five(fn: Any) -> bool:
    if fn is None:
        return False
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    return any(p.kind == p.VAR_POSITIONAL for p in params) or len(params) >= 5


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


def _scratch_root(need: int = 0) -> str | None:
    """RAM-backed scratch space for the outputs when there is plenty of it (16 GiB, or `need` bytes and
    half as much again), else the default temp dir."""
    shm = Path("/dev/shm")
    try:
        roomy = shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > max(16 << 30, need * 3 // 2)
    except OSError:
        roomy = False
    return str(shm) if roomy else None


class WorkerProcess:
    """One spawned `python -m kstrata.agents.eval_worker`: its progress lines are read from its log while
    it runs (`on_progress(role, done, total, seconds)`), and in lockstep mode it waits for `go` before each
    trial and before timing. The timeout covers its whole life; it kills the worker and all it started."""

    def __init__(self, role: str, task: Path, candidate: Path | None, *, device: str, trials: int, seed: int,
                 timeout_s: float, timing: bool, runs: int, cuda_graph: bool, workdir: Path,
                 policy: str = "strict", lockstep: bool = False, on_progress: Any = None,
                 env: dict[str, str] | None = None) -> None:
        import time

        workdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "kstrata.agents.eval_worker", "--role", role, "--task", str(task),
               "--workdir", str(workdir), "--device", device, "--trials", str(trials), "--seed", str(seed),
               "--runs", str(runs), "--policy", policy]
        if candidate is not None:
            cmd += ["--candidate", str(candidate)]
        cmd += ["--timing"] if timing else []
        cmd += ["--cuda-graph"] if cuda_graph else []
        cmd += ["--lockstep"] if lockstep else []
        self.role, self.workdir, self.on_progress = role, workdir, on_progress
        # a callback with a fifth parameter also gets where the trial's time went ("inputs=1.20,forward=0.31,...")
        self._progress_takes_phases = _takes_five(on_progress)
        self.log_path = workdir / "log.txt"
        self._log = self.log_path.open("wb")
        self._read = 0
        self._pending = ""
        self.ready: list[str] = []
        # `env`: a restricted environment (kstrata.agents.llm.sandbox) for generated candidates.
        env = dict(os.environ) if env is None else dict(env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if device == "cpu":
            # Without a GPU Triton has no driver ("0 active drivers"): @triton.jit kernels run on CPU tensors
            # under Triton's interpreter, which reads this before the candidate's kernels are decorated.
            env["TRITON_INTERPRET"] = "1"
        self.start = time.monotonic()
        self.deadline = self.start + timeout_s
        self.timed_out = False
        # A new session (backends/child.py): the timeout kills the worker and everything it started (a
        # candidate's helpers too).
        self.proc = spawn(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                          stdin=subprocess.PIPE if lockstep else subprocess.DEVNULL, env=env)

    def _poll_log(self) -> None:
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._read)
                chunk = f.read()
        except OSError:
            return
        self._read += len(chunk)
        text = self._pending + chunk.decode(errors="replace")
        lines = text.split("\n")
        self._pending = lines.pop()
        for line in lines:
            if line.startswith("PROGRESS ") and self.on_progress is not None:
                parts = line.split()
                if len(parts) in (4, 5) and "/" in parts[2]:
                    done, total = parts[2].split("/")
                    if len(parts) == 5 and self._progress_takes_phases:
                        self.on_progress(parts[1], int(done), int(total), float(parts[3]), parts[4])
                    else:
                        self.on_progress(parts[1], int(done), int(total), float(parts[3]))
            elif line.startswith("READY "):
                self.ready.append(line[6:].strip())

    def _kill(self) -> None:
        kill_tree(self.proc)

    def wait_ready(self, what: str | None) -> bool:
        """Wait until the (lockstep) worker is ready for `what`; False when it exited or timed out first.
        With `what` None, wait until it exits (True) or times out (False)."""
        import time

        while True:
            self._poll_log()
            if what is not None and what in self.ready:
                return True
            if self.proc.poll() is not None:
                self._poll_log()
                return what is None
            if time.monotonic() > self.deadline:
                self.timed_out = True
                self._kill()
                return False
            time.sleep(0.05)

    def close(self) -> None:
        """Close the pipes and the log (the process has ended or been killed)."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        if not self._log.closed:
            self._log.close()

    def go(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def finish(self) -> WorkerRun:
        """Wait for the worker to exit (or kill it at the timeout) and read its report."""
        import time

        while self.proc.poll() is None:
            self._poll_log()
            if time.monotonic() > self.deadline:
                self.timed_out = True
                self._kill()
                break
            time.sleep(0.1)
        self._poll_log()
        self.close()
        elapsed = time.monotonic() - self.start
        tail = self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""
        report_path = self.workdir / "report.json"
        report = None
        if report_path.exists() and not self.timed_out:
            try:
                report = json.loads(report_path.read_text())
            except (json.JSONDecodeError, OSError):
                report = None
        return WorkerRun(self.role, report, self.proc.returncode, self.timed_out, tail, self.workdir, elapsed)


def run_worker(role: str, task: Path, candidate: Path | None, *, device: str, trials: int, seed: int,
               timeout_s: float, timing: bool, runs: int, cuda_graph: bool, workdir: Path,
               policy: str = "strict", on_progress: Any = None, env: dict[str, str] | None = None) -> WorkerRun:
    """Spawn `python -m kstrata.agents.eval_worker` for one role and wait for it (or kill it at the timeout)."""
    return WorkerProcess(role, task, candidate, device=device, trials=trials, seed=seed, timeout_s=timeout_s,
                         timing=timing, runs=runs, cuda_graph=cuda_graph, workdir=workdir, policy=policy,
                         on_progress=on_progress, env=env).finish()


# ---------------------------------------------------------------------------------------------------
# Memory: a plan made before anything runs
# ---------------------------------------------------------------------------------------------------
def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


@dataclass(frozen=True)
class MemoryPlan:
    """What one evaluation needs, from the task's shapes alone, and how the trials are run.

    `mode`: "all-trials" (the reference runs every trial, then the candidate: the reference's outputs
    are held here while the candidate runs) or "lockstep" (trial by trial, reference then candidate:
    one trial's outputs at a time, for outputs too large to keep every trial)."""

    mode: str
    input_bytes: int
    output_bytes: int
    float64_bytes: int  # float64 copies of the floating inputs, outputs and parameters
    device_need_bytes: int  # in the reference process, per trial, on the device
    host_need_bytes: int  # here, in the chosen mode
    host_available_bytes: int
    device_total_bytes: int | None
    trial_bytes: int = 0  # one trial of the reference's outputs and their float64 copies, as saved

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def memory_plan(spec: Any, device: str, trials: int) -> MemoryPlan:
    """Raises `EvalError` up front, with the numbers, when the task truly does not fit."""
    def bytes64(args: Any) -> int:
        return sum(a.numel * 8 for a in args if getattr(a, "dtype", "").startswith(("float", "bfloat")))

    tensors_in = [a for a in spec.inputs if hasattr(a, "numel")]
    tensors_out = [a for a in spec.outputs if hasattr(a, "numel")]
    in_b, out_b = sum(a.bytes for a in tensors_in), sum(a.bytes for a in tensors_out)
    out64 = bytes64(tensors_out)
    f64 = bytes64(tensors_in) + out64 + 2 * spec.parameters.bytes
    dev_need = in_b + out_b + f64 + spec.parameters.bytes
    per_trial = out_b + out64
    avail = host_available_memory()
    total: int | None = None
    if device == "cuda" and torch.cuda.is_available():
        total = int(torch.cuda.get_device_properties(0).total_memory)
        if dev_need > 0.9 * total:
            raise EvalError(f"does not fit on {torch.cuda.get_device_name()}: the reference alone needs about "
                            f"{_gib(dev_need)} of GPU memory (inputs {_gib(in_b)}, outputs {_gib(out_b)}, float64 "
                            f"copies {_gib(f64)}), the GPU has {_gib(total)}")
    elif device == "cpu" and avail and dev_need + 2 * per_trial > 0.8 * avail:
        raise EvalError(f"too large for the CPU: the reference needs about {_gib(dev_need + 2 * per_trial)} of host "
                        f"memory (inputs {_gib(in_b)}, outputs {_gib(out_b)}, float64 copies {_gib(f64)}), "
                        f"{_gib(avail)} available; run it on a GPU (--device cuda)")
    # All trials: the outputs of every trial (and their float64 copies) in scratch space, then here.
    all_need = 2 * trials * per_trial
    if not avail or all_need <= 0.5 * avail:
        return MemoryPlan("all-trials", in_b, out_b, f64, dev_need, all_need, avail, total, per_trial)
    lock_need = 3 * per_trial + out_b
    if lock_need <= 0.8 * avail:
        return MemoryPlan("lockstep", in_b, out_b, f64, dev_need, lock_need, avail, total, per_trial)
    raise EvalError(f"does not fit in host memory: one trial's outputs and their float64 reference take "
                    f"{_gib(per_trial)}, and judging one needs about {_gib(lock_need)}; {_gib(avail)} available")


def _load_trial(workdir: Path, index: int) -> dict[str, Any]:
    from kstrata.agents.trial_io import load_trial

    # mapped, not read: a trial of a published-size task is 19 GB (outputs and their float64 copies)
    data: dict[str, Any] = load_trial(workdir / f"trial{index}.pt")
    return data


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def evaluate(task: str | Path, candidate: str | Path, *, policy: str = "strict", trials: int = DEFAULT_TRIALS,
             seed: int = DEFAULT_SEED, device: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
             timing: bool | None = None, runs: int = 100, cuda_graph: bool = False,
             ceilings: Any = None, on_progress: Any = None, on_plan: Any = None,
             env: dict[str, str] | None = None, reference_cache: bool = True) -> EvalVerdict:
    """Judge `candidate` (a file defining `ModelNew`) against `task` (a KernelBench problem file).

    Before anything runs, the task's shapes give a memory plan (`memory_plan`): a task that does not fit
    raises `EvalError` with the numbers; outputs too large to keep every trial are judged trial by trial
    ("lockstep"). `on_plan(plan)` is called with it, `on_progress(role, done, total, seconds)` as trials end.
    An untimed reference run is kept and reused for the same task, seed, trials, device and versions
    (`kstrata.agents.reference_cache`; `reference_cache=False` or `KSTRATA_REFERENCE_CACHE=off` runs it
    every time); the verdict's `reference_source` says which.
    Returns a verdict; raises `EvalError` only when the harness cannot run at all (a missing file, a
    task that does not load, bad options, a task too large for the machine).
    """
    from kstrata.agents.tasks import describe_task

    task, candidate = Path(task), Path(candidate)
    if policy not in POLICIES:
        raise EvalError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if trials < MIN_TRIALS:
        raise EvalError(f"at least {MIN_TRIALS} trials are needed, got {trials}")
    if not candidate.is_file():
        raise EvalError("no such candidate file", path=candidate)
    # A bad task file is the user's error, reported before anything runs; its code runs in a child process.
    spec = describe_task(task, timeout_s=timeout_s)
    device = device or default_device()
    timing = (device == "cuda") if timing is None else timing
    try:
        plan = memory_plan(spec, device, trials)
    except EvalError as exc:
        raise EvalError(exc.message, path=task) from None
    if on_plan is not None:
        on_plan(plan)
    # lockstep: one trial of the reference's outputs (and float64 copies) and one of the candidate's at a time
    need = plan.trial_bytes + plan.output_bytes if plan.mode == "lockstep" else 0
    scratch = Path(tempfile.mkdtemp(prefix="kstrata-eval-", dir=_scratch_root(need)))
    base = {"task": str(task), "candidate": str(candidate), "policy": policy}
    kw: dict[str, Any] = {"device": device, "trials": trials, "seed": seed, "timeout_s": timeout_s,
                          "timing": timing, "runs": runs, "cuda_graph": cuda_graph, "policy": policy,
                          "on_progress": on_progress, "env": env}
    extra = {"memory": {"plan": plan.to_json()},
             "timing_note": "" if timing else ("skipped: --device cpu (timing needs a GPU)" if device == "cpu"
                                               else "skipped: timing was turned off")}
    try:
        if plan.mode == "lockstep":
            return _lockstep(base, spec, task, candidate, trials, ceilings, scratch, kw, extra)
        ref = _reference(task, scratch / "reference", kw, extra, reference_cache and not timing)
        ref_trials = [_load_trial(ref.workdir, i) for i in range(trials)]
        shutil.rmtree(ref.workdir, ignore_errors=True)  # gone before the candidate starts
        cand = run_worker("candidate", task, candidate, workdir=scratch / "candidate", **kw)
        return _judge(base, spec, ref, ref_trials, cand, trials, ceilings, extra=extra)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _reference(task: Path, workdir: Path, kw: dict[str, Any], extra: dict[str, Any], cached: bool) -> WorkerRun:
    """The reference's run (all trials at once): from the reference cache when `cached` and it holds an
    identical untimed run, else run here (and kept for the next evaluation when `cached`)."""
    from kstrata.agents import reference_cache

    key = None
    if cached:
        key = reference_cache.reference_key(task, device=kw["device"], trials=kw["trials"], seed=kw["seed"],
                                            policy=kw["policy"], env=kw["env"])
        hit = reference_cache.lookup(key, workdir) if key is not None else None
        if key is not None and hit is not None:
            report, log = hit
            extra["reference_source"] = f"cache {key.digest}"
            progress = kw.get("on_progress")
            if progress is not None:
                n = kw["trials"]
                if _takes_five(progress):
                    progress("reference", n, n, 0.0, "cached")
                else:
                    progress("reference", n, n, 0.0)
            return WorkerRun("reference", report, 0, False, log[-4000:], workdir, 0.0)
    ref = run_worker("reference", task, None, workdir=workdir, **kw)
    _reference_ok(ref, task)
    if key is not None and ref.report is not None:
        reference_cache.store(key, workdir, ref.report)
    return ref


def _reference_ok(ref: WorkerRun, task: Path) -> None:
    if ref.failure() or not (ref.report or {}).get("ok"):
        why = ref.failure() or (ref.report or {}).get("error", "unknown error")
        raise EvalError(f"the reference itself failed, so nothing can be judged: {why}", path=task)


def _lockstep(base: dict[str, Any], spec: Any, task: Path, candidate: Path, trials: int, ceilings: Any,
              scratch: Path, kw: dict[str, Any], extra: dict[str, Any]) -> EvalVerdict:
    """Trial by trial: the reference runs trial i, its outputs are read here and deleted, then the
    candidate runs trial i and is judged, before trial i+1. Both processes live through the run (the
    candidate imported while the reference's trial files exist, for as long as reading them takes: the
    price of outputs too large to keep every trial, said in the verdict's memory plan)."""
    steps = [f"trial {i}" for i in range(trials)] + (["timing"] if kw["timing"] else [])
    ref = WorkerProcess("reference", task, None, workdir=scratch / "reference", lockstep=True, **kw)
    cand = WorkerProcess("candidate", task, candidate, workdir=scratch / "candidate", lockstep=True, **kw)

    def step(worker: WorkerProcess, i: int) -> bool:
        if not worker.wait_ready(steps[i]):
            return False
        worker.go()
        return worker.wait_ready(steps[i + 1] if i + 1 < len(steps) else None)

    compared: list[tuple[list[Check], list[OutputComparison]] | None] = []
    last_ref: dict[str, Any] | None = None
    cand_failed = False
    try:
        for i in range(trials):
            if not step(ref, i) and not (ref.workdir / f"trial{i}.pt").exists():
                cand._kill()
                _reference_ok(ref.finish(), task)
                raise EvalError(f"the reference stopped before trial {i}", path=task)
            last_ref = None  # one trial's reference outputs held at a time
            last_ref = _load_trial(ref.workdir, i)
            if not step(cand, i) and not (cand.workdir / f"trial{i}.pt").exists():
                cand_failed = True
                break
            try:
                compared.append(_compare_trial(last_ref, _load_trial(cand.workdir, i)))
            except Exception:  # unreadable: judged below, as in the all-trials path
                compared.append(None)
        if cand_failed:  # the candidate's failure is the verdict; the reference is told to stop
            if ref.proc.stdin is not None:
                ref.proc.stdin.close()
            ref_run = ref.finish()
            if ref_run.report is None:
                import dataclasses

                ref_run = dataclasses.replace(ref_run, report={})
        else:
            if kw["timing"]:
                ref.go()
            ref_run = ref.finish()
            _reference_ok(ref_run, task)
        if kw["timing"] and not cand_failed:
            cand.wait_ready("timing")
            cand.go()
        cand_run = cand.finish()
    finally:
        for w in (ref, cand):
            if w.proc.poll() is None:
                w._kill()
            w.close()
    return _judge(base, spec, ref_run, [last_ref] if last_ref is not None else [], cand_run, trials, ceilings,
                  compared=compared, extra=extra)


def _verdict(base: dict[str, Any], *, accepted: bool, reason: str, failure: str | None, **kw: Any) -> EvalVerdict:
    defaults: dict[str, Any] = {"correct_strict": False, "correct_kernelbench": False,
                                "correct_kernelbench_task_inputs": False}
    defaults.update(kw)
    return EvalVerdict(accepted=accepted, reason=reason, failure=failure, **base, **defaults)


def _compare_trial(rt: dict[str, Any], ct: dict[str, Any]) -> tuple[list[Check], list[OutputComparison]]:
    """The checks and output comparisons of one trial: the reference's outputs against the candidate's."""
    checks: list[Check] = []
    if rt["input_digest"] != ct["input_digest"]:
        checks.append(Check("same-inputs", False, "the candidate process saw different inputs than the reference "
                            "(non-deterministic get_inputs?)"))
    outputs: list[OutputComparison] = []
    shape_problem = _structure_problem(rt["outputs"], ct["outputs"])
    if shape_problem:
        checks.append(Check("shape-dtype", False, shape_problem))
    else:
        checks.append(Check("shape-dtype", True))
        outputs = _compare_outputs(rt, ct["outputs"])
    return checks, outputs


def _compare_outputs(rt: dict[str, Any], outs: list[Any]) -> list[OutputComparison]:
    """Each of `outs` against the reference trial `rt`'s outputs, its float64 outputs and the TF32
    allowance its precision settings made (same structure: checked by the caller)."""
    ref64 = rt.get("outputs64")
    allowances = rt.get("tf32_allowance") or []
    return [compare_output(f"output{j}", r, o, ref64[j] if ref64 is not None else None,
                           fp64_note=rt.get("fp64_note", ""), allowance=allowances[j] if j < len(allowances) else None)
            for j, (r, o) in enumerate(zip(rt["outputs"], outs, strict=True))]


def _after_timing(cand: WorkerRun, last_ref: dict[str, Any] | None) -> list[Check]:
    """Correctness after timing: the last timed call's outputs and a random timed call's, against the
    reference's outputs for the same (last trial's) inputs."""
    path = cand.workdir / "timed.pt"
    if last_ref is None or not path.exists():
        return []
    from kstrata.agents.trial_io import load_trial

    try:
        timed: dict[str, Any] = load_trial(path)
    except Exception as exc:
        return [Check("correct-after-timing", False, f"the timed outputs could not be read back ({type(exc).__name__})")]
    finally:
        path.unlink(missing_ok=True)
    checks = []
    for key, label in (("last", "the last timed call"), ("random", f"timed call {timed.get('random_call')}")):
        outs = timed.get(key)
        if outs is None:
            continue
        problem = _structure_problem(last_ref["outputs"], outs)
        if problem:
            checks.append(Check(f"correct-after-timing ({key})", False, f"{label}: {problem}"))
            continue
        bad = [f"{c.output}: {c.detail or 'differs from the reference'}" for c in _compare_outputs(last_ref, outs)
               if not (c.strict_ok or c.kernelbench_ok)]
        checks.append(Check(f"correct-after-timing ({key})", not bad,
                            f"{label} of {timed.get('calls')}: " + "; ".join(bad) if bad else ""))
    return checks


def _judge(base: dict[str, Any], spec: Any, ref: WorkerRun, ref_trials: list[dict[str, Any]], cand: WorkerRun,
           n_trials: int, ceilings: Any, *, compared: list[Any] | None = None,
           extra: dict[str, Any] | None = None) -> EvalVerdict:
    import resource

    assert ref.report is not None
    memory = dict((extra or {}).get("memory", {}))
    memory["reference"] = ref.report.get("memory")
    env = {"device": ref.report.get("device_name", ""), "versions": ref.report.get("versions", {}),
           "precision": {"reference": ref.report.get("precision")}, "memory": memory,
           "timing_note": (extra or {}).get("timing_note", ""),
           "reference_source": (extra or {}).get("reference_source", "run")}
    failure = cand.failure()
    if failure:
        kind = "timeout" if cand.timed_out else "crash"
        return _verdict(base, accepted=False, reason=failure, failure=kind, log_tail=cand.log_tail[-2000:], **env)
    report = cand.report
    assert report is not None
    env["precision"]["candidate"] = report.get("precision")
    memory["candidate"] = report.get("memory")
    memory["evaluator"] = {"peak_host_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        memory["evaluator"]["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated())
    run_checks = tuple(Check(**c) for c in report.get("checks", []))
    if not report.get("ok"):
        phase = report.get("phase", "run")
        return _verdict(base, accepted=False, reason=f"the candidate failed in {phase}: {report.get('error')}",
                        failure="import" if phase in ("import", "init") else "crash", checks=run_checks,
                        log_tail=cand.log_tail[-2000:], **env)
    results: list[TrialResult] = []
    for i in range(n_trials):
        try:
            if compared is not None:
                if i >= len(compared) or compared[i] is None:
                    raise ValueError("not saved")
                extra_checks, outputs = compared[i]
            else:
                extra_checks, outputs = _compare_trial(ref_trials[i], _load_trial(cand.workdir, i))
            info = report["trials"][i]
        except Exception as exc:  # deleted, forged or unreadable (weights_only refuses arbitrary objects)
            return _verdict(base, accepted=False, failure="integrity", checks=run_checks, **env,
                            reason=f"trial {i}: the candidate's outputs could not be read back "
                                   f"({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}); return tensors (or plain numbers)")
        checks = [Check(**c) for c in info["checks"]] + extra_checks
        results.append(TrialResult(i, info["distribution"], info["seed"], tuple(checks), tuple(outputs)))
    run_checks += tuple(_after_timing(cand, ref_trials[-1] if ref_trials else None))
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

        point = assess(spec, ceilings, cand_timing.median_us * 1e-6, speedup,
                       baseline_seconds=ref_timing.median_us * 1e-6 if ref_timing else None, baseline="eager")
        roof = point.to_json()
        flags.extend(point.flags)
        explained = point.explanations
    else:
        explained = ()
    reason, failure_kind = _reason(results, run_checks, base["policy"], correct)
    accepted = correct and not flags
    if correct and flags:
        reason, failure_kind = "correct, but flagged and not accepted until explained: " + "; ".join(flags), "flagged"
    elif accepted and explained:
        reason += "; " + "; ".join(explained)
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
