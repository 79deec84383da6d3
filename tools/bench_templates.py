"""GPU benchmark of the Triton templates on the gap tasks (testsuite/tasks/gaps): eager, torch.compile and the
best template schedule (autotuned over its space), with speedup and fraction of speed of light.

    python -m kstrata.tools.bench_templates [--tasks 01,03] [--tune-s 35] [--runs 30] [--no-tf32]
    python -m kstrata.tools.bench_templates --paths testsuite/tasks/level2/01_gemm_bias_relu_fp16.py \
        --prefer gemm,attention,gemm_reduce      # other task files; only the first of these templates that matches

Per task, under `strict` (TF32 off for cuBLAS and cuDNN, as the hardened eval's reference):
  1. the model and inputs are built on the GPU under a seed (never on the host: inputs reach 6.4 GB);
  2. eager, `torch.compile` (default mode) and `torch.compile(mode="max-autotune")` (the optimizer's
     `compile-max-autotune` baseline: Inductor's GEMM/conv autotuning and CUDA graphs; `--no-max-autotune`
     leaves it out, and it is skipped with a note when less than `MAX_AUTOTUNE_RESERVE_S` of the task's
     time is left) are timed by the project's GPU timer (L2 flushed per run, CUDA events, median); the
     best of them is the baseline the template's speedup is over;
  3. every template that matches the task is autotuned (`kstrata.agents.templates.tune.autotune`, coordinate
     descent from the default schedule and the hints; `--tune-s` seconds a task, shared by its templates,
     what one leaves unspent going to the next), and the fastest one's best schedule is timed again like the
     baselines (task 04: `norm` after cuDNN's convolution and `conv` with the GroupNorm's partials fused
     compete); `--prefer` tunes only the first named template that matches;
  4. correctness on the GPU: eager and the template against the float64 model (the strict bound of
     `kstrata eval`: max abs and relative L2 error within 4x eager's own plus 8 ULPs).
Then, labelled `tf32`, the same with TF32 allowed (only tasks with a convolution or GEMM differ): eager,
compile and the template rendered for `tf32` with the strict-tuned schedule.
%SOL is `kstrata.agents.roofline.assess` with the device's measured ceilings, under the table's policy (tf32:
GEMM and convolution FLOPs at the measured TF32 tensor-core rate, not the fp32 one). Results go to
testsuite/results/templates-bench-<date>.{json,md} and, when $OUT is set, to $OUT.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GAPS = ROOT / "testsuite" / "tasks" / "gaps"
RESULTS = ROOT / "testsuite" / "results"


def _say(msg: str) -> None:
    print(msg, flush=True)


def pick(matches: list[Any], prefer: list[str]) -> Any:
    """The match of the first preferred template that matches, else the first match (`TEMPLATES`' order)."""
    for name in prefer:
        for m in matches:
            if m.template == name:
                return m
    return matches[0]


def contenders(matches: list[Any], prefer: list[str]) -> list[Any]:
    """The matches to tune: all of them (`TEMPLATES`' order), or with `prefer` only `pick`'s."""
    return [pick(matches, prefer)] if prefer else list(matches)


#: Seconds of the task's time that must be left to build the max-autotune baseline and still tune the template
#: (the tuning takes what is left, to 30 s before the task's deadline). On the H200 (2026-12-04) its builds of
#: the gap tasks took 2-40 s; at 90 s task 01, first with an even share of 550 s, had it skipped.
MAX_AUTOTUNE_RESERVE_S = 45.0


def bench_task(path: Path, ceilings: Any, *, tune_s: float, runs: int, tf32: bool, cache_dir: Path,
               deadline: float, prefer: list[str] | None = None, max_autotune: bool = True) -> dict[str, Any]:
    import torch

    from kstrata.agents.evaluate import strict_bounds
    from kstrata.agents.roofline import assess
    from kstrata.agents.tasks import load_task
    from kstrata.agents.templates import analyse
    from kstrata.agents.templates.tune import TaskOnDevice, TuneError, autotune, errors, set_policy
    from kstrata.backends.timing import time_gpu

    task = load_task(path)
    spec = task.spec
    entry: dict[str, Any] = {"task": path.stem, "flops": spec.flops, "min_bytes": spec.min_bytes, "strict": {}, "tf32": {}}
    a = analyse(task)
    if not a.matches:
        entry["error"] = "no template: " + "; ".join(f"{r.template}: {r.reason}" for r in a.rejected)
        return entry
    tried = contenders(list(a.matches), prefer or [])

    def timed(fn: Any) -> float:
        with torch.no_grad():
            return float(time_gpu(fn, runs=runs, warmup=3).median_us)

    def point(us: float, base_us: float | None = None, policy: str = "strict") -> dict[str, Any]:
        r = assess(spec, ceilings, us * 1e-6, None if base_us is None else base_us / us,
                   baseline_seconds=None if base_us is None else base_us * 1e-6, policy=policy)
        return {"median_us": round(us, 2), "sol_fraction": round(r.fraction, 4), "flags": list(r.flags),
                "explanations": list(r.explanations)}

    env = TaskOnDevice(tried[0])  # strict: model, inputs and eager output on the GPU (the task's, any match's)
    strict: dict[str, Any] = entry["strict"]
    eager_us = timed(lambda: env.model(*env.inputs))
    strict["eager"] = point(eager_us)
    _say(f"  eager {eager_us:.1f} us ({strict['eager']['sol_fraction']:.0%} SOL)")
    torch._dynamo.reset()
    compiled = torch.compile(env.model)
    t0 = time.monotonic()
    with torch.no_grad():
        compiled(*env.inputs)  # type: ignore[no-untyped-call]
    torch.cuda.synchronize()
    compile_s = time.monotonic() - t0
    compile_us = timed(lambda: compiled(*env.inputs))  # type: ignore[no-untyped-call]
    strict["compile"] = {**point(compile_us), "compile_s": round(compile_s, 1)}
    _say(f"  compile {compile_us:.1f} us ({strict['compile']['sol_fraction']:.0%} SOL; compiled in {compile_s:.0f} s)")
    bases = {"eager": eager_us, "compile": compile_us}
    if not max_autotune:
        strict["compile-max-autotune"] = {"note": "left out (--no-max-autotune)"}
    elif deadline - time.monotonic() < MAX_AUTOTUNE_RESERVE_S:
        strict["compile-max-autotune"] = {"note": f"skipped: under {MAX_AUTOTUNE_RESERVE_S:.0f} s of the task's time left"}
    else:
        torch._dynamo.reset()
        ma = torch.compile(env.model, mode="max-autotune")
        t0 = time.monotonic()
        with torch.no_grad():
            ma(*env.inputs)  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
        ma_s = time.monotonic() - t0
        bases["compile-max-autotune"] = ma_us = timed(lambda: ma(*env.inputs))  # type: ignore[no-untyped-call]
        strict["compile-max-autotune"] = {**point(ma_us), "compile_s": round(ma_s, 1)}
        _say(f"  compile max-autotune {ma_us:.1f} us ({strict['compile-max-autotune']['sol_fraction']:.0%} SOL; "
             f"compiled in {ma_s:.0f} s)")
        del ma
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
    best_name = min(bases, key=lambda k: bases[k])
    strict["best_baseline"] = best_name
    tune_end = time.monotonic() + tune_s
    results: list[tuple[Any, Any]] = []
    entry["contenders"] = []
    for i, cand in enumerate(tried):  # each its share of what is left, so time one leaves unspent goes to the next
        left = min(tune_end, deadline - 30) - time.monotonic()
        budget = max(5.0, left / (len(tried) - i))
        try:
            r = autotune(cand, budget_s=budget, cache_dir=cache_dir, runs=max(5, runs // 3), use_cache=False,
                         prepared=env, on_progress=_say)
        except TuneError as e:
            entry["contenders"].append({"template": cand.template, "error": str(e)[:400]})
            _say(f"  {cand.template}: {e}")
            continue
        results.append((cand, r))
        entry["contenders"].append({"template": cand.template, "params": r.params, "median_us": round(r.median_us, 2),
                                    "tried": len(r.trials), "tune_s": round(r.seconds, 1)})
    if not results:
        entry["error"] = "no template ran correctly: " + "; ".join(c["error"] for c in entry["contenders"])
        return entry
    m, tuned = min(results, key=lambda mr: mr[1].median_us)
    entry["template"] = m.template
    entry["description"] = m.description
    new = env.build(m.render(tuned.params), "best")
    best_base = bases[best_name]
    tmpl_us = timed(lambda: new(*env.inputs))
    strict["template"] = {**point(tmpl_us, best_base), "params": tuned.params, "tried": len(tuned.trials),
                          "failed": sum(1 for t in tuned.trials if t.median_us is None), "tune_s": round(tuned.seconds, 1),
                          "speedup_vs_best_baseline": round(best_base / tmpl_us, 3),
                          "speedup_vs_eager": round(eager_us / tmpl_us, 3), "speedup_vs_compile": round(compile_us / tmpl_us, 3)}
    # correctness against float64 (on the GPU; the errors in chunks)
    with torch.no_grad():
        out = new(*env.inputs)
        truth = env.truth()  # float64, computed once by the tuner's screen
        ref_abs, ref_rel = errors(env.ref, truth)
        out_abs, out_rel = errors(out, truth)
        scale = float(truth.abs().max())
    del out
    abs_bound, rel_bound = strict_bounds(env.ref.dtype, ref_abs, ref_rel, scale)
    ok = out_abs <= abs_bound and out_rel <= rel_bound
    strict["template"]["correct_strict"] = ok
    strict["template"]["errors_vs_fp64"] = {"template_max_abs": out_abs, "template_rel_l2": out_rel,
                                            "eager_max_abs": ref_abs, "eager_rel_l2": ref_rel}
    _say(f"  template {tmpl_us:.1f} us ({strict['template']['sol_fraction']:.0%} SOL), "
         f"{best_base / tmpl_us:.2f}x over the best baseline ({best_name}), correct under strict: {ok}, "
         f"params {tuned.params}")
    has_library_op = m.chain.head is not None
    if tf32 and has_library_op and time.monotonic() < deadline - 20:
        set_policy("tf32")
        t = entry["tf32"]
        e_us = timed(lambda: env.model(*env.inputs))
        t["eager"] = point(e_us, policy="tf32")  # GEMM/conv FLOPs bounded by the TF32 tensor-core rate
        torch._dynamo.reset()
        comp = torch.compile(env.model)
        with torch.no_grad():
            comp(*env.inputs)  # type: ignore[no-untyped-call]
        c_us = timed(lambda: comp(*env.inputs))  # type: ignore[no-untyped-call]
        t["compile"] = point(c_us, policy="tf32")
        new32 = env.build(m.render(tuned.params, "tf32"), "best_tf32")
        n_us = timed(lambda: new32(*env.inputs))
        t["template"] = {**point(n_us, min(e_us, c_us), "tf32"), "params": tuned.params,
                         "speedup_vs_best_baseline": round(min(e_us, c_us) / n_us, 3)}
        _say(f"  tf32: eager {e_us:.1f} us, compile {c_us:.1f} us, template {n_us:.1f} us "
             f"({min(e_us, c_us) / n_us:.2f}x)")
        set_policy("strict")
    elif not has_library_op:
        entry["tf32"] = {"note": "no convolution or GEMM: TF32 changes nothing, same as strict"}
    else:
        entry["tf32"] = {"note": "skipped: out of time"}
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    return entry


def _geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _speedup(x: float) -> str:
    """A speedup as the table shows it; below 1 it says so (the optimizer's guard keeps the baseline then)."""
    return f"{x:.2f}x" if x >= 1 else f"{x:.2f}x (slower than the baseline)"


#: The benchmark's targets (the template issue's "done when"), all under strict: the geomean of the outputs over
#: the best baseline, the speedup where compile is below LOW_SOL of speed of light, the median SOL of the outputs.
TARGET_GEOMEAN, TARGET_LOW_SOL_SPEEDUP, LOW_SOL, TARGET_MEDIAN_SOL = 1.3, 1.8, 0.6, 0.8


def targets(results: dict[str, Any]) -> dict[str, Any]:
    """The targets met or not, from the strict rows: each task's *output* is its template where that is correct
    and faster than the best baseline, else that baseline (the optimizer's guard keeps it: 1.00x, the baseline's
    SOL); a task without a template row counts as its baseline too when its baselines ran, and is listed."""
    outs: list[dict[str, Any]] = []
    missing: list[str] = []
    for e in results["tasks"]:
        s = e.get("strict", {})
        bases = {k: s[k] for k in ("eager", "compile", "compile-max-autotune") if "median_us" in s.get(k, {})}
        if not bases:
            missing.append(e["task"])
            continue
        best = min(bases.values(), key=lambda b: b["median_us"])
        t = s.get("template")
        wins = bool(t) and t.get("correct_strict") is True and t["speedup_vs_best_baseline"] > 1.0
        outs.append({"task": e["task"], "speedup": t["speedup_vs_best_baseline"] if wins else 1.0,
                     "sol": (t if wins else best)["sol_fraction"], "output": "template" if wins else "baseline",
                     "compile_sol": s.get("compile", {}).get("sol_fraction"),
                     "max_autotune": "compile-max-autotune" in bases})
    g = _geomean([o["speedup"] for o in outs])
    low = [o for o in outs if o["compile_sol"] is not None and o["compile_sol"] < LOW_SOL]
    median = statistics.median(o["sol"] for o in outs) if outs else None
    return {"outputs": outs, "missing": missing, "geomean": g, "geomean_met": g is not None and g >= TARGET_GEOMEAN,
            "low_sol": [{"task": o["task"], "speedup": o["speedup"], "met": o["speedup"] >= TARGET_LOW_SOL_SPEEDUP}
                        for o in low],
            "median_sol": median, "median_sol_met": median is not None and median >= TARGET_MEDIAN_SOL,
            "without_max_autotune": [o["task"] for o in outs if not o["max_autotune"]]}


def target_lines(t: dict[str, Any]) -> list[str]:
    """The targets as the results file says them: each with its figure and met / not met."""
    def met(ok: bool) -> str:
        return "met" if ok else "**not met**"

    lines = ["", "Targets (strict; each task's output is its template where correct and faster, else its best "
             "baseline at 1.00x):", ""]
    if t["geomean"] is not None:
        lines.append(f"- geomean of the outputs over the best baseline {t['geomean']:.3f}x, target "
                     f"{TARGET_GEOMEAN}x: {met(t['geomean_met'])}")
    lines += [f"- {x['task']} (compile below {LOW_SOL:.0%} of SOL): {x['speedup']:.2f}x, target "
              f"{TARGET_LOW_SOL_SPEEDUP}x: {met(x['met'])}" for x in t["low_sol"]]
    if t["median_sol"] is not None:
        lines.append(f"- median fraction of SOL of the outputs {t['median_sol']:.0%}, target {TARGET_MEDIAN_SOL:.0%}: "
                     f"{met(t['median_sol_met'])}")
    if t["without_max_autotune"]:
        lines.append(f"- max-autotune not among the baselines of {', '.join(t['without_max_autotune'])}: their "
                     "best baseline is eager's or compile's")
    if t["missing"]:
        lines.append(f"- no baseline measured, left out: {', '.join(t['missing'])}")
    return lines


def markdown(results: dict[str, Any]) -> str:
    lines = [f"# Templates on the gap tasks — {results['device']}, {results['date']}", "",
             f"torch {results['versions']['torch']}, Triton {results['versions']['triton']}, CUDA {results['versions']['cuda']}; "
             f"ceilings: copy {results['ceilings']['copy_bytes_per_s'] / 1e12:.2f} TB/s. Times: median us (L2 flushed per run).",
             "", "## strict (TF32 off)", "",
             "| task | template | eager us (SOL) | compile us (SOL) | max-autotune us (SOL) | template us (SOL) | "
             "speedup vs best | correct | schedule |",
             "|---|---|---|---|---|---|---|---|---|"]
    speed = []
    for e in results["tasks"]:
        s = e.get("strict", {})
        if "template" not in s:
            lines.append(f"| {e['task']} | — | | | | | | | {e.get('error', '')} |")
            continue
        t = s["template"]
        speed.append(t["speedup_vs_best_baseline"])
        ma = s.get("compile-max-autotune") or {"note": "not run (before this column)"}
        ma_cell = (f"{ma['median_us']:.0f} ({ma['sol_fraction']:.0%})" if "median_us" in ma else ma.get("note", ""))
        lines.append(f"| {e['task']} | {e['template']} | {s['eager']['median_us']:.0f} ({s['eager']['sol_fraction']:.0%}) | "
                     f"{s['compile']['median_us']:.0f} ({s['compile']['sol_fraction']:.0%}) | {ma_cell} | {t['median_us']:.0f} "
                     f"({t['sol_fraction']:.0%}) | {_speedup(t['speedup_vs_best_baseline'])} | {t['correct_strict']} | "
                     f"`{json.dumps(t['params'], sort_keys=True)}` |")
    g = _geomean(speed)
    lines += ["", f"Geomean speedup over the best baseline (eager, compile, max-autotune where it ran): {g:.3f}x"
              if g else ""]
    lines += target_lines(targets(results))
    several = [e for e in results["tasks"] if len(e.get("contenders", [])) > 1]
    if several:
        lines += ["", "Tasks several templates match, each tuned (its best schedule's median in the tuning; the "
                  "fastest is the row above):", ""]
        lines += [f"- {e['task']}: " + ", ".join(f"{c['template']} {c['median_us']:.0f} us ({c['tried']} schedules)"
                                                if "median_us" in c else f"{c['template']} failed: {c['error'][:120]}"
                                                for c in e["contenders"]) for e in several]
    lines += ["",
              "## tf32 (labelled: TF32 allowed in cuBLAS/cuDNN; not admitted under strict)", "",
              "| task | eager us | compile us | template us | speedup vs best |", "|---|---|---|---|---|"]
    for e in results["tasks"]:
        t = e.get("tf32", {})
        if "template" in t:
            lines.append(f"| {e['task']} | {t['eager']['median_us']:.0f} | {t['compile']['median_us']:.0f} | "
                         f"{t['template']['median_us']:.0f} | {_speedup(t['template']['speedup_vs_best_baseline'])} |")
        else:
            lines.append(f"| {e['task']} | | | | {t.get('note', e.get('error', ''))} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="", help="comma-separated task number prefixes (default: all gap tasks)")
    p.add_argument("--paths", default="", help="comma-separated task files to run instead of the gap tasks")
    p.add_argument("--prefer", default="", help="comma-separated template names: tune only the first that matches "
                   "(default: every template that matches, the fastest kept)")
    p.add_argument("--tune-s", type=float, default=35.0, help="autotuning budget per task (its templates share it), seconds")
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--total-s", type=float, default=300.0, help="stop starting new work after this many seconds")
    p.add_argument("--no-tf32", action="store_true")
    p.add_argument("--no-max-autotune", action="store_true", help="leave the compile-max-autotune baseline out")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--suffix", default="", help="appended to the results' file names (a second run on one date)")
    ns = p.parse_args(argv)

    import torch
    import triton

    from kstrata.agents.roofline import load_or_measure
    from kstrata.agents.templates.tune import set_policy

    if not torch.cuda.is_available():
        print("bench_templates: needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.monotonic()
    deadline = start + ns.total_s
    set_policy("strict")
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    results_dir = Path(ns.results)
    ceilings, cpath = load_or_measure(out_dir or results_dir)
    _say(f"ceilings ({cpath.name}): copy {ceilings.copy_bytes_per_s / 1e12:.2f} TB/s, fp32 "
         f"{ceilings.matmul_flops_per_s['float32'] / 1e12:.1f} TFLOP/s")
    wanted = [t for t in ns.tasks.split(",") if t]
    paths = [q for q in sorted(GAPS.glob("[0-9]*.py")) if not wanted or any(q.name.startswith(w) for w in wanted)]
    if ns.paths:
        paths = [Path(q) for q in ns.paths.split(",") if q]
        missing = [q for q in paths if not q.is_file()]
        if missing:
            print(f"bench_templates: no task file {missing[0]}", file=sys.stderr)
            return 2
    prefer = [t for t in ns.prefer.split(",") if t]
    results: dict[str, Any] = {
        "schema": "kstrata.templates-bench/1", "device": torch.cuda.get_device_name(), "date": dt.date.today().isoformat(),
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "cuda": str(torch.version.cuda)},
        "ceilings": ceilings.to_json(), "tune_s": ns.tune_s, "runs": ns.runs, "tasks": []}
    for i, path in enumerate(paths):
        remaining = len(paths) - i
        task_deadline = time.monotonic() + (deadline - time.monotonic()) / remaining
        _say(f"[{i + 1}/{len(paths)}] {path.stem}")
        if time.monotonic() > deadline:
            results["tasks"].append({"task": path.stem, "error": "skipped: out of time"})
            continue
        try:
            results["tasks"].append(bench_task(path, ceilings, tune_s=min(ns.tune_s, task_deadline - time.monotonic() - 20),
                                               runs=ns.runs, tf32=not ns.no_tf32, cache_dir=out_dir or results_dir,
                                               deadline=task_deadline, prefer=prefer,
                                               max_autotune=not ns.no_max_autotune))
        except Exception as e:  # one task's failure is a row of the report, not the end of the run
            results["tasks"].append({"task": path.stem, "error": f"{type(e).__name__}: {str(e)[:400]}"})
            _say(f"  failed: {type(e).__name__}: {str(e)[:400]}")
            torch.cuda.empty_cache()
    results["seconds"] = round(time.monotonic() - start, 1)
    results["targets"] = targets(results)
    md = markdown(results)
    stem = f"templates-bench-{results['date']}{ns.suffix}"
    for d in [results_dir, *([out_dir] if out_dir else [])]:
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
        (d / f"{stem}.md").write_text(md)
    print(md)
    _say(f"total {results['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
