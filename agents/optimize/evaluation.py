"""The one seam between the optimizer and evaluation: check, contract, measure, profile, probe, final.

Everything the loop asks of a candidate goes through `Evaluator`, so the move to the candidate engine
(`kstrata.agents.engine`, issue 12: `Engine.check` is the hardened eval for task-level candidates,
`Engine.measure` its timer, `WorkerPool` the processes) is a change of this file only.

- `check`: `kstrata.agents.evaluate.evaluate` without timing (the hardened evaluator: integrity checks,
  six trials, the policy), each in its own processes; checks run in parallel (`workers`).
- `measure`: one child (`worker.py measure`) times the incumbent and challengers interleaved; it builds
  and compiles them first, outside the queue, and times only once it holds the one timing queue of the run
  (a lock; with `lock_path`, a file lock shared by processes). Other tasks' correctness checks may use the
  GPU meanwhile: the rounds are interleaved and the guard's threshold is the measured spread.
- `final`: the chosen ModelNew re-evaluated in fresh processes with fresh seeds (and timed on a GPU).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kstrata.agents.optimize.contract import eval_policy_for
from kstrata.agents.optimize.state import CheckResult, Measurement
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


class Evaluator:
    def __init__(self, device: str, policy: str, workdir: Path, *, timeout_s: float = 600.0, trials: int = 6,
                 seed: int = 42, lock_path: Path | None = None) -> None:
        self.device = device
        self.policy = policy
        self.eval_policy = eval_policy_for(policy)
        self.workdir = workdir
        self.timeout_s = timeout_s
        self.trials = trials
        self.seed = seed
        self.lock_path = lock_path
        self._lock = threading.Lock()
        self.measure_seconds = 0.0
        self.check_seconds = 0.0

    @property
    def timed(self) -> bool:
        return self.device == "cuda"

    # -- the child protocol of this module ------------------------------------------------------
    def _sandbox_env(self, workdir: Path) -> dict[str, str]:
        """The restricted environment generated (LLM) candidates run in (kstrata.agents.llm.sandbox)."""
        from kstrata.agents.llm.sandbox import sandbox_env

        return sandbox_env(workdir, device=self.device)

    def run_job(self, job: dict[str, Any], timeout_s: float | None = None, *, argv_prefix: list[str] | None = None,
                env_extra: dict[str, str] | None = None, gated: bool = False, sandbox: bool = False) -> JobResult:
        """Run one worker job. `gated`: the worker prepares (imports, builds, compiles) outside the timing
        queue, says `ready`, and times only after this process, holding the queue, says `go`. `sandbox`: in
        the restricted environment of generated candidates."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        d = Path(tempfile.mkdtemp(prefix=f"{job['cmd']}-", dir=self.workdir))
        job = {**job, "result": str(d / "result.json"), "device": job.get("device", self.device),
               "seed": job.get("seed", self.seed), "policy": self.policy}
        ready, go = d / "ready", d / "go"
        if gated:
            job.update(ready_file=str(ready), go_file=str(go))
        (d / "job.json").write_text(json.dumps(job))
        base = self._sandbox_env(d / "sandbox") if sandbox else os.environ
        env = dict(base, PYTHONUNBUFFERED="1", **(env_extra or {}))
        if job["device"] == "cpu":
            env["TRITON_INTERPRET"] = "1"
        cmd = [*(argv_prefix or []), sys.executable, "-m", "kstrata.agents.optimize.worker", str(d / "job.json")]
        start = time.monotonic()
        log = d / "log.txt"
        with log.open("wb") as fh:
            proc = spawn(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)  # the one child mechanism
            limit = timeout_s or self.timeout_s
            deadline = start + limit
            queue: contextlib.AbstractContextManager[None] | None = None
            try:
                while proc.poll() is None:
                    if gated and queue is None and ready.exists():
                        queue = self.timing_queue()
                        queue.__enter__()  # waits for the GPU; the worker waits for `go`
                        deadline = time.monotonic() + limit
                        go.write_text("go")
                    if time.monotonic() > deadline:
                        kill_tree(proc)
                        shutil.rmtree(d, ignore_errors=True)
                        return JobResult(False, {}, f"{job['cmd']} timed out after {limit:g} s", time.monotonic() - start)
                    time.sleep(0.02)
            finally:
                if queue is not None:
                    queue.__exit__(None, None, None)
        seconds = time.monotonic() - start
        out = d / "result.json"
        try:
            data = json.loads(out.read_text())
        except (OSError, json.JSONDecodeError):
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            shutil.rmtree(d, ignore_errors=True)
            return JobResult(False, {}, f"{job['cmd']} died (exit code {proc.returncode})" +
                             (f": {tail[0][:300]}" if tail else ""), seconds)
        data["_log"] = log.read_text(errors="replace")[-400000:]  # ncu writes its CSV there
        shutil.rmtree(d, ignore_errors=True)
        return JobResult(bool(data.get("ok")), data, str(data.get("error", "")), seconds)

    @contextlib.contextmanager
    def timing_queue(self) -> Iterator[None]:
        """One measurement at a time: this process's lock, and the file lock when several share the GPU."""
        with self._lock:
            if self.lock_path is None:
                yield
                return
            self.lock_path.parent.mkdir(parents=True, exist_ok=True)
            with self.lock_path.open("a") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(fh, fcntl.LOCK_UN)

    # -- what the loop asks ---------------------------------------------------------------------
    def check(self, task: Path, candidate: Path, *, sandbox: bool = False) -> CheckResult:
        """The hardened evaluation, correctness and integrity only (`sandbox`: in the restricted environment)."""
        from kstrata.agents.evaluate import EvalError, evaluate

        start = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        box = Path(tempfile.mkdtemp(prefix="sandbox-", dir=self.workdir)) if sandbox else None
        try:
            v = evaluate(task, candidate, policy=self.eval_policy, trials=self.trials, seed=self.seed,
                         device=self.device, timeout_s=self.timeout_s, timing=False,
                         env=self._sandbox_env(box) if box else None)
        except EvalError as exc:
            return CheckResult(False, str(exc), "harness", self.eval_policy, time.monotonic() - start)
        finally:
            if box:
                shutil.rmtree(box, ignore_errors=True)
        seconds = time.monotonic() - start
        self.check_seconds += seconds
        return CheckResult(v.accepted, v.reason, v.failure, self.eval_policy, seconds)

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
                runs: int = 30, sandbox: bool = False) -> dict[str, Measurement | str]:
        """Interleaved timing of `candidates` in one process (key -> Measurement, or why not)."""
        if not self.timed:
            return dict.fromkeys(candidates, "not timed (no GPU)")
        r = self.run_job({"cmd": "measure", "task": str(task), "layouts": layouts, "rounds": rounds, "runs": runs,
                          "candidates": {k: str(p) for k, p in candidates.items()}}, gated=True, sandbox=sandbox)
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
        return self.run_job({"cmd": "profile", "task": str(task), "candidate": str(candidate)}, env_extra=env, gated=True)

    def ncu(self, task: Path, candidate: Path, ncu_path: str, launch_count: int = 1,
            timeout_s: float = 40.0, kernels: list[str] | None = None) -> JobResult:
        """Nsight Compute over one call of the candidate (inside an NVTX range), raw metrics as CSV.

        `kernels`: base function names to profile (ncu's `--kernel-name regex:`), one launch each."""
        prefix = [ncu_path, "--target-processes", "all", "--nvtx", "--nvtx-include", f"{NCU_RANGE}/",
                  "--metrics", ",".join(NCU_METRICS), "--csv", "--page", "raw", "--launch-count", str(launch_count)]
        if kernels:
            prefix += ["--kernel-name", "regex:^(" + "|".join(kernels) + ")$"]
        # Not in the timing queue: ncu replays each kernel on its own, and its metrics are diagnostics.
        r = self.run_job({"cmd": "profile", "task": str(task), "candidate": str(candidate), "ncu_range": NCU_RANGE},
                         timeout_s, argv_prefix=prefix)
        if not r.ok and not r.data:
            return r
        log = r.data.get("_log", "")
        rows = parse_ncu_csv(log)
        if not rows:
            last = [ln for ln in log.splitlines() if "==ERROR==" in ln or "ERR_" in ln][:1]
            return JobResult(False, {}, "ncu reported no kernels" + (f": {last[0][:200]}" if last else ""), r.seconds)
        return JobResult(True, {"kernels": rows}, "", r.seconds)

    def final(self, task: Path, candidate: Path, *, seed: int, ceilings: Any = None, sandbox: bool = False) -> Any:
        """A fresh evaluation with fresh seeds (timed on a GPU): the verdict of the output.

        Outside the timing queue (it is two whole processes): its speedup over eager is a second opinion;
        the speedups the search decides on are the interleaved ones."""
        from kstrata.agents.evaluate import evaluate

        self.workdir.mkdir(parents=True, exist_ok=True)
        box = Path(tempfile.mkdtemp(prefix="sandbox-", dir=self.workdir)) if sandbox else None
        try:
            return evaluate(task, candidate, policy=self.eval_policy, trials=self.trials, seed=seed, device=self.device,
                            timeout_s=self.timeout_s, timing=self.timed, ceilings=ceilings,
                            env=self._sandbox_env(box) if box else None)
        finally:
            if box:
                shutil.rmtree(box, ignore_errors=True)


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
