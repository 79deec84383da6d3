"""Dynamic equivalence runs in child processes: the CPU interpreter and GPU differential runs.

A *job* runs the original and the candidate on one input set and compares what they wrote. Jobs run in a
child process, so that a candidate that faults, hangs or kills the process is a verdict and not a crash
of the verifier. One child runs a list of jobs (imports of torch, Triton and xDSL cost seconds, a job
often less); it prints `JOB k` when job k starts, `STAGE original|candidate` before each kernel runs,
`STAGE compare` before the outputs are compared, and `RESULT {json}` when the job ends. When a child dies or
a job passes its timeout, the parent records that job's outcome from the last `STAGE` it saw and starts a
fresh child for the remaining jobs. A job whose own copies run out of GPU memory ends with a
`harness-error` result: no verdict on either kernel.

Outcomes become checks in `verdict`: the original failing is never the candidate's fault — the input
set does not apply (edge integers used as addresses) or the check cannot run; the candidate failing
where the original ran is a failed check.
"""

from __future__ import annotations

import json
import pickle
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.launch import LaunchRecord, TensorArg

from .child import ChildStream, ChildTimeout, host_available_memory
from .replay import InputSet


@dataclass
class Outcome:
    """What happened to one job."""

    status: str  # "equal", "different", "original-error", "candidate-error", "ran", "crashed", "timeout"
    stage: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)
    #: The child's output while the job ran, when it died (compute-sanitizer reports on stdout).
    output: str = ""


def interpret_launch(bundle: KernelBundle, level: str, record: LaunchRecord, args: dict[str, Any]) -> None:
    """Run `bundle`'s `level` text in the CPU interpreter on `args` (CPU tensors by parameter name,
    updated in place), with the record's grid."""
    import torch

    from kstrata.ir.interp import Buffer, run_kernel

    values = [Buffer.from_torch(args[p.name]) if isinstance(args[p.name], torch.Tensor) else args[p.name]
              for p in bundle.params]
    run_kernel(bundle.text(level), record.grid, values, origin=f"{bundle.origin or bundle.name} ({level})")


def _run_job(job: dict[str, Any], stage: Any) -> dict[str, Any]:
    import torch

    from .replay import clone_args, compare_outputs, differential, redzone_violations, replay_args

    original, candidate, record = job["original"], job["candidate"], job["record"]
    iset, tolerance, base_dir = job["input_set"], job["tolerance"], job["base_dir"]
    if job["kind"] == "interp":
        inputs = replay_args(record, "cpu", iset.seed, mode=iset.mode, base_dir=base_dir, redzone=True)
        outs = []
        for which, bundle in (("original", original), ("candidate", candidate)):
            stage(which)
            args = clone_args(inputs)
            try:
                interpret_launch(bundle, job["level"], record, args)
            except Exception as exc:  # the interpreter's verdict on this kernel, judged by the parent
                return {"status": f"{which}-error", "unsupported": "not supported by the interpreter" in str(exc),
                        "error": f"{type(exc).__name__}: {exc}"}
            stray = redzone_violations(args, record, f"{which} ({job['level']}, interpreter), {iset.label}")
            if stray:
                return {"status": f"{which}-out-of-bounds", "violations": stray}
            outs.append(args)
        stage("compare")
        names = [a.name for a in record.args if isinstance(a, TensorArg)]
        diff = compare_outputs(outs[0], outs[1], names, tolerance, redzone=True)
        exact = diff is None and (tolerance is None or compare_outputs(outs[0], outs[1], names, redzone=True) is None)
        return {"status": "equal" if diff is None else "different", "difference": diff, "exact": exact}
    if job["kind"] == "gpu":
        d = differential(original, candidate, record, iset.seed, runs=job["runs"], mode=iset.mode, base_dir=base_dir,
                         tolerance=tolerance, on_stage=stage)
        if d.out_of_bounds:
            return {"status": f"{d.out_of_bounds_by}-out-of-bounds", "violations": d.out_of_bounds}
        return {"status": "equal" if d.equal else "different", "difference": d.first_difference,
                "exact": d.exact, "timing": [d.timing_a, d.timing_b]}
    if job["kind"] == "sanitize":
        from .launch import LoadedKernel

        stage("candidate")
        # No redzones here: each buffer is exactly its size, in its own cudaMalloc (the parent turns the
        # caching allocator off), so the sanitizer sees one element past the end as out of bounds.
        args = replay_args(record, "cuda", iset.seed, mode=iset.mode, base_dir=base_dir)
        LoadedKernel(candidate).call_by_name(record.grid, args)
        torch.cuda.synchronize()
        return {"status": "ran"}
    raise ValueError(f"unknown job kind {job['kind']!r}")


