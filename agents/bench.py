"""`kstrata bench`: every task of a suite under each baseline, timed, checked, placed on the roofline.

Baselines (`BASELINES`): `eager` (the task's `Model` as written), `compile` (`torch.compile(model)`),
`compile-max-autotune` (`torch.compile(model, mode="max-autotune")`). Each task runs on its own inputs
(`get_inputs()` under KernelBench's seed 42, made on the GPU), timed as `kstrata.agents.evaluate` times:
CUDA events, a device-wide synchronize before the end event, the L2 flushed before each run, warm-up,
the median of `runs` runs with the 10th/90th percentiles. Every baseline runs under PyTorch's default
precision settings, reported per row (TF32 for matmuls and cuDNN, reduced-precision reductions). A
compiled baseline is correct when its error against the float64 truth (the model and inputs in
float64) is within `evaluate`'s strict bound scaled by eager's own error at those defaults: eager fp32
convolutions are TF32 by PyTorch's default (`cudnn.allow_tf32`), so eager and torch.compile may each be
~1e-3 from the truth and from each other — comparing them with each other at KernelBench's 1e-4 called
torch.compile incorrect on the level2 conv + GroupNorm tasks for a difference PyTorch's defaults make.
KernelBench's allclose against eager is reported too (`kernelbench_vs_eager`); when the float64 run is
impossible (an op without float64), it decides and the row says so.

The tasks run in a worker process (`python -m kstrata.agents.bench --worker`), one after another; a task
that crashes the worker or outlasts `task_timeout_s` is recorded as failed and the worker restarts at the
next task. Results go to `bench-results.json` after every task, so an interrupted run resumes where it
stopped (tasks already in the file are skipped). At the end: `bench-report.md` (per-task time, speedup
vs eager, fraction of speed of light, correctness; geometric means and KernelBench's fast_p) and PNG plots
(`bench-speedup.png`, `bench-roofline.png`, `bench-sol-fraction.png`).

fast_p follows KernelBench's `fastp` (src/score.py): the fraction of *all* tasks that are correct and
faster than the baseline by more than p (speedup > p); fast_0 is the fraction correct.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kstrata.agents.workers import JobContext, Workers, materialize
from kstrata.backends.child import ChildStream, ChildTimeout

BENCH_SCHEMA = "kstrata.bench/1"
BASELINES = ("eager", "compile", "compile-max-autotune")
FAST_P = (0.0, 1.0, 1.5, 2.0)
RESULTS_FILE = "bench-results.json"
REPORT_FILE = "bench-report.md"


# ---------------------------------------------------------------------------------------------------
# Summary arithmetic (no GPU)
# ---------------------------------------------------------------------------------------------------
def geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def fast_p(correct: list[bool], speedups: list[float | None], p: float) -> float:
    """KernelBench's fast_p: the fraction of all tasks that are correct and have speedup > p."""
    n = len(correct)
    if n == 0:
        return 0.0
    hits = sum(1 for c, s in zip(correct, speedups, strict=True) if c and s is not None and s > p)
    return hits / n


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per baseline: tasks, correct, geometric mean speedup vs eager (correct tasks), fast_p, mean SOL fraction."""
    tasks = results["tasks"]
    baselines = results["baselines"]
    out: dict[str, Any] = {}
    for b in baselines:
        correct, accepted, speedups, fractions = [], [], [], []
        for entry in tasks.values():
            r = entry["baselines"].get(b)
            if r is None:
                continue
            ok = bool(r.get("ok") and r.get("correct"))
            correct.append(ok)
            accepted.append(ok and not r.get("flags"))
            speedups.append(r.get("speedup_vs_eager"))
            if ok and r.get("sol_fraction"):
                fractions.append(r["sol_fraction"])
        good = [s for c, s in zip(correct, speedups, strict=True) if c and s]
        out[b] = {"tasks": len(correct), "correct": sum(correct), "flagged": sum(c and not a for c, a in zip(correct, accepted, strict=True)),
                  "geomean_speedup_vs_eager": geomean(good),
                  "fast_p": {f"fast_{p:g}": fast_p(correct, speedups, p) for p in FAST_P},
                  # The same without the flagged results (faster than speed of light, or > 10x): not accepted.
                  "fast_p_unflagged": {f"fast_{p:g}": fast_p(accepted, speedups, p) for p in FAST_P},
                  "geomean_sol_fraction": geomean(fractions)}
    return out


# ---------------------------------------------------------------------------------------------------
# The worker
# ---------------------------------------------------------------------------------------------------
def _worker(task_paths: list[str], baselines: list[str], runs: int, seed: int, warm_only: bool = False,
            device: str = "cuda") -> None:
    import statistics

    import torch

    from kstrata.agents.eval_worker import _build, _flat_outputs, _to_double, make_inputs, precision_settings, time_cuda
    from kstrata.agents.evaluate import compare_output
    from kstrata.agents.tasks import import_task_module

    def emit(obj: dict[str, Any]) -> None:
        sys.stdout.write("RESULT " + json.dumps(obj) + "\n")
        sys.stdout.flush()

    for path in task_paths:
        sys.stdout.write(f"START {path}\n")
        sys.stdout.flush()
        try:
            module = import_task_module(path)
            model, _ = _build(module.Model, module, seed, device)
            inputs = make_inputs(module, 0, seed, device)
            with torch.no_grad():
                ref = _flat_outputs(model(*inputs))
            ref64: list[Any] | None = None
            fp64_note = ""
            try:  # the truth every baseline is judged against
                with torch.no_grad():
                    m64, ins64 = _to_double(model, inputs)
                    ref64 = _flat_outputs(m64(*ins64))
                del m64, ins64
            except Exception as exc:
                fp64_note = f"the float64 reference failed: {type(exc).__name__}: {str(exc)[:160]}"
        except Exception as exc:
            for b in baselines:
                emit({"task": path, "baseline": b, "ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            continue
        for b in baselines:
            try:
                torch._dynamo.reset()
                if b == "eager":
                    fn: Any = model
                elif b == "compile":
                    fn = torch.compile(model)
                elif b == "compile-max-autotune":
                    fn = torch.compile(model, mode="max-autotune")
                else:
                    raise ValueError(f"unknown baseline {b!r}")
                with torch.no_grad():
                    t0 = time.perf_counter()
                    out = _flat_outputs(fn(*inputs))
                    if device == "cuda":
                        torch.cuda.synchronize()
                    first_s = time.perf_counter() - t0
                    correct, kb_vs_eager, max_err = True, True, 0.0
                    errors: list[dict[str, Any]] = []
                    for j, (r, o) in enumerate(zip(ref, out, strict=True)):
                        if isinstance(r, torch.Tensor) and (r.shape != o.shape or r.dtype != o.dtype):
                            correct = kb_vs_eager = False
                            continue
                        r64 = ref64[j] if ref64 is not None else None
                        c = compare_output(f"output{j}", r, o, r64, fp64_note=fp64_note)
                        correct &= c.strict_ok  # strict: against float64, bound scaled by eager's own error
                        kb_vs_eager &= c.kernelbench_ok
                        if math.isfinite(c.max_abs_vs_ref):
                            max_err = max(max_err, c.max_abs_vs_ref)
                        errors.append({"output": c.output, "judged_by": c.strict_basis,
                                       "rel_l2_vs_fp64": c.candidate_rel_l2, "eager_rel_l2_vs_fp64": c.reference_rel_l2,
                                       "bound_rel_l2": c.strict_bound_rel_l2, "detail": c.detail})
                    if warm_only:  # compile caches filled; nothing measured
                        continue
                    if device == "cuda":

                        def call(fn: Any = fn, inputs: list[Any] = inputs) -> Any:
                            return fn(*inputs)

                        timing = time_cuda(call, runs)
                    else:  # CPU (tests only): wall time, no cache flush
                        ts = []
                        for _ in range(runs):
                            t1 = time.perf_counter()
                            fn(*inputs)
                            ts.append((time.perf_counter() - t1) * 1e6)
                        q = statistics.quantiles(ts, n=10)
                        timing = {"median_us": statistics.median(ts), "p10_us": q[0], "p90_us": q[-1],
                                  "min_us": min(ts), "runs": runs, "cuda_graph": False}
                import resource

                peaks = {"peak_host_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}
                if device == "cuda":
                    peaks["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated())
                emit({"task": path, "baseline": b, "ok": True, "correct": correct, "max_abs_err_vs_eager": max_err,
                      "kernelbench_vs_eager": kb_vs_eager, "errors": errors, "precision": precision_settings(),
                      "memory": peaks, "first_call_s": first_s, "timing": timing})
                del out
            except Exception as exc:
                emit({"task": path, "baseline": b, "ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        del model, inputs, ref, ref64
        if device == "cuda":
            torch.cuda.empty_cache()
        sys.stdout.write(f"DONE {path}\n")
        sys.stdout.flush()


# ---------------------------------------------------------------------------------------------------
# The parent
# ---------------------------------------------------------------------------------------------------
def _versions() -> dict[str, str]:
    import platform

    import torch

    v = {"python": platform.python_version(), "torch": torch.__version__, "cuda": str(torch.version.cuda),
         # PyTorch's precision defaults, which both baselines use: cuDNN's TF32 makes fp32 convolutions TF32.
         "float32_matmul_precision": torch.get_float32_matmul_precision(),
         "cudnn_allow_tf32": str(torch.backends.cudnn.allow_tf32)}
    try:
        import triton

        v["triton"] = triton.__version__
    except Exception:
        pass
    return v


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(path)


def run_bench(suite_dir: str | Path, baselines: list[str], out_dir: str | Path, *, runs: int = 100,
              seed: int = 42, task_timeout_s: float = 600.0, ceilings_dir: str | Path | None = None,
              only: list[str] | None = None, jobs: int = 1, on_progress: Callable[[str], None] = print,
              device: str = "cuda", ceilings: Any = None, workers: Workers | None = None) -> dict[str, Any]:
    """Benchmark every task under `suite_dir` with `baselines`, resuming from `out_dir/bench-results.json`.

    `device="cpu"` with given `ceilings` exists for tests of the driver; CPU times mean nothing here.
    `workers` (`--gpus`, `--workers`): each task is a GPU job of its own (a bench worker process for that
    task, on one GPU worker at a time), spread over the workers' GPUs; a task whose worker dies or hangs is
    retried on another GPU, and a GPU that keeps faulting is quarantined (kstrata.agents.workers). Without
    it, one worker process runs the tasks one after another on the default GPU.
    """
    import torch

    from kstrata.agents.roofline import assess, load_or_measure
    from kstrata.agents.tasks import TaskError, describe_tasks, find_tasks

    unknown = [b for b in baselines if b not in BASELINES]
    if unknown:
        raise ValueError(f"unknown baselines {unknown}; choose from {', '.join(BASELINES)}")
    if device == "cuda" and not torch.cuda.is_available() and (workers is None or workers.name == "local"):
        raise RuntimeError("kstrata bench needs a CUDA GPU")
    if "eager" not in baselines:
        baselines = ["eager", *baselines]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / RESULTS_FILE
    suite = Path(suite_dir)
    if ceilings is None:
        ceilings, ceil_path = load_or_measure(ceilings_dir or out)
        source = ceil_path.name
    else:
        source = "given"
    on_progress(f"ceilings ({source}): copy {ceilings.copy_bytes_per_s / 1e12:.2f} TB/s, matmul " +
                ", ".join(f"{k} {v / 1e12:.1f} TFLOP/s" for k, v in ceilings.matmul_flops_per_s.items()))
    if results_path.exists():
        results: dict[str, Any] = json.loads(results_path.read_text())
        results["baselines"] = list(dict.fromkeys([*results.get("baselines", []), *baselines]))
    else:
        results = {"schema": BENCH_SCHEMA, "suite": str(suite),
                   "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                   "versions": _versions(), "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                   "runs": runs, "seed": seed, "baselines": list(baselines), "tasks": {}}
    results["ceilings"] = ceilings.to_json()
    paths = find_tasks(suite)
    if only:
        paths = [p for p in paths if any(o in str(p) for o in only)]
    names = {p: str(p.relative_to(suite)) if p.is_relative_to(suite) else p.name for p in paths}
    todo = [p for p in paths if not all(b in results["tasks"].get(names[p], {}).get("baselines", {}) for b in baselines)]
    on_progress(f"{len(paths)} tasks, {len(paths) - len(todo)} already in {results_path}, {len(todo)} to run")
    compiled = [b for b in baselines if b != "eager"]
    warmers = _start_warmers(todo, compiled, jobs, seed) if jobs > 1 and compiled and todo else []
    specs: dict[Path, Any] = {}
    # Described in child processes with a timeout: task code must not take the benchmark down.
    for p, spec in describe_tasks(todo):
        entry = results["tasks"].setdefault(names[p], {"path": str(p), "baselines": {}})
        if isinstance(spec, TaskError):
            for b in baselines:
                entry["baselines"][b] = {"ok": False, "error": f"task does not load: {spec}"}
            continue
        specs[p] = spec
        entry.update({"dtypes": list(spec.dtypes), "flops": spec.flops, "min_bytes": spec.min_bytes,
                      "arithmetic_intensity": spec.arithmetic_intensity})
    todo = [p for p in todo if p in specs]
    pending = list(todo)
    if warmers:
        _wait_warmers(warmers, task_timeout_s * len(pending) / jobs, on_progress)
    done_count = len(paths) - len(todo)
    if workers is not None:
        _bench_on_workers(workers, pending, names, specs, results, results_path, baselines, runs=runs, seed=seed,
                          device=device, timeout_s=task_timeout_s, ceilings=ceilings, on_progress=on_progress,
                          done=done_count, total=len(paths))
        results["workers"] = workers.describe()
        pending = []
    while pending:
        need = {str(p): [b for b in baselines if b not in results["tasks"][names[p]]["baselines"]] for p in pending}
        worker_baselines = sorted({b for bs in need.values() for b in bs}, key=list(BASELINES).index)
        # the one child protocol (backends/child.py): a new session, stdout read line by line with a deadline
        proc = ChildStream([sys.executable, "-m", "kstrata.agents.bench", "--worker", "--runs", str(runs),
                            "--device", device,
                            "--seed", str(seed), "--baselines", ",".join(worker_baselines),
                            *[str(p) for p in pending]],
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
        current: Path | None = None
        deadline = time.monotonic() + task_timeout_s
        restart = False
        while True:
            line: str | None
            try:
                line = proc.next_line(max(0.1, deadline - time.monotonic()))
            except ChildTimeout:
                line = "TIMEOUT"
            if line is None or line == "TIMEOUT":
                why = "timed out" if line == "TIMEOUT" else f"worker died (exit code {proc.proc.poll()})"
                if current is not None:
                    entry = results["tasks"][names[current]]
                    for b in baselines:
                        entry["baselines"].setdefault(b, {"ok": False, "error": why})
                    pending.remove(current)
                    done_count += 1
                    on_progress(f"[{done_count}/{len(paths)}] {names[current]}: {why}")
                    _write_json(results_path, results)
                if proc.proc.poll() is None:
                    proc.kill()
                restart = current is not None or line == "TIMEOUT"
                if not restart:  # died between tasks or before the first: the rest cannot run either
                    for q in list(pending):
                        for b in baselines:
                            results["tasks"][names[q]]["baselines"].setdefault(b, {"ok": False, "error": why})
                        pending.remove(q)
                    _write_json(results_path, results)
                break
            if line.startswith("START "):
                current = Path(line[6:].strip())
                deadline = time.monotonic() + task_timeout_s
            elif line.startswith("RESULT "):
                r = json.loads(line[7:])
                p = Path(r.pop("task"))
                b = r.pop("baseline")
                results["tasks"][names[p]]["baselines"][b] = r
            elif line.startswith("DONE ") and current is not None:
                _finish_task(results["tasks"][names[current]], specs[current], ceilings, baselines, assess)
                pending.remove(current)
                done_count += 1
                on_progress(f"[{done_count}/{len(paths)}] {names[current]}: " + _progress_line(results["tasks"][names[current]], baselines))
                _write_json(results_path, results)
                current = None
        proc.wait()
        proc.close()
        if not restart:
            break
    results["finished"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    results["summary"] = summarize(results)
    _write_json(results_path, results)
    write_report(results, out)
    return results


BENCH_TASK_JOB = "kstrata.agents.bench:bench_task_job"


def _bench_on_workers(workers: Workers, pending: list[Path], names: dict[Path, str], specs: dict[Path, Any],
                      results: dict[str, Any], results_path: Path, baselines: list[str], *, runs: int, seed: int,
                      device: str, timeout_s: float, ceilings: Any, on_progress: Callable[[str], None], done: int,
                      total: int) -> None:
    """Each task a GPU job (`bench_task_job`), as many at once as there are GPU workers."""
    from concurrent.futures import ThreadPoolExecutor

    from kstrata.agents.roofline import assess
    from kstrata.agents.workers import file_ref

    lock = threading.Lock()
    count = [done]

    def one(p: Path) -> None:
        need = [b for b in baselines if b not in results["tasks"][names[p]]["baselines"]]
        out = workers.run(BENCH_TASK_JOB, {"task": file_ref(p), "baselines": need, "runs": runs, "seed": seed,
                                           "device": device, "timeout_s": timeout_s}, kind="gpu", exclusive=True)
        with lock:
            entry = results["tasks"][names[p]]
            for b, r in (out.get("results") or {}).items():
                entry["baselines"][b] = r
            for b in baselines:
                entry["baselines"].setdefault(b, {"ok": False, "error": str(out.get("error") or "not run")})
            if out.get("ok"):
                _finish_task(entry, specs[p], ceilings, baselines, assess)
            count[0] += 1
            on_progress(f"[{count[0]}/{total}] {names[p]}" + (f" ({out['gpu']})" if out.get("gpu") else "") + ": "
                        + (_progress_line(entry, baselines) if out.get("ok") else str(out.get("error"))))
            _write_json(results_path, results)

    with ThreadPoolExecutor(max_workers=max(1, len(workers.gpus))) as threads:
        list(threads.map(one, pending))


def bench_task_job(p: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Driver: one task's baselines in a bench worker process on this job's GPU (`--worker`, one task)."""
    task = materialize(p["task"], ctx)
    baselines = list(p["baselines"])
    proc = ChildStream([sys.executable, "-m", "kstrata.agents.bench", "--worker", "--runs", str(p["runs"]),
                        "--device", p["device"], "--seed", str(p["seed"]), "--baselines", ",".join(baselines),
                        str(task)], env={**ctx.environ(), "PYTHONUNBUFFERED": "1"})
    got: dict[str, Any] = {}
    deadline = time.monotonic() + float(p["timeout_s"])
    why = ""
    try:
        while True:
            try:
                line = proc.next_line(max(0.1, deadline - time.monotonic()))
            except ChildTimeout:
                why = f"timed out after {float(p['timeout_s']):g} s"
                break
            if line is None:
                if not all(b in got for b in baselines):
                    why = f"worker died (exit code {proc.proc.poll()})"
                break
            if line.startswith("RESULT "):
                r = json.loads(line[7:])
                r.pop("task", None)
                got[r.pop("baseline")] = r
            elif line.startswith("DONE "):
                break
    finally:
        proc.close()
    gpu = ctx.env.get("CUDA_VISIBLE_DEVICES")
    return {"ok": not why, "results": got, "error": why, "device_fault": bool(why) and ctx.device is not None,
            "gpu": f"GPU {gpu}" if gpu else ""}


