"""The one seam between the optimizer and evaluation: check, contract, measure, profile, probe, final.

Everything the loop asks of a candidate goes through `Evaluator`, so the move to the candidate engine
(`kstrata.agents.engine`, issue 12: `Engine.check` is the hardened eval for task-level candidates,
`Engine.measure` its timer, `WorkerPool` the processes) is a change of this file only.

- `check`: `kstrata.agents.evaluate.evaluate` without timing (the hardened evaluator: integrity checks,
  six trials, the policy), each in its own processes; checks run in parallel (`workers`).
- `measure`: one child (`worker.py measure`) times the incumbent and challengers interleaved; it builds
  and compiles them first, outside the queue, and times only once it holds its GPU's timing slot (with
  `lock_path`, also a file lock shared by processes). Every measurement of a task runs on the same GPU
  (its affinity), so the guard's re-measurement is on the GPU that measured the challenger. Other tasks'
  correctness checks may use the GPU meanwhile: the rounds are interleaved and the guard's threshold is
  the measured spread.
- `final`: the chosen ModelNew re-evaluated in fresh processes with fresh seeds (and timed on a GPU).

Where the jobs run is `workers` (`kstrata.agents.workers`): this machine (the default: one unpinned GPU
worker, as before `--gpus`), every local GPU (`--gpus all`: one worker per device, pinned, faults retried
on another GPU, a faulting GPU quarantined), or a Ray cluster (`--workers ray`). The jobs are the drivers
`evaluate_job` and `worker_job` below; the files they need travel by value, so the same driver gives the
same verdict wherever it runs.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kstrata.agents.optimize.contract import eval_policy_for
from kstrata.agents.optimize.state import CheckResult, Measurement
from kstrata.agents.workers import JobContext, LocalWorkers, Workers, fault_in, file_ref, materialize
from kstrata.backends.child import kill_tree, spawn

#: Nsight Compute metrics read for the top kernels (names as in ncu's raw page).
NCU_METRICS = (
    "gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct", "launch__grid_size", "launch__block_size",
    "launch__registers_per_thread", "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps", "launch__occupancy_limit_blocks", "launch__waves_per_multiprocessor",
    "lts__t_sector_hit_rate.pct", "device__attribute_multiprocessor_count",
    "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct",
)
NCU_RANGE = "kstrata_profile"


@dataclass(frozen=True)
class JobResult:
    ok: bool
    data: dict[str, Any]
    error: str
    seconds: float


@dataclass(frozen=True)
class FinalVerdict:
    """The fields of the final evaluation the loop reads (an `EvalVerdict` travels as its JSON)."""

    accepted: bool
    reason: str
    speedup: float | None
    roofline: dict[str, Any] | None
    device: str
    versions: dict[str, str]
    failure: str | None = None
    reference_source: str = ""  # "run" (a timed final always runs its reference) or "cache <key>"
    #: median microseconds of the timed runs: {"reference": eager's, "candidate": the candidate's} (empty untimed)
    timing_us: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FinalVerdict:
        timing = {role: float(t["median_us"]) for role in ("reference", "candidate")
                  if isinstance(t := d.get(f"{role}_timing"), dict) and t.get("median_us") is not None}
        return cls(bool(d["accepted"]), str(d["reason"]), d.get("speedup"), d.get("roofline"), str(d.get("device", "")),
                   dict(d.get("versions") or {}), d.get("failure"), str(d.get("reference_source", "")), timing)


#: The drivers of this module, as the workers name them (kstrata.agents.workers: the same code runs in a thread
#: here or in a Ray worker on another machine).
WORKER_JOB = "kstrata.agents.optimize.evaluation:worker_job"
EVALUATE_JOB = "kstrata.agents.optimize.evaluation:evaluate_job"
#: Job fields that name files: they travel by value (`workers.file_ref`).
_FILE_FIELDS = ("task", "candidate")


class Evaluator:
    """`workers` (kstrata.agents.workers): where the jobs run; by default this machine with one unpinned GPU
    worker (the plain run). `gpu_jobs`: run the jobs as GPU jobs (pinned, serialized for timing, retried
    on a device fault) even when `device` is cpu: tests give fake devices whose GPU jobs do CPU work."""

    def __init__(self, device: str, policy: str, workdir: Path, *, timeout_s: float = 600.0, trials: int = 6,
                 seed: int = 42, lock_path: Path | None = None, workers: Workers | None = None,
                 gpu_jobs: bool | None = None) -> None:
        self.device = device
        self.policy = policy
        self.eval_policy = eval_policy_for(policy)
        self.workdir = workdir
        self.timeout_s = timeout_s
        self.trials = trials
        self.seed = seed
        self.lock_path = lock_path
        self.workers: Workers = workers or LocalWorkers(workdir=workdir, lock_path=lock_path)
        self.gpu_jobs = device == "cuda" if gpu_jobs is None else gpu_jobs
        self.measure_seconds = 0.0
        self.check_seconds = 0.0

    @property
    def timed(self) -> bool:
        return self.device == "cuda"

    def _kind(self, gated: bool = False) -> str:
        # timing is a GPU job even in the wall-clock tests of its code: it takes the GPU worker's slot
        return "gpu" if self.gpu_jobs or gated else "cpu"

    # -- the child protocol of this module ------------------------------------------------------
    def run_job(self, job: dict[str, Any], timeout_s: float | None = None, *, argv_prefix: list[str] | None = None,
                env_extra: dict[str, str] | None = None, gated: bool = False, sandbox: bool = False,
                affinity: str | None = None, budget: bool = False) -> JobResult:
        """Run one worker job on the workers. `gated`: the worker prepares (imports, builds, compiles) outside
        the timing queue, says `ready`, and times only after the driver, holding its GPU's slot, says `go`.
        `sandbox`: in the restricted environment of generated candidates. `affinity`: jobs with the same one
        (a task's timings) run on the same GPU. `budget`: `timeout_s` is a share of the task's time the caller
        gives the job, not a guard against a hang: running past it says nothing about the GPU (no health
        check, no fault)."""
        files = {k: file_ref(job[k]) for k in _FILE_FIELDS if k in job}
        cands = {k: file_ref(p) for k, p in job.get("candidates", {}).items()}
        payload = {"job": {**job, "device": job.get("device", self.device), "seed": job.get("seed", self.seed),
                           "policy": self.policy}, "files": files, "candidates": cands,
                   "timeout_s": timeout_s or self.timeout_s, "argv_prefix": argv_prefix, "env_extra": env_extra,
                   "gated": gated, "sandbox": sandbox, "budget": budget}
        out = self.workers.run(WORKER_JOB, payload, kind=self._kind(gated), affinity=affinity)
        if "data" not in out:  # the driver itself failed (workers report it as ok/error)
            return JobResult(False, {}, str(out.get("error", "the job failed")), 0.0)
        return JobResult(bool(out["ok"]), out["data"], str(out["error"]), float(out["seconds"]))

    def _evaluate(self, task: Path, candidate: Path, *, seed: int, timing: bool, ceilings: Any = None,
                  sandbox: bool = False, timeout_s: float | None = None) -> dict[str, Any]:
        payload = {"task": file_ref(task), "candidate": file_ref(candidate), "policy": self.eval_policy,
                   "trials": self.trials, "seed": seed, "device": self.device, "timeout_s": timeout_s or self.timeout_s,
                   "timing": timing, "sandbox": sandbox, "ceilings": ceilings.to_json() if ceilings is not None else None}
        return self.workers.run(EVALUATE_JOB, payload, kind=self._kind())

    # -- what the loop asks ---------------------------------------------------------------------
    def check(self, task: Path, candidate: Path, *, sandbox: bool = False, timeout_s: float | None = None) -> CheckResult:
        """The hardened evaluation, correctness and integrity only (`sandbox`: in the restricted environment;
        `timeout_s`: each of its processes' limit, when shorter than the evaluator's: a deadline is near)."""
        start = time.monotonic()
        out = self._evaluate(task, candidate, seed=self.seed, timing=False, sandbox=sandbox, timeout_s=timeout_s)
        seconds = time.monotonic() - start
        if "verdict" not in out:
            return CheckResult(False, str(out.get("error", "the evaluation failed")), "harness", self.eval_policy,
                               seconds)
        v = out["verdict"]
        self.check_seconds += seconds
        return CheckResult(bool(v["accepted"]), str(v["reason"]), v.get("failure"), self.eval_policy, seconds,
                           str(v.get("reference_source", "")), float(out.get("reference_s") or 0.0))

    def contract(self, task: Path, candidates: dict[str, Path], layouts: list[Any], *,
                 sandbox: bool = False) -> dict[str, str]:
        """Determinism and output layouts on the check device; key -> problem ('' when kept)."""
        r = self.run_job({"cmd": "contract", "task": str(task), "layouts": layouts,
                          "candidates": {k: str(p) for k, p in candidates.items()}}, sandbox=sandbox)
        if not r.ok:
            return dict.fromkeys(candidates, f"contract check failed: {r.error}")
        out = {}
        for k in candidates:
            c = r.data["candidates"].get(k, {})
            out[k] = c.get("error", "") if not c.get("ok") else "; ".join(c.get("problems", []))
        return out

    def measure(self, task: Path, candidates: dict[str, Path], layouts: list[Any], *, rounds: int = 5,
                runs: int = 30, sandbox: bool = False, timeout_s: float | None = None) -> dict[str, Measurement | str]:
        """Interleaved timing of `candidates` in one process (key -> Measurement, or why not), on the task's
        GPU: every measurement of a task, the guard's re-measurements included, runs on the same GPU."""
        if not self.timed:
            return dict.fromkeys(candidates, "not timed (no GPU)")
        r = self.run_job({"cmd": "measure", "task": str(task), "layouts": layouts, "rounds": rounds, "runs": runs,
                          "candidates": {k: str(p) for k, p in candidates.items()}}, timeout_s, gated=True, sandbox=sandbox,
                         affinity=str(task))
        self.measure_seconds += r.seconds
        if not r.ok:
            return dict.fromkeys(candidates, f"measurement failed: {r.error}")
        out: dict[str, Measurement | str] = {}
        for k in candidates:
            c = r.data["candidates"].get(k, {})
            if not c.get("ok") or not c.get("rounds_us"):
                out[k] = c.get("error") or "not measured"
            else:
                out[k] = Measurement(c["median_us"], tuple(c["rounds_us"]), runs, c["spread"])
        return out

    def probe(self, task: Path) -> JobResult:
        return self.run_job({"cmd": "probe", "task": str(task)})

    def profile(self, task: Path, candidate: Path, triton_cache: Path | None = None) -> JobResult:
        if not self.timed:
            return JobResult(False, {}, "no GPU: nothing profiled", 0.0)
        env = {"TRITON_CACHE_DIR": str(triton_cache)} if triton_cache else None
        return self.run_job({"cmd": "profile", "task": str(task), "candidate": str(candidate)}, env_extra=env, gated=True,
                            affinity=str(task))

    def ncu(self, task: Path, candidate: Path, ncu_path: str, launch_count: int = 1,
            timeout_s: float = 40.0, kernels: list[str] | None = None) -> JobResult:
        """Nsight Compute over one call of the candidate (inside an NVTX range), raw metrics as CSV.

        `kernels`: base function names to profile (ncu's `--kernel-name regex:`), one launch each."""
        prefix = [ncu_path, "--target-processes", "all", "--nvtx", "--nvtx-include", f"{NCU_RANGE}/",
                  "--metrics", ",".join(NCU_METRICS), "--csv", "--page", "raw", "--launch-count", str(launch_count)]
        if kernels:
            prefix += ["--kernel-name", "regex:^(" + "|".join(kernels) + ")$"]
        # Not in the timing queue: ncu replays each kernel on its own, and its metrics are diagnostics. Its
        # `timeout_s` is the profiling share of the task's time (`profile.py`): a budget, not a hang guard.
        r = self.run_job({"cmd": "profile", "task": str(task), "candidate": str(candidate), "ncu_range": NCU_RANGE},
                         timeout_s, argv_prefix=prefix, affinity=str(task), budget=True)
        if not r.ok and not r.data:
            return r
        log = r.data.get("_log", "")
        rows = parse_ncu_csv(log)
        if not rows:
            last = [ln for ln in log.splitlines() if "==ERROR==" in ln or "ERR_" in ln][:1]
            return JobResult(False, {}, "ncu reported no kernels" + (f": {last[0][:200]}" if last else ""), r.seconds)
        return JobResult(True, {"kernels": rows}, "", r.seconds)

    def final(self, task: Path, candidate: Path, *, seed: int, ceilings: Any = None, sandbox: bool = False) -> FinalVerdict:
        """A fresh evaluation with fresh seeds (timed on a GPU): the verdict of the output.

        Outside the timing queue (it is two whole processes): its speedup over eager is a second opinion;
        the speedups the search decides on are the interleaved ones."""
        out = self._evaluate(task, candidate, seed=seed, timing=self.timed, ceilings=ceilings, sandbox=sandbox)
        if "verdict" not in out:
            return FinalVerdict(False, str(out.get("error", "the evaluation failed")), None, None, "", {}, "harness")
        return FinalVerdict.from_json(out["verdict"])


# ---------------------------------------------------------------------------------------------------
# The drivers (run by kstrata.agents.workers: in a thread here, or in a Ray worker)
# ---------------------------------------------------------------------------------------------------
def _sandbox_env(workdir: Path, device: str) -> dict[str, str]:
    """The restricted environment generated (LLM) candidates run in (kstrata.agents.llm.sandbox)."""
    from kstrata.agents.llm.sandbox import sandbox_env

    return sandbox_env(workdir, device=device)


def evaluate_job(p: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Driver: `kstrata.agents.evaluate.evaluate` of one candidate (its own processes), the verdict as JSON."""
    from kstrata.agents.evaluate import EvalError, evaluate

    task, candidate = materialize(p["task"], ctx), materialize(p["candidate"], ctx)
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    box = Path(tempfile.mkdtemp(prefix="sandbox-", dir=ctx.workdir)) if p["sandbox"] else None
    env = ctx.environ(_sandbox_env(box, p["device"])) if box else (ctx.environ() if ctx.env else None)
    ceilings = None
    if p.get("ceilings"):
        from kstrata.agents.roofline import Ceilings

        ceilings = Ceilings.from_json(p["ceilings"])
    start, reference_done = time.monotonic(), [0.0]

    def progress(role: str, done: int, total: int, seconds: float, *detail: str) -> None:
        if role == "reference":  # its trials end before the candidate starts (outside lockstep mode)
            reference_done[0] = time.monotonic()

    try:
        v = evaluate(task, candidate, policy=p["policy"], trials=p["trials"], seed=p["seed"], device=p["device"],
                     timeout_s=p["timeout_s"], timing=p["timing"], ceilings=ceilings, env=env, on_progress=progress)
    except EvalError as exc:
        return {"ok": False, "error": str(exc), "device_fault": False}
    finally:
        if box:
            shutil.rmtree(box, ignore_errors=True)
    data = v.to_json()
    # a crash with a CUDA runtime error on a GPU worker may be the GPU's: the workers retry it on another one
    fault = ctx.device is not None and v.failure in ("crash", "timeout") and fault_in(v.reason + v.log_tail)
    # seconds until the reference's trials were there (the task's description and the reference run, or the
    # cache's answer); unknown (0) when the two ran trial by trial, interleaved (lockstep)
    lockstep = (v.memory.get("plan") or {}).get("mode") == "lockstep"
    reference_s = reference_done[0] - start if reference_done[0] and not lockstep else 0.0
    return {"ok": True, "verdict": data, "device_fault": fault, "reference_s": round(reference_s, 3)}


def worker_job(p: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Driver: one `worker.py` job in a child process, gated on the GPU's timing slot when asked."""
    job = dict(p["job"])
    for k, ref in p["files"].items():
        job[k] = str(materialize(ref, ctx))
    if p["candidates"]:
        job["candidates"] = {k: str(materialize(ref, ctx)) for k, ref in p["candidates"].items()}
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix=f"{job['cmd']}-", dir=ctx.workdir))
    job["result"] = str(d / "result.json")
    ready, go = d / "ready", d / "go"
    gated = bool(p["gated"])
    if gated:
        job.update(ready_file=str(ready), go_file=str(go))
    (d / "job.json").write_text(json.dumps(job))
    base = _sandbox_env(d / "sandbox", job["device"]) if p["sandbox"] else None
    env = ctx.environ(base)
    env.update(PYTHONUNBUFFERED="1", **(p.get("env_extra") or {}))
    if job["device"] == "cpu":
        env["TRITON_INTERPRET"] = "1"
    cmd = [*(p.get("argv_prefix") or []), sys.executable, "-m", "kstrata.agents.optimize.worker", str(d / "job.json")]
    start = time.monotonic()
    log = d / "log.txt"
    limit = float(p["timeout_s"])
    on_gpu = ctx.device is not None
    timed_out = False
    with log.open("wb") as fh:
        proc = spawn(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)  # the one child mechanism
        deadline = start + limit
        slot: contextlib.AbstractContextManager[None] | None = None
        try:
            while proc.poll() is None:
                if gated and slot is None and ready.exists():
                    slot = ctx.timing_slot()
                    slot.__enter__()  # waits for the GPU; the worker waits for `go`
                    deadline = time.monotonic() + limit
                    go.write_text("go")
                if time.monotonic() > deadline:
                    kill_tree(proc)
                    timed_out = True
                    break
                time.sleep(0.02)
        finally:
            if slot is not None:
                slot.__exit__(None, None, None)
    seconds = time.monotonic() - start
    if timed_out:
        shutil.rmtree(d, ignore_errors=True)
        # Over its allowance: the device's fault only when the GPU then fails its health check (on a healthy
        # GPU a retry would repeat it: kstrata.agents.workers); a job given a time budget (ncu's share of the
        # task's time) only ran out of it, which says nothing about the GPU.
        fault, said = (False, " (its time budget)") if p.get("budget") else ctx.timeout_is_fault()
        return {"ok": False, "data": {}, "error": f"{job['cmd']} timed out after {limit:g} s{said}",
                "seconds": seconds, "device_fault": fault}
    out = d / "result.json"
    try:
        data = json.loads(out.read_text())
    except (OSError, json.JSONDecodeError):
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
        shutil.rmtree(d, ignore_errors=True)
        return {"ok": False, "data": {}, "error": f"{job['cmd']} died (exit code {proc.returncode})" +
                (f": {tail[0][:300]}" if tail else ""), "seconds": seconds, "device_fault": on_gpu}
    data["_log"] = log.read_text(errors="replace")[-400000:]  # ncu writes its CSV there
    # which GPU the job's process saw (the pinning, for reports and tests)
    data["_cuda_visible_devices"] = env.get("CUDA_VISIBLE_DEVICES")
    shutil.rmtree(d, ignore_errors=True)
    error = str(data.get("error", ""))
    return {"ok": bool(data.get("ok")), "data": data, "error": error, "seconds": seconds,
            "device_fault": on_gpu and not data.get("ok") and fault_in(error)}


def parse_ncu_csv(text: str) -> list[dict[str, Any]]:
    """Rows of ncu's `--csv --page raw` output: one dict per kernel, metric name -> number (or text)."""
    import csv
    import io

    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if len(lines) < 2:
        return []
    reader = list(csv.reader(io.StringIO("\n".join(lines))))
    head = reader[0]
    rows = []
    for values in reader[1:]:
        if len(values) != len(head):
            continue
        row = dict(zip(head, values, strict=True))
        if row.get("Kernel Name") in (None, "", "Kernel Name") or row.get("ID") == "":
            continue
        parsed: dict[str, Any] = {}
        for k, v in row.items():
            try:
                parsed[k] = float(v.replace(",", ""))
            except ValueError:
                parsed[k] = v
        if isinstance(parsed.get("ID"), float) or "Kernel Name" in parsed:
            rows.append(parsed)
    # The second CSV row of the raw page is units ("", "", "nsecond", ...): it has no numeric ID.
    return [r for r in rows if isinstance(r.get("ID"), float)]