def child_main(jobs_path: str) -> None:
    """Entry of a child: run every job of the pickled list in order."""
    jobs = pickle.loads(Path(jobs_path).read_bytes())

    def stage(name: str) -> None:
        print(f"STAGE {name}", flush=True)

    import torch

    for index, job in enumerate(jobs):
        print(f"JOB {index}", flush=True)
        try:
            result = _run_job(job, stage)
        except torch.OutOfMemoryError as exc:  # the check's own copies, not a kernel's doing (it allocates none)
            torch.cuda.empty_cache()
            result = {"status": "harness-error", "error": f"the check ran out of GPU memory: {_first_line(exc)}"}
        print("RESULT " + json.dumps(result, default=str), flush=True)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__


def run_jobs(jobs: list[dict[str, Any]], timeout: float, wrapper: list[str] | None = None,
             on_outcome: Any = None, env: dict[str, str] | None = None) -> list[Outcome]:
    """Run `jobs` in as few children as faults allow; each job gets `timeout` seconds (the first job of
    a child also gets the child's start-up). `wrapper` prefixes the child's command (compute-sanitizer);
    `env` is added to the child's environment. `on_outcome(index, outcome)` is called as each job ends."""
    import os

    outcomes: list[Outcome] = []

    def done(outcome: Outcome) -> None:
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(len(outcomes) - 1, outcome)

    while len(outcomes) < len(jobs):
        with tempfile.TemporaryDirectory(prefix="kstrata-verify-") as tmp:
            jobs_file = Path(tmp) / "jobs.pkl"
            jobs_file.write_bytes(pickle.dumps(jobs[len(outcomes):]))
            argv = [*(wrapper or []), sys.executable, "-m", "kstrata.backends.dynamic_worker", str(jobs_file)]
            # the one child protocol (child.py): a new session, stdout line by line with a deadline per line
            with ChildStream(argv, env={**os.environ, **env} if env else None) as child:
                stage: str | None = None
                seen: list[str] = []
                deadline = time.monotonic() + timeout + 120.0  # start-up: torch, Triton, xDSL imports
                began = [time.monotonic()]  # the job's start (the first job's includes the child's start-up)

                def took(began: list[float] = began) -> float:
                    return round(time.monotonic() - began[0], 3)
                while True:
                    try:
                        line = child.next_line(deadline - time.monotonic())
                    except ChildTimeout:
                        child.kill()
                        done(Outcome("timeout", stage, {"seconds": took()}, "".join(seen)))
                        break
                    if line is None:  # the child exited: the job in progress (if any) died with it
                        code = child.wait()
                        if len(outcomes) < len(jobs):
                            done(Outcome("crashed", stage, {"returncode": code, "seconds": took()},
                                         "".join(seen) + child.stderr_tail()))
                        elif code != 0:  # every job ended, but the child did not (compute-sanitizer's verdict)
                            outcomes[-1].payload["returncode"] = code
                            outcomes[-1].output = "".join(seen) + child.stderr_tail()
                        break
                    seen.append(line)
                    if line.startswith("JOB "):
                        stage, seen = None, []
                        deadline = time.monotonic() + timeout
                        if outcomes:  # a later job's time starts here; the first's with the child
                            began[0] = time.monotonic()
                    elif line.startswith("STAGE "):
                        stage = line.split(" ", 1)[1].strip()
                    elif line.startswith("RESULT "):
                        payload = json.loads(line.split(" ", 1)[1])
                        payload.setdefault("seconds", took())
                        done(Outcome(payload["status"], stage, payload))
    return outcomes