def _start_warmers(paths: list[Path], baselines: list[str], jobs: int, seed: int) -> list[ChildStream]:
    """Compile every task in `jobs` parallel workers first (CPU-bound), so that the timed, sequential pass
    finds torch.compile's caches warm. Nothing is measured there; a failure shows again in the timed pass."""
    slices = [paths[i::jobs] for i in range(jobs)]
    return [ChildStream([sys.executable, "-m", "kstrata.agents.bench", "--worker", "--warm-only", "--seed", str(seed),
                         "--baselines", ",".join(baselines), *[str(p) for p in part]])
            for part in slices if part]


def _wait_warmers(procs: list[ChildStream], timeout_s: float, on_progress: Callable[[str], None]) -> None:
    start = time.monotonic()
    for proc in procs:
        try:
            while proc.next_line(max(1.0, timeout_s - (time.monotonic() - start))) is not None:
                pass  # their output is not used
        except ChildTimeout:
            pass
        proc.close()  # kills it (and what it started) if it is still running
    on_progress(f"compile caches warmed by {len(procs)} parallel workers ({time.monotonic() - start:.0f} s after the "
                "task specs were read)")


def _finish_task(entry: dict[str, Any], spec: Any, ceilings: Any, baselines: list[str], assess: Any) -> None:
    eager = entry["baselines"].get("eager", {})
    eager_us = eager.get("timing", {}).get("median_us") if eager.get("ok") else None
    for b in baselines:
        r = entry["baselines"].get(b)
        if not r or not r.get("ok"):
            continue
        t = r["timing"]["median_us"]
        speedup = eager_us / t if eager_us and b != "eager" else (1.0 if b == "eager" else None)
        r["speedup_vs_eager"] = speedup
        point = assess(spec, ceilings, t * 1e-6, speedup, baseline_seconds=eager_us * 1e-6 if eager_us else None,
                       baseline="eager")
        r["sol_fraction"] = point.fraction
        r["roofline"] = point.to_json()
        r["flags"] = list(point.flags)
        if point.flags:
            r["accepted"] = False


