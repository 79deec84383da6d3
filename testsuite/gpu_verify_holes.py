"""Issue 20 on an NVIDIA GPU, in one run: the verification holes closed, and evaluation at KernelBench's sizes.

    python -m kstrata.testsuite.gpu_verify_holes [--results DIR] [--steps mutants,planted,eval,bench] [--work DIR]
        [--eval-tasks 19,23] [--bench-tasks 19,23,gaps]

Steps (all by default; about 7 minutes on an H200):

- `mutants`: the issue's two PTX mutants — `setp.lt.s32` -> `setp.le.s32` in the row-wise `row_scale`
  (every program writes one element past its row; the next row's program overwrites it, the last one
  lands past the end) and `sub.f32` -> `add.f32` in `softmax_onepass` — each given to `kstrata verify
  --device cuda` as a cache entry whose cubin is still Triton's (stale) and as a single `.ptx` file; and a
  correct rewrite (`ptx(cache-hints)`) both ways. Expected: the mutants `different`, the rewrite `equivalent`.
- `planted`: the planted cases issue 20 added (stale lower levels, one-past-the-end write, read past the
  end, i32 offset overflow on a launch past 2^31 elements) and every correct NVIDIA rewrite, through the
  planted harness (`kstrata.testsuite.planted.run --device cuda`): each wrong one rejected, with the check
  that caught it; each correct one accepted.
- `eval`: `kstrata eval` of level1/19 (ReLU) and level1/23 (Softmax) at the published size 4096x393216
  fp32 (`testsuite/tasks_published/`), with the memory plan and the peak host and GPU memory of each process.
- `bench`: `kstrata bench` (eager, torch.compile) of the published-size tasks and of the two conv tasks
  issue 20 names (`testsuite/tasks/gaps/04_conv_add_scale_sigmoid_groupnorm_fp32`, `05_conv_relu_hardswish_fp32`),
  every baseline judged against float64 with the bound scaled by eager's own error.

It prints a short table and writes `verify-holes-gpu-<date>.json` and `.md` under `--results` (default
`testsuite/results`) and under `$OUT` when that is set. Exit status 0 when every row is as expected.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # the repository root (the kstrata package)
PUBLISHED = ROOT / "testsuite" / "tasks_published"
STEPS = ("mutants", "planted", "eval", "bench")
NEW_PLANTED = ("ptx-stale-cubin", "llir-stale-lower-levels", "ptx-one-past-end-write", "ttir-one-past-end-write",
               "ptx-read-past-end", "ptx-i32-offset-overflow")
#: (name, suite kernel, PTX anchor, replacement)
MUTANTS = (("widened-predicate", "row_scale", "\tsetp.lt.s32 \t%p1, %r4, %r2;", "\tsetp.le.s32 \t%p1, %r4, %r2;"),
           ("sub-to-add", "softmax_onepass", "\tsub.f32 \t%r47, %r1, %r46;", "\tadd.f32 \t%r47, %r1, %r46;"))


def _cli(*args: str, timeout: float = 600, live: bool = False) -> tuple[int, dict[str, Any] | None, str]:
    """Run the CLI; `live`: its stderr (progress) goes straight to ours, so it survives a kill of this run."""
    proc = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", *args], stdout=subprocess.PIPE,
                          stderr=None if live else subprocess.PIPE, text=True, timeout=timeout, check=False, cwd=ROOT)
    if live:
        proc.stderr = ""
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        data = None
    return proc.returncode, data, proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""


def _caught_by(report: dict[str, Any] | None) -> str:
    if not report:
        return ""
    failed = [c for c in report.get("checks", []) if c["verdict"] == "fail"]
    return "; ".join(f"{c['name']}@{c['level']}: {c['detail'][:140]}" for c in failed[:2])


def step_mutants(work: Path) -> list[dict[str, Any]]:
    from kstrata.ir.target import Target
    from kstrata.passes.pipeline import parse_pipeline, run_pipeline
    from kstrata.testsuite.kernels import get_kernel
    from kstrata.testsuite.kernels.build import build_suite
    from kstrata.testsuite.kernels.launch import suite_launch_record

    cache = work / "cache"
    built = build_suite(Target.parse("cuda:90"), cache, [get_kernel(k) for k in ("row_scale", "softmax_onepass")])
    # The suite's own launches, given explicitly (verify would find them itself where the kstrata.suites
    # entry point is installed; this way the run does not depend on the install)
    records = {k: suite_launch_record(get_kernel(k), "cuda:90").save(work / "launches" / f"{k}.json")
               for k in ("row_scale", "softmax_onepass")}
    jobs: list[tuple[str, str, Path, Path, Path]] = []  # (name, expected verdict, original, candidate, launch)
    for name, kernel, anchor, replacement in MUTANTS:
        entry = Path(built.bundles[kernel].origin or "")
        ptx_file = next(entry.glob("*.ptx"))
        text = ptx_file.read_text()
        if text.count(anchor) != 1:
            raise RuntimeError(f"mutant {name}: anchor {anchor!r} found {text.count(anchor)} times in {ptx_file}")
        stale = work / f"{name}-entry"
        shutil.rmtree(stale, ignore_errors=True)
        shutil.copytree(entry, stale)
        (stale / ptx_file.name).write_text(text.replace(anchor, replacement))  # the cubin stays Triton's
        single = work / f"{name}-file" / ptx_file.name
        single.parent.mkdir(parents=True, exist_ok=True)
        single.write_text(text.replace(anchor, replacement))
        jobs += [(f"{name} (entry, stale cubin)", "different", entry, stale, records[kernel]),
                 (f"{name} (single .ptx)", "different", entry, single, records[kernel])]
    entry = Path(built.bundles["row_scale"].origin or "")
    from kstrata.ir.triton_layout import load_any

    hinted = run_pipeline(load_any(entry)[0][0], parse_pipeline("ptx(cache-hints)")).bundle
    good = work / "cache-hints-file" / next(entry.glob("*.ptx")).name
    good.parent.mkdir(parents=True, exist_ok=True)
    good.write_text(hinted.text("ptx"))
    jobs.append(("correct: ptx(cache-hints) (single .ptx)", "equivalent", entry, good, records["row_scale"]))

    def run(job: tuple[str, str, Path, Path, Path]) -> dict[str, Any]:
        name, expected, original, candidate, launch = job
        start = time.monotonic()
        rc, report, last = _cli("verify", str(original), str(candidate), "--launch", str(launch), "--device", "cuda",
                                "--json")
        verdict = (report or {}).get("verdict", f"error (exit {rc}: {last})")
        return {"step": "mutants", "case": name, "expected": expected, "verdict": verdict, "ok": verdict == expected,
                "caught_by": _caught_by(report), "rebuilt": (report or {}).get("rebuilt_levels"),
                "notes": (report or {}).get("notes"), "seconds": round(time.monotonic() - start, 1)}

    with ThreadPoolExecutor(max_workers=3) as pool:
        return list(pool.map(run, jobs))


def step_planted(work: Path) -> list[dict[str, Any]]:
    from kstrata.testsuite.planted import CASES

    correct = [c.name for c in CASES if c.correct and c.target.startswith("cuda")]
    proc = subprocess.run([sys.executable, "-m", "kstrata.testsuite.planted.run", "--device", "cuda", "--jobs", "4",
                           "--json", "--only", *NEW_PLANTED, *correct], capture_output=True, text=True,
                          timeout=1200, check=False, cwd=ROOT)
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return [{"step": "planted", "case": "harness", "expected": "run", "verdict": f"exit {proc.returncode}",
                 "ok": False, "caught_by": proc.stderr[-300:], "seconds": 0}]
    rows = []
    for c in data["cases"]:
        failed = [x for x in c["checks"] if x["verdict"] == "fail"]
        rows.append({"step": "planted", "case": c["name"], "expected": c["expected"], "verdict": c["verdict"],
                     "ok": c["verdict"] == c["expected"], "seconds": c["seconds"],
                     "caught_by": "; ".join(f"{x['name']}@{x['level']}: {x['detail'][:140]}" for x in failed[:2])
                     or (c.get("error") or "")[:200]})
    return rows


EVAL_TASKS = {"19": ("level1/19_ReLU.py", "correct_relu_triton_int64.py"),
              "23": ("level1/23_Softmax.py", "correct_softmax_torch.py")}


def step_eval(work: Path, only: list[str] | None = None) -> list[dict[str, Any]]:
    rows = []
    for key, (task, cand) in EVAL_TASKS.items():
        if only and key not in only:
            continue
        start = time.monotonic()
        print(f"-- eval {task} (progress below)", file=sys.stderr, flush=True)
        rc, v, last = _cli("eval", str(PUBLISHED / task), str(ROOT / "testsuite" / "adversarial" / cand), "--json",
                           "--trials", "5", "--runs", "20", timeout=900, live=True)
        mem = (v or {}).get("memory", {})
        peaks = {role: mem.get(role) for role in ("reference", "candidate", "evaluator")}
        plan = mem.get("plan") or {}
        rows.append({"step": "eval", "case": task, "expected": "accepted",
                     "verdict": ("accepted" if v["accepted"] else f"rejected: {v['reason'][:200]}") if v
                     else f"error (exit {rc}: {last})", "ok": bool(v and v["accepted"]),
                     "caught_by": "", "plan": plan.get("mode"), "memory": peaks,
                     "speedup": (v or {}).get("speedup"), "precision": (v or {}).get("precision"),
                     "seconds": round(time.monotonic() - start, 1)})
    return rows


#: The bench step's parts: each published-size task alone (every baseline is a five-trial evaluation,
#: about 3.5 minutes each at that size on the H200, so one task's eager and compile fill a 600 s call),
#: and the two conv tasks torch.compile was called incorrect on (testsuite/tasks/gaps).
BENCH_TASKS = {"19": (PUBLISHED, ["--only", "19_ReLU"]), "23": (PUBLISHED, ["--only", "23_Softmax"]),
               "gaps": (ROOT / "testsuite" / "tasks" / "gaps",
                        ["--only", "04_conv_add_scale", "--only", "05_conv_relu_hardswish"])}


def step_bench(work: Path, only: list[str] | None = None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for key, (suite, filters) in BENCH_TASKS.items():
        if only and key not in only:
            continue
        rows += _bench(work / f"bench-{key}", suite, filters)
    return rows


def _bench(out: Path, suite: Path, only: list[str]) -> list[dict[str, Any]]:
    shutil.rmtree(out, ignore_errors=True)
    start = time.monotonic()
    rc, data, last = _cli("bench", str(suite), "--out", str(out), "--runs", "20", "--json", *only, timeout=1500)
    if data is None:
        return [{"step": "bench", "case": f"bench {suite.name}", "expected": "correct",
                 "verdict": f"error (exit {rc}: {last})", "ok": False, "caught_by": "",
                 "seconds": round(time.monotonic() - start, 1)}]
    rows = []
    for task, entry in data["tasks"].items():
        for b, r in entry["baselines"].items():
            rows.append({"step": "bench", "case": f"{Path(task).parent.name}/{Path(task).stem} {b}",
                         "expected": "correct", "verdict": "correct" if r.get("correct") else
                         ("INCORRECT" if r.get("ok") else f"failed: {r.get('error', '')[:160]}"),
                         "ok": bool(r.get("ok") and r.get("correct")), "memory": r.get("memory"),
                         "caught_by": "; ".join(f"{e['output']}: rel {e['rel_l2_vs_fp64']} vs eager's "
                                                f"{e['eager_rel_l2_vs_fp64']} (bound {e['bound_rel_l2']})"
                                                for e in r.get("errors", [])[:1]),
                         "kernelbench_vs_eager": r.get("kernelbench_vs_eager"), "precision": r.get("precision"),
                         "seconds": None})
    return rows


def _environment() -> dict[str, Any]:
    import torch
    import triton

    env = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
           "python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
           "compute_sanitizer": shutil.which("compute-sanitizer")}
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                          check=False).stdout.strip()
    env["kstrata_commit"] = head or None
    return env


def _gib(m: Any) -> str:
    if not isinstance(m, dict):
        return ""
    parts = [f"host {m['peak_host_bytes'] / 2**30:.1f}" if "peak_host_bytes" in m else "",
             f"GPU {m['peak_gpu_bytes'] / 2**30:.1f}" if "peak_gpu_bytes" in m else ""]
    return "/".join(p for p in parts if p) + " GiB"


def render(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    lines = [f"# Issue 20 on {env['device']}", "",
             f"{env['date']} · torch {env['torch']} · triton {env['triton']} · CUDA {env['cuda']} · "
             f"kstrata {env['kstrata_commit']} · compute-sanitizer {env['compute_sanitizer'] or 'not found'}", "",
             "| step | case | expected | verdict | ok | caught by / detail | memory | s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mem = r.get("memory")
        memtext = "; ".join(f"{k} {_gib(v)}" for k, v in mem.items() if v) if isinstance(mem, dict) and \
            any(isinstance(v, dict) for v in mem.values()) else _gib(mem)
        detail = str(r.get("caught_by") or "").replace("|", "/")
        if r.get("plan"):
            detail = f"plan {r['plan']}" + (f"; speedup {r['speedup']:.2f}" if r.get("speedup") else "") + \
                (f"; {detail}" if detail else "")
        lines.append(f"| {r['step']} | {r['case']} | {r['expected']} | {r['verdict']} | {'yes' if r['ok'] else 'NO'} | "
                     f"{detail} | {memtext} | {r.get('seconds') if r.get('seconds') is not None else ''} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=ROOT / "testsuite" / "results")
    parser.add_argument("--work", type=Path, default=Path("/tmp/kstrata-verify-holes"))
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated: {', '.join(STEPS)}")
    parser.add_argument("--eval-tasks", default=",".join(EVAL_TASKS),
                        help="the published-size tasks of the eval step, comma-separated (19: ReLU, 23: Softmax); "
                             "one per call fits a 600 s limit more surely")
    parser.add_argument("--bench-tasks", default=",".join(BENCH_TASKS),
                        help="the parts of the bench step, comma-separated (19, 23: one published-size task; "
                             "gaps: the two conv tasks); one per call")
    ns = parser.parse_args(argv)
    bench_only = [t for t in ns.bench_tasks.split(",") if t]
    if set(bench_only) - set(BENCH_TASKS):
        print(f"error: --bench-tasks: {', '.join(sorted(set(bench_only) - set(BENCH_TASKS)))} unknown "
              f"({', '.join(BENCH_TASKS)})", file=sys.stderr)
        return 2
    eval_only = [t for t in ns.eval_tasks.split(",") if t]
    if set(eval_only) - set(EVAL_TASKS):
        print(f"error: --eval-tasks: {', '.join(sorted(set(eval_only) - set(EVAL_TASKS)))} unknown "
              f"({', '.join(EVAL_TASKS)})", file=sys.stderr)
        return 2
    steps = [s for s in ns.steps.split(",") if s]
    unknown = set(steps) - set(STEPS)
    if unknown:
        print(f"error: unknown steps {', '.join(sorted(unknown))} ({', '.join(STEPS)})", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("error: needs an NVIDIA GPU (torch sees none)", file=sys.stderr)
        return 2
    ns.work.mkdir(parents=True, exist_ok=True)
    env = _environment()
    rows: list[dict[str, Any]] = []
    fns = {"mutants": step_mutants, "planted": step_planted, "eval": lambda w: step_eval(w, eval_only),
           "bench": lambda w: step_bench(w, bench_only)}
    for step in steps:
        start = time.monotonic()
        try:
            new = fns[step](ns.work)
        except Exception as exc:  # one step's failure is a row; the others still run
            new = [{"step": step, "case": "(step)", "expected": "run", "verdict": f"{type(exc).__name__}: {exc}"[:300],
                    "ok": False, "caught_by": ""}]
        rows += new
        print(f"== {step}: {sum(r['ok'] for r in new)}/{len(new)} as expected in {time.monotonic() - start:.0f} s",
              flush=True)
        for r in new:
            print(f"  {'ok  ' if r['ok'] else 'MISS'} {r['case'][:52]:52s} {str(r['verdict'])[:40]:40s} "
                  f"{str(r.get('caught_by') or '')[:90]}", flush=True)
    md = render(rows, env)
    # a run of some steps only does not overwrite the day's full run
    stem = f"verify-holes-gpu-{env['date'][:10]}" + ("" if steps == list(STEPS) else "-" + "-".join(steps))
    if "eval" in steps and eval_only and sorted(eval_only) != sorted(EVAL_TASKS):
        stem += "-" + "-".join(sorted(eval_only))  # one published-size task per call: one file each
    if "bench" in steps and bench_only and sorted(bench_only) != sorted(BENCH_TASKS):
        stem += ("" if steps == ["bench"] else "-bench") + "-" + "-".join(sorted(bench_only))
    targets = [ns.results] + ([Path(os.environ["OUT"])] if os.environ.get("OUT") else [])
    for d in targets:
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{stem}.json").write_text(json.dumps({"schema": "kstrata.verify-holes/1", "environment": env,
                                                    "rows": rows}, indent=1, default=str) + "\n")
        (d / f"{stem}.md").write_text(md)
        print(f"results: {d / stem}.json, .md")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