def run_jobs_parallel(jobs: list[dict[str, Any]], timeout: float, workers: int,
                      on_outcome: Any = None) -> list[Outcome]:
    """`run_jobs` split over `workers` children running at once (round robin), the outcomes in `jobs`'
    order; `on_outcome(index, outcome)` as each ends (one call at a time; `index` into `jobs`). For CPU-bound
    jobs (the interpreter's) at a published size: on gap task 01 (16 x 64 x 256 x 256 fp32) one interpreter run
    of one level took 18 s, and an acceptance check ran eight of them in a row."""
    import threading

    workers = max(1, min(workers, len(jobs)))
    if workers == 1:
        return run_jobs(jobs, timeout, on_outcome=on_outcome)
    parts = [list(range(w, len(jobs), workers)) for w in range(workers)]
    found: dict[int, Outcome] = {}
    lock = threading.Lock()

    failed: list[BaseException] = []

    def run(part: list[int]) -> None:
        def ended(j: int, outcome: Outcome) -> None:
            with lock:
                found[part[j]] = outcome
                if on_outcome is not None:
                    on_outcome(part[j], outcome)

        try:
            run_jobs([jobs[i] for i in part], timeout, on_outcome=ended)
        except BaseException as exc:  # raised again in the caller's thread, not lost with this one
            failed.append(exc)

    threads = [threading.Thread(target=run, args=(part,), daemon=True) for part in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    return [found[i] for i in range(len(jobs))]


def interpreter_workers(record: Any, jobs: int, cpus: int | None = None, available: int | None = None) -> int:
    """How many interpreter jobs of `record`'s launch run at once: one below `PARALLEL_INTERP_BYTES` of
    arguments (a child's start-up costs more than such a run), else as many as the CPUs and the memory allow
    (a job holds its inputs and a copy for each of the two kernels it runs, `INTERP_MEMORY_FACTOR` times the
    arguments' bytes, in half the memory available)."""
    import os

    size = sum(a.nbytes for a in record.args if getattr(a, "kind", "") == "tensor")
    if jobs <= 1 or size < PARALLEL_INTERP_BYTES:
        return 1
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    available = available if available is not None else host_available_memory()  # 0: one at a time
    by_memory = int(available // 2 // max(1, INTERP_MEMORY_FACTOR * size))
    return max(1, min(jobs, cpus, by_memory))


#: Arguments' bytes from which a launch's interpreter jobs run in parallel children (`interpreter_workers`).
PARALLEL_INTERP_BYTES = 64 << 20
#: A job's memory as a multiple of its arguments' bytes: the inputs, the original's and the candidate's copies.
INTERP_MEMORY_FACTOR = 4


def _tail(text: str, lines: int = 4) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])


def verdict(name: str, level: str, iset: InputSet, outcome: Outcome, timeout: float, launch_name: str) -> tuple[str, str]:
    """The (verdict, detail) of one job's outcome."""
    status, stage = outcome.status, outcome.stage
    if status == "equal":
        same = "outputs identical" if outcome.payload.get("exact", True) else \
            "outputs within the declared tolerance (not bit-identical)"
        return "pass", same + _timing(outcome.payload)
    if status == "different":
        return "fail", f"first difference: {outcome.payload['difference']} (launch {launch_name}, inputs: {iset.label})"
    if status == "candidate-out-of-bounds":
        from .replay import describe_violation

        return "fail", "; ".join(describe_violation(v) for v in outcome.payload["violations"][:3]) + \
            f" (launch {launch_name})"
    if status == "original-out-of-bounds":
        from .replay import describe_violation

        return "skipped", "cannot check: the original itself " + describe_violation(outcome.payload["violations"][0])
    if status == "harness-error":
        return "skipped", f"cannot check: {outcome.payload.get('error')} (inputs: {iset.label})"
    if status in ("crashed", "timeout") and stage == "compare":  # both kernels had run and synchronized
        why = f"past {timeout:g} s" if status == "timeout" else f"died: {_tail(outcome.output)}"
        return "skipped", f"cannot check: the comparison of the outputs {why} (inputs: {iset.label})"
    if status == "original-error" or (status in ("crashed", "timeout") and stage in (None, "original")):
        why = outcome.payload.get("error") or (f"the original ran past {timeout:g} s" if status == "timeout" else
                                               f"the original's run died: {_tail(outcome.output)}")
        if iset.may_not_apply:
            return "n/a", f"does not apply: the original fails on these inputs ({why})"
        return "skipped", f"cannot check: {why}"
    if status == "candidate-error":
        if outcome.payload.get("unsupported"):
            return "skipped", f"cannot check the candidate: {outcome.payload['error']}"
        return "fail", f"the candidate fails where the original runs: {outcome.payload['error']} (inputs: {iset.label})"
    if status == "timeout":
        return "fail", f"the candidate ran past the {timeout:g} s timeout (hang?) (inputs: {iset.label})"
    return "fail", (f"the candidate's run died (exit {outcome.payload.get('returncode')}): {_tail(outcome.output)} "
                    f"(inputs: {iset.label})")


def _timing(payload: dict[str, Any]) -> str:
    timing = payload.get("timing") or []
    if len(timing) == 2 and timing[0] and timing[1]:
        return f"; {timing[0]['median_us']:.2f} -> {timing[1]['median_us']:.2f} us"
    return ""