def _progress_line(entry: dict[str, Any], baselines: list[str]) -> str:
    parts = []
    for b in baselines:
        r = entry["baselines"].get(b, {})
        if not r.get("ok"):
            parts.append(f"{b} FAILED ({r.get('error', '?')[:80]})")
            continue
        s = f"{b} {r['timing']['median_us']:.1f} us"
        if b != "eager" and r.get("speedup_vs_eager"):
            s += f" ({r['speedup_vs_eager']:.2f}x)"
        s += f" {100 * r.get('sol_fraction', 0):.0f}% SOL" + ("" if r.get("correct") else " INCORRECT")
        parts.append(s)
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------------
# Report: markdown and plots
# ---------------------------------------------------------------------------------------------------
def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def render_markdown(results: dict[str, Any]) -> str:
    baselines = results["baselines"]
    summary = results.get("summary") or summarize(results)
    c = results.get("ceilings", {})
    lines = [f"# kstrata bench: {results['suite']}", "",
             f"Device: {results['device']}; versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()) +
             f"; started {results.get('started')}, finished {results.get('finished', '(unfinished)')}.", "",
             f"Timing: median of {results['runs']} runs (CUDA events, synchronize before the end event, L2 flushed "
             "before each run, warm-up); ± is the 10th–90th percentile range. Inputs: the task's own `get_inputs()` "
             f"(seed {results['seed']}). Correct: outputs match eager within KernelBench's tolerance for the dtype.", ""]
    if c:
        lines += ["Ceilings (measured " + c.get("date", "?") + f"): copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s; matmul " +
                  ", ".join(f"{k} {v / 1e12:.1f} TFLOP/s" for k, v in c["matmul_flops_per_s"].items()) +
                  ". SOL: speed-of-light time from the task's FLOPs and minimum bytes; %SOL = SOL time / measured time.", ""]
    lines += ["## Summary", "", "| baseline | tasks | correct | flagged | geomean speedup vs eager | " +
              " | ".join(f"fast_{p:g}" for p in FAST_P) + " | fast_1 unflagged | geomean %SOL |",
              "|---|---:|---:|---:|---:|" + "---:|" * len(FAST_P) + "---:|---:|"]
    for b in baselines:
        s = summary[b]
        fr = s["geomean_sol_fraction"]
        unflagged = s.get("fast_p_unflagged", {}).get("fast_1")
        lines.append(f"| {b} | {s['tasks']} | {s['correct']} | {s.get('flagged', 0)} | "
                     f"{_fmt(s['geomean_speedup_vs_eager'], '.3f')} | " +
                     " | ".join(f"{s['fast_p'][f'fast_{p:g}']:.2f}" for p in FAST_P) +
                     f" | {_fmt(unflagged, '.2f')} | {_fmt(None if fr is None else 100 * fr, '.1f')} |")
    lines += ["", "fast_p (KernelBench): fraction of all tasks that are correct and faster than eager by more than p. "
              "For eager itself the speedup is 1.0 by definition. *Flagged*: correct but faster than speed of light "
              "or more than 10x faster than eager, so not accepted until explained; *fast_1 unflagged* leaves them "
              "out. The geometric mean speedup is over the correct tasks.", "", "## Per task", ""]
    head = "| task | dtype | GFLOP | MB | SOL µs | bound |"
    rule = "|---|---|---:|---:|---:|---|"
    for b in baselines:
        head += f" {b} µs | {b} %SOL |" + ("" if b == "eager" else f" {b} speedup | {b} ok |")
        rule += "---:|---:|" + ("" if b == "eager" else "---:|---|")
    lines += [head, rule]
    for name, e in results["tasks"].items():
        row = f"| {name} | {','.join(e.get('dtypes', []))} | {e.get('flops', 0) / 1e9:.2f} | {e.get('min_bytes', 0) / 1e6:.1f} |"
        roof = next((r.get("roofline") for r in e["baselines"].values() if r.get("roofline")), None)
        row += f" {_fmt(roof['sol_seconds'] * 1e6 if roof else None, '.1f')} | {roof['bound'] if roof else '—'} |"
        for b in baselines:
            r = e["baselines"].get(b, {})
            if not r.get("ok"):
                row += " failed |" + ("" if b == "eager" else " | | " + r.get("error", "not run")[:60].replace("|", "/") + " |")
                if b == "eager":
                    row += " |"
                continue
            t = r["timing"]
            cell = f" {t['median_us']:.1f} ±{(t['p90_us'] - t['p10_us']) / 2:.1f} | {100 * r.get('sol_fraction', 0):.1f} |"
            if b != "eager":
                flag = " ⚑" if r.get("flags") else ""
                cell += f" {_fmt(r.get('speedup_vs_eager'), '.2f')}{flag} | {'yes' if r.get('correct') else 'NO'} |"
            row += cell
        lines.append(row)
    flagged = [(n, b, r["flags"]) for n, e in results["tasks"].items() for b, r in e["baselines"].items() if r.get("flags")]
    if flagged:
        lines += ["", "## Flagged (not accepted until explained)", ""]
        lines += [f"- {n} / {b}: {'; '.join(f)}" for n, b, f in flagged]
    return "\n".join(lines) + "\n"


