"""`kstrata bench`: every task of a suite under each baseline, checked, timed and placed on the roofline,
all through the candidate engine (`kstrata.agents.engine`).

Baselines (`BASELINES`): `eager` (the task's `Model` as written), `compile` (`torch.compile(model)`),
`compile-max-autotune` (`torch.compile(model, mode="max-autotune")`). Each baseline is a task-level
candidate, represented as the optimizer represents its baselines: a configuration of the task's own model
(`agents/optimize/configs.py` `baseline_params` + `render`) rendered as a standalone `ModelNew`, here with
`torch_defaults` (PyTorch's precision switches left as they are: TF32 cuDNN convolutions by default, so the
figures are what a PyTorch user gets). The engine builds it (`Candidate.task`: content-addressed, cached),
checks it (`Engine.check` with `TaskOptions`: the hardened evaluator, `agents/evaluate.py`, the reference
and the candidate each in its own process with a timeout) and times it (`Engine.measure`: the evaluator's
timing, `backends/timing.py`'s one GPU timer: CUDA events, a device-wide synchronize before the end event,
the L2 flushed before each run, warm-up, the median of `runs` runs with p10/p90). This module has no timer
and no child protocol of its own.

Correctness (unchanged in meaning): a baseline is `correct` when its error against the float64 truth (the
model and inputs in float64) is within the evaluator's strict bound scaled by *eager's own error at
PyTorch's defaults*: the evaluation runs under the evaluator's `kernelbench` policy, whose reference is
the task's `Model` at PyTorch's default precision, and bench takes the strict, float64-anchored verdict it
computes beside it (`correct.strict`). PyTorch's default `cudnn.allow_tf32 = True` lets cuDNN run an fp32
convolution in TF32 or not, by shape and layout: on the H200 eager's NCHW convolution came out IEEE-exact
and torch.compile's channels-last one TF32 (2.9e-4 from the truth), so where the reference's settings
allow TF32 the bound is also scaled by the error of TF32 rounding (`evaluate.compare_output`'s
`allowance`); comparing eager and torch.compile with each other at KernelBench's 1e-4 had called
torch.compile incorrect on the level2 conv + GroupNorm tasks for a difference PyTorch's defaults make. KernelBench's allclose against eager on the task's own inputs is reported too
(`kernelbench_vs_eager`); when the float64 run is impossible (an op without float64), it decides and the
row says so (`errors[].judged_by`). What changed with the engine: the verdict covers the evaluator's
`MIN_TRIALS` (5) trials (the task's own inputs first, then shifted, uniform, heavy-tailed and zero/negative
inputs) and its integrity checks, not the task's own inputs alone; `errors[]` are the first trial's (the
task's own inputs), as before. `precision` and `memory` are the candidate process's. Every row's time is
its candidate's (eager too: the task's `Model` called through the same `ModelNew` wrapper as the compiled
baselines, so the speedups compare like with like). Gone with the old worker: `first_call_s` (the evaluator
does not time the first call, which holds torch.compile's compile). The price of the hardening: each
baseline is a whole evaluation (the reference process too), about five times the correctness work of the
old one-process-per-task worker; at KernelBench's published sizes that is minutes per baseline.

Caching: an evaluation is kept in the engine cache (`TaskOptions.keep`) under the candidate's content,
the task's content, the options, the device and the torch/Triton/kstrata versions, so a re-run on
unchanged tasks and versions answers from it (each row's `engine.cached`, and the run's
`engine.check_cache_hits`, say so); `use_cache=False` (`--no-cache`) evaluates and times again. Without a
GPU nothing is timed (`timing` is null with the engine's reason in `timing_note`); the verdicts stand.

Each task is one job (`bench_task_job`) on `kstrata.agents.workers`: by default this machine, one task
after another; with `--gpus` one GPU worker per device (a task whose evaluation dies with a CUDA fault is
retried on another GPU, a GPU that keeps faulting is quarantined), with `--workers ray` on a Ray cluster.
Results go to `bench-results.json` after every task, so an interrupted run resumes where it stopped (tasks
already in the file are skipped). At the end: `bench-report.md` (per-task time, speedup vs eager, fraction
of speed of light, correctness; geometric means and KernelBench's fast_p) and PNG plots
(`bench-speedup.png`, `bench-roofline.png`, `bench-sol-fraction.png`). `jobs` > 1 first evaluates the
compiled baselines untimed in that many parallel jobs, which fills torch.compile's on-disk caches for the
timed pass (nothing from it is kept).

fast_p follows KernelBench's `fastp` (src/score.py): the fraction of *all* tasks that are correct and
faster than the baseline by more than p (speedup > p); fast_0 is the fraction correct.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kstrata.agents.workers import JobContext, LocalWorkers, Workers, fault_in, file_ref, materialize
from kstrata.ir.errors import KstrataError

BENCH_SCHEMA = "kstrata.bench/2"
BASELINES = ("eager", "compile", "compile-max-autotune")
FAST_P = (0.0, 1.0, 1.5, 2.0)
RESULTS_FILE = "bench-results.json"
REPORT_FILE = "bench-report.md"
#: The evaluator's options bench checks with: its `kernelbench` policy keeps PyTorch's precision defaults
#: in the reference (the strict verdict beside it is bench's `correct`); the fewest trials it takes.
EVAL_POLICY = "kernelbench"
BENCH_TASK_JOB = "kstrata.agents.bench:bench_task_job"
#: How `evaluate` says that a process of an evaluation died or hung (`WorkerRun.failure`).
_PROCESS_LOST = ("process died", "timed out (killed)")


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
# Baselines as candidates, and the job that checks and times them through the engine
# ---------------------------------------------------------------------------------------------------
def baseline_candidates(path: Path, spec: Any, baselines: list[str]) -> dict[str, dict[str, Any]]:
    """Each baseline of the task at `path` as the optimizer's task candidate (`configs.render` of
    `baseline_params`, with PyTorch's precision defaults), as the fields of the engine's `Candidate.task`."""
    from kstrata.agents.optimize.configs import baseline_params, render
    from kstrata.agents.optimize.state import TaskInfo

    info = TaskInfo(path, path.stem, path.read_text(), spec)
    out = {}
    for b in baselines:
        c = render(info, {**baseline_params(b), "torch_defaults": True}, space="baseline", proposer=f"baseline:{b}",
                   description=f"baseline {b} (PyTorch's precision defaults)")
        out[b] = c.engine_fields()
    return out


def _row(check: Any, timing: Any, key: str) -> dict[str, Any]:
    """One baseline's row of `bench-results.json` from the engine's check (the evaluator's verdict JSON)
    and measurement."""
    v: dict[str, Any] = check.report or {}
    engine = {"candidate": key, "cached": bool(check.cached), "verdict": check.verdict.value}
    if v.get("failure") in ("crash", "timeout", "import"):  # it did not run to a result
        return {"ok": False, "error": str(v.get("reason") or check.reason), "engine": engine}
    first = (v.get("trials") or [{}])[0]
    errors = [{"output": o["output"], "judged_by": o["strict_basis"], "rel_l2_vs_fp64": o.get("candidate_rel_l2"),
               "eager_rel_l2_vs_fp64": o.get("reference_rel_l2"), "bound_rel_l2": o.get("strict_bound_rel_l2"),
               "scale": o.get("strict_scale", "pytorch"), "tf32_rel_l2_vs_fp64": o.get("allowance_rel_l2"),
               "detail": o.get("detail", "")} for o in first.get("outputs", [])]
    finite = [o["max_abs_vs_ref"] for o in first.get("outputs", [])
              if isinstance(o.get("max_abs_vs_ref"), (int, float)) and math.isfinite(o["max_abs_vs_ref"])]
    correct = v.get("correct") or {}
    row: dict[str, Any] = {
        "ok": True, "correct": bool(correct.get("strict")),
        "kernelbench_vs_eager": bool(correct.get("kernelbench_task_inputs")),
        "kernelbench_all_trials": bool(correct.get("kernelbench")), "verdict": _strict_reason(v),
        "trials": len(v.get("trials") or []), "max_abs_err_vs_eager": max(finite, default=0.0), "errors": errors,
        "precision": (v.get("precision") or {}).get("candidate") or {},
        "memory": (v.get("memory") or {}).get("candidate") or {}, "engine": engine,
        "timing": timing.detail.get("candidate") if timing.status == "timed" else None}
    if row["timing"] is None:
        row["timing_note"] = timing.reason
    return row


def _strict_reason(v: dict[str, Any]) -> str:
    """Why bench's verdict (strict, against float64) is what it is, in one line."""
    trials = v.get("trials") or []
    failed = [c for c in v.get("checks") or [] if not c.get("ok")] + \
        [c for t in trials for c in t.get("checks") or [] if not c.get("ok")]
    if failed:
        return f"{failed[0]['name']}: {failed[0].get('detail', '')}"
    for t in trials:
        for o in t.get("outputs") or []:
            if not o.get("strict_ok"):
                return f"trial {t['index']} ({t['distribution']} inputs), {o['output']}: {o.get('detail') or 'differs'}"
    tf32 = any(o.get("strict_scale") == "tf32" for t in trials for o in t.get("outputs") or [])
    scale = ("TF32 rounding of its convolutions as the scale, which PyTorch's default cudnn.allow_tf32 allows "
             "and eager's own error is below" if tf32 else "eager's own error as the scale")
    return f"correct on all {len(trials)} trials: within the strict bound against float64 ({scale})"


def bench_task_job(p: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Driver: one task's baselines through an engine on this job's worker (its GPU, when it has one):
    each built (`Candidate.task`), checked (`TaskOptions`, kept in the engine cache) and measured."""
    from kstrata.agents.engine import Candidate, Engine, Measurement, TaskOptions, WorkerPool
    from kstrata.agents.evaluate import MIN_TRIALS
    from kstrata.agents.workers import GpuDevice

    task = materialize(p["task"], ctx)
    warm = bool(p.get("warm_only"))
    timed = p["device"] == "cuda" and not warm
    options = TaskOptions(policy=EVAL_POLICY, trials=MIN_TRIALS, seed=p["seed"], runs=p["runs"], timing=timed,
                          keep=not warm, env=ctx.environ() if ctx.env else None)
    results: dict[str, Any] = {}
    faults = []
    # this job holds its worker's GPU: the engine's GPU queue is that one device, unpinned (the pinning is
    # `options.env`, the job's own environment)
    with Engine(p.get("engine_cache"), WorkerPool(1, gpus=[GpuDevice(0, "this job's GPU")])) as engine:
        base = engine.add_task(task)
        for b, fields in p["candidates"].items():
            try:
                cand = Candidate.task(base, **fields)
                built = engine.build(cand)
                check = engine.check(base, built, device=p["device"], timeout=float(p["timeout_s"]), task=options,
                                     use_cache=bool(p.get("use_cache", True)))
                if warm:
                    continue
                report = check.report or {}
                # the evaluation timed both sides when it could: `measure` returns those timings (it would
                # evaluate again for a baseline the evaluation did not time, which is one that failed)
                timing = engine.measure(base, built) if report.get("candidate_timing") else Measurement(
                    "skipped", str(report.get("timing_note") or f"not timed: {check.reason}"))
            except KstrataError as exc:  # the harness could not run the task (it does not load, the reference fails)
                results[b] = {"ok": False, "error": str(exc)}
                # the reference's process died or hung (`evaluate`'s wording): on a GPU worker that may be the GPU
                if ctx.device is not None and any(w in str(exc) for w in _PROCESS_LOST):
                    faults.append(b)
                continue
            results[b] = _row(check, timing, cand.key)
            report = check.report or {}
            # a baseline's process that died or hung on a GPU worker (a CUDA fault above all) may be the GPU's:
            # the workers retry the task on another GPU, and a task that fails everywhere keeps its own failure
            if ctx.device is not None and report.get("failure") in ("crash", "timeout") and (
                    fault_in(str(report.get("reason", "")) + str(report.get("log_tail", "")))
                    or any(w in str(report.get("reason", "")) for w in _PROCESS_LOST)):
                faults.append(b)
        stats = engine.stats.to_json()
    gpu = ctx.env.get("CUDA_VISIBLE_DEVICES")
    return {"ok": True, "results": results, "engine": stats, "device_fault": bool(faults),
            "error": f"CUDA fault in {', '.join(faults)}" if faults else "", "gpu": f"GPU {gpu}" if gpu else ""}


# ---------------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------------
def _versions() -> dict[str, str]:
    import platform

    import torch

    v = {"python": platform.python_version(), "torch": torch.__version__, "cuda": str(torch.version.cuda),
         # PyTorch's precision defaults, which the baselines use: cuDNN's TF32 makes fp32 convolutions TF32.
         "float32_matmul_precision": torch.get_float32_matmul_precision(),
         "cudnn_allow_tf32": str(torch.backends.cudnn.allow_tf32)}
    try:
        import triton

        v["triton"] = triton.__version__
    except ImportError:
        pass
    return v


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(path)


def run_bench(suite_dir: str | Path, baselines: list[str], out_dir: str | Path, *, runs: int = 100,
              seed: int = 42, task_timeout_s: float = 600.0, ceilings_dir: str | Path | None = None,
              only: list[str] | None = None, jobs: int = 1, on_progress: Callable[[str], None] = print,
              device: str = "cuda", ceilings: Any = None, workers: Workers | None = None,
              engine_cache: str | Path | None = None, use_cache: bool = True) -> dict[str, Any]:
    """Benchmark every task under `suite_dir` with `baselines`, resuming from `out_dir/bench-results.json`.

    `device="cpu"` with given `ceilings` exists for tests of the driver: the verdicts are real, nothing is
    timed. `workers` (`--gpus`, `--workers`): each task is a GPU job of its own, spread over the workers'
    GPUs (kstrata.agents.workers); without it, the tasks run one after another on this machine.
    `engine_cache`: the engine's cache directory (default `KSTRATA_ENGINE_CACHE` or
    ~/.cache/kstrata/engine); `use_cache=False` evaluates every baseline again (`--no-cache`).
    `task_timeout_s` bounds each evaluation process (the reference's, each baseline's).
    """
    import torch

    from kstrata.agents.engine import Engine, default_cache_dir
    from kstrata.agents.roofline import load_or_measure
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
    cache_dir = Path(engine_cache).expanduser() if engine_cache is not None else default_cache_dir()
    Engine(cache_dir).close()  # a cache that cannot be made: the one clear error, before any work
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
    pending = [p for p in todo if p in specs]
    local = workers is None
    pool: Workers = workers if workers is not None else LocalWorkers(workdir=out / ".work")
    kind = "gpu" if not local or device == "cuda" else "cpu"
    common = {"runs": runs, "seed": seed, "device": device, "timeout_s": task_timeout_s,
              "engine_cache": str(cache_dir), "use_cache": use_cache}
    compiled = [b for b in baselines if b != "eager"]
    if jobs > 1 and compiled and pending and local:  # this machine's compile caches
        _warm(pool, pending, specs, compiled, common, jobs, on_progress)
    totals = {"evaluated": 0, "cached": 0}
    try:
        _bench_on_workers(pool, kind, pending, names, specs, results, results_path, baselines, common,
                          ceilings=ceilings, on_progress=on_progress, done=len(paths) - len(todo), total=len(paths),
                          totals=totals)
    finally:
        if local:
            pool.close()
    if not local:
        results["workers"] = pool.describe()
    results["engine"] = {"cache_dir": str(cache_dir), "use_cache": use_cache, **totals}
    on_progress(f"engine cache {cache_dir}: {totals['cached']} baseline results answered from it, "
                f"{totals['evaluated']} evaluated" + ("" if use_cache else " (--no-cache: nothing read from it)"))
    results["finished"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    results["summary"] = summarize(results)
    _write_json(results_path, results)
    write_report(results, out)
    return results


def _warm(pool: Workers, pending: list[Path], specs: dict[Path, Any], compiled: list[str], common: dict[str, Any],
          jobs: int, on_progress: Callable[[str], None]) -> None:
    """The compiled baselines of every task evaluated untimed, `jobs` at once (CPU-bound compiles), so the
    timed pass finds torch.compile's caches warm. Nothing from it is kept; a failure shows again later."""
    def one(p: Path) -> None:
        pool.run(BENCH_TASK_JOB, {**common, "task": file_ref(p), "warm_only": True,
                                  "candidates": baseline_candidates(p, specs[p], compiled)}, kind="cpu")

    with ThreadPoolExecutor(max_workers=jobs) as threads:
        list(threads.map(one, pending))
    on_progress(f"compile caches warmed by {jobs} parallel jobs ({len(pending)} tasks)")


def _bench_on_workers(workers: Workers, kind: str, pending: list[Path], names: dict[Path, str],
                      specs: dict[Path, Any], results: dict[str, Any], results_path: Path, baselines: list[str],
                      common: dict[str, Any], *, ceilings: Any, on_progress: Callable[[str], None], done: int,
                      total: int, totals: dict[str, int]) -> None:
    """Each task a job (`bench_task_job`), as many at once as there are GPU workers."""
    from kstrata.agents.roofline import assess

    lock = threading.Lock()
    count = [done]

    def one(p: Path) -> None:
        need = [b for b in baselines if b not in results["tasks"][names[p]]["baselines"]]
        out = workers.run(BENCH_TASK_JOB, {**common, "task": file_ref(p),
                                           "candidates": baseline_candidates(p, specs[p], need)},
                          kind=kind, exclusive=True)
        with lock:
            entry = results["tasks"][names[p]]
            for b, r in (out.get("results") or {}).items():
                entry["baselines"][b] = r
                if r.get("engine"):
                    totals["cached" if r["engine"]["cached"] else "evaluated"] += 1
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


def _finish_task(entry: dict[str, Any], spec: Any, ceilings: Any, baselines: list[str], assess: Any) -> None:
    eager = entry["baselines"].get("eager", {})
    eager_us = (eager.get("timing") or {}).get("median_us") if eager.get("ok") else None
    for b in baselines:
        r = entry["baselines"].get(b)
        if not r or not r.get("ok") or not r.get("timing"):
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
        s = f"{b} {r['timing']['median_us']:.1f} us" if r.get("timing") else f"{b} untimed"
        if b != "eager" and r.get("speedup_vs_eager"):
            s += f" ({r['speedup_vs_eager']:.2f}x)"
        if r.get("timing"):
            s += f" {100 * r.get('sol_fraction', 0):.0f}% SOL"
        s += ("" if r.get("correct") else " INCORRECT") + (" (engine cache)" if r.get("engine", {}).get("cached") else "")
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
             f"Timing: median of {results['runs']} runs (the engine's timer: CUDA events, synchronize before the end "
             "event, L2 flushed before each run, warm-up); ± is the 10th–90th percentile range. Inputs: the task's own "
             f"`get_inputs()` (seed {results['seed']}) and the evaluator's other trials. Correct: the error against "
             "float64 is within the strict bound scaled by eager's own error at PyTorch's precision defaults.", ""]
    eng = results.get("engine")
    if eng:
        lines += [f"Candidate engine: {eng.get('cached', 0)} baseline results answered from its cache "
                  f"(`{eng.get('cache_dir')}`), {eng.get('evaluated', 0)} evaluated in this run.", ""]
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
            t = r.get("timing")
            cell = (f" {t['median_us']:.1f} ±{(t['p90_us'] - t['p10_us']) / 2:.1f} | {100 * r.get('sol_fraction', 0):.1f} |"
                    if t else " untimed | — |")
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
                    if r.get("ok") and r.get("timing") and e.get("arithmetic_intensity") and e.get("flops"):
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