def render_plots(results: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    tasks = results["tasks"]
    names = list(tasks)
    baselines = results["baselines"]
    others = [b for b in baselines if b != "eager"]
    colors = {"eager": "#4C72B0", "compile": "#DD8452", "compile-max-autotune": "#55A868"}

    # 1. Speedup over eager per task, log scale.
    if others:
        fig, ax = plt.subplots(figsize=(9, 0.28 * len(names) + 1.5))
        h = 0.8 / len(others)
        for k, b in enumerate(others):
            ys, xs, cs = [], [], []
            for i, n in enumerate(names):
                r = tasks[n]["baselines"].get(b, {})
                s = r.get("speedup_vs_eager")
                if r.get("ok") and s:
                    ys.append(i + k * h)
                    xs.append(s)
                    cs.append(colors.get(b, "gray") if r.get("correct") else "#BBBBBB")
            # Bars grow from 1.0: slower than eager to the left, faster to the right.
            ax.barh(ys, [x - 1.0 for x in xs], height=h, color=cs, label=b, left=1.0)
            for y, x in zip(ys, xs, strict=True):
                ax.text(x * (1.03 if x >= 1 else 0.97), y, f"{x:.2f}", va="center", ha="left" if x >= 1 else "right",
                        fontsize=6)
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlim(right=ax.get_xlim()[1] * 1.4)  # room for the labels
        ax.set_yticks([i + 0.4 - h / 2 for i in range(len(names))], names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("speedup over eager (log scale; grey = incorrect)")
        ax.set_title(f"{results['device']}: speedup over eager PyTorch")
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        p = out_dir / "bench-speedup.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)

    # 2. Roofline: achieved TFLOP/s against arithmetic intensity, with the measured roofs.
    c = results.get("ceilings")
    if c:
        fig, ax = plt.subplots(figsize=(8, 5.5))
        bw = c["copy_bytes_per_s"]
        xs = [e.get("arithmetic_intensity", 0) for e in tasks.values() if e.get("arithmetic_intensity")]
        if xs:
            lo, hi = max(min(xs) / 2, 1e-3), max(xs) * 2
            grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
            for k, rate in c["matmul_flops_per_s"].items():
                ax.plot(grid, [min(bw * x, rate) / 1e12 for x in grid], lw=1, alpha=0.6, label=f"roof {k}")
            for b in baselines:
                px, py = [], []
                for e in tasks.values():
                    r = e["baselines"].get(b, {})
                    if r.get("ok") and e.get("arithmetic_intensity") and e.get("flops"):
                        px.append(e["arithmetic_intensity"])
                        py.append(e["flops"] / (r["timing"]["median_us"] * 1e-6) / 1e12)
                ax.scatter(px, py, s=18, color=colors.get(b, "gray"), label=b, zorder=3)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("arithmetic intensity (FLOP per minimum byte)")
            ax.set_ylabel("achieved TFLOP/s")
            ax.set_title(f"{results['device']}: tasks on the measured roofline")
            ax.legend(fontsize=7)
            fig.tight_layout()
            p = out_dir / "bench-roofline.png"
            fig.savefig(p, dpi=110)
            plt.close(fig)
            written.append(p)

    # 3. Fraction of speed of light per task and baseline.
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(names) + 1.5))
    h = 0.8 / len(baselines)
    for k, b in enumerate(baselines):
        ys, xs = [], []
        for i, n in enumerate(names):
            r = tasks[n]["baselines"].get(b, {})
            if r.get("ok") and r.get("sol_fraction") is not None:
                ys.append(i + k * h)
                xs.append(100 * r["sol_fraction"])
        ax.barh(ys, xs, height=h, color=colors.get(b, "gray"), label=b)
    ax.axvline(100, color="black", lw=0.8)
    ax.set_yticks([i + 0.4 - h / 2 for i in range(len(names))], names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("% of speed of light (100% = at the roofline bound)")
    ax.set_title(f"{results['device']}: fraction of speed of light")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    p = out_dir / "bench-sol-fraction.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    return written


def write_report(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write the markdown report and the plots (plots skipped, with a note, if matplotlib is missing)."""
    md = out_dir / REPORT_FILE
    md.write_text(render_markdown(results))
    written = [md]
    try:
        written += render_plots(results, out_dir)
    except ImportError:
        pass
    return written


def _main(argv: list[str]) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="kstrata.agents.bench")
    p.add_argument("--worker", action="store_true", required=True)
    p.add_argument("--baselines", required=True)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--warm-only", action="store_true")
    p.add_argument("--device", default="cuda")
    p.add_argument("tasks", nargs="*")
    a = p.parse_args(argv)
    _worker(a.tasks, a.baselines.split(","), a.runs, a.seed, a.warm_only, a.device)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    _main(sys.argv[1:])
