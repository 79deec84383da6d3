"""Benchmark `kstrata optimize` on the project's tasks within a stated wall-clock budget.

    python -m kstrata.tools.bench_optimize [--suite testsuite/tasks] [--tasks a,b,...] [--total-minutes 9]
        [--parallel-tasks 4] [--workers 2] [--budget 6] [--device cuda|cpu] [--out DIR] [--precision strict]

Runs `kstrata optimize` (one process: one timing queue for all tasks; `--parallel-tasks` tasks at once so
their compiles use the cores) on the selected tasks, with each task's search limited to its share of the
budget, and kills it when the total budget is spent (a killed task is reported as unfinished; the
optimizer's trajectories stay resumable). Then it prints and writes, per task: the incumbent baseline, the
chosen space and edit, the speedup over the best baseline (interleaved medians) and over eager (the final
fresh evaluation), %SOL before/after, the search time, which findings fired, and whether the final
re-evaluation accepted the output. Results: `testsuite/results/optimize-<device>-<date>.{md,json}` (and
under `$OUT` when set).

The default task list: the gap tasks of `testsuite/tasks/gaps/` when that folder exists (issue 19's tasks,
the ones the Triton templates target: the `triton` space, through the templates proposer that `optimize`
loads when `kstrata.agents.templates` is present), plus `DEFAULT_TASKS`: tasks where the 2026-11-30 H200
bench (`testsuite/results/bench-2026-11-30-run2`) left headroom that the library/compiler/graph spaces can
reach (a GEMM + bias + ReLU for the cuBLASLt epilogue, a norm, a conv3d + GroupNorm + mean that the probe
flags degenerate). The causal SDPA task is left out: its FLOP count covers the full score matrix, so eager
already measures above 100% of "SOL" and every faster candidate would be flagged.

Budgets (defaults, `--total-minutes 9`): all tasks run at once (`--parallel-tasks` defaults to the number of
tasks: one wave, one GPU timing queue), each with a time limit of `PER_TASK_SHARE` (65%) of the total per
wave, 5.85 minutes at 9; the optimizer starts each task's search by half of that at the latest (2.9 min:
profiling that would run later is skipped), and the remaining 35% (3.15 min) covers in-flight candidates,
the fresh final re-evaluation and the reports. Baselines eager and compile only (max-autotune's autotuning
alone can take a minute a task). The whole command then takes at most `--total-minutes` plus a few seconds
of reporting: optimize is killed at the total budget, and a killed task is reported as unfinished.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TASKS = (
    "level1/07_conv2d_7x7_stride2_fp16",  # 7.6% SOL: cuDNN algorithm / layout
    "level1/08_depthwise_conv2d_fp32",  # 20% SOL
    "level1/22_groupnorm_fp16",  # 17.5% SOL, small kernels
    "level2/01_gemm_bias_relu_fp16",  # addmm + ReLU epilogue
    "level2/04_conv_gelu_maxpool_fp16",  # 12% SOL: conv layout + fusion
    "level2/10_conv3d_groupnorm_mean_fp32",  # 22% SOL, launch-bound
    "level1/02_rect_gemm_fp16",  # control: at 98% SOL, the planner should stop
)
#: The default list when the gap tasks exist: they plus these (the whole list fits one wave in 9 minutes).
DEFAULT_WITH_GAPS = (
    "level1/22_groupnorm_fp16",
    "level2/01_gemm_bias_relu_fp16",
    "level2/10_conv3d_groupnorm_mean_fp32",
)
#: Each task's time limit, as a share of the total budget per wave of parallel tasks.
PER_TASK_SHARE = 0.65


def default_tasks(suite: Path) -> list[str]:
    """The gap tasks (when `suite/gaps` holds any) plus `DEFAULT_WITH_GAPS`; `DEFAULT_TASKS` otherwise."""
    gaps = sorted(p for p in (suite / "gaps").glob("[0-9]*.py")) if (suite / "gaps").is_dir() else []
    if not gaps:
        return list(DEFAULT_TASKS)
    return [f"gaps/{p.stem}" for p in gaps] + list(DEFAULT_WITH_GAPS)


def per_task_minutes(total_minutes: float, n_tasks: int, parallel_tasks: int) -> float:
    """Each task's time limit (`optimize --minutes`): `PER_TASK_SHARE` of the total per wave, at least 0.5."""
    waves = -(-n_tasks // max(1, parallel_tasks))
    return max(0.5, total_minutes * PER_TASK_SHARE / max(1, waves))


def _task_paths(suite: Path, names: list[str]) -> list[Path]:
    out = []
    for n in names:
        p = suite / (n if n.endswith(".py") else n + ".py")
        if not p.is_file():
            raise SystemExit(f"error: no task {p}")
        out.append(p)
    return out


def _versions() -> dict[str, str]:
    import platform

    import torch

    v = {"python": platform.python_version(), "torch": torch.__version__, "cuda": str(torch.version.cuda)}
    try:
        import triton

        v["triton"] = triton.__version__
    except Exception:
        pass
    return v


def _fmt(x: Any, spec: str = ".3f", scale: float = 1.0) -> str:
    return "—" if x is None else format(x * scale, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kstrata.tools.bench_optimize", description=__doc__.splitlines()[0])
    ap.add_argument("--suite", type=Path, default=REPO / "testsuite" / "tasks")
    ap.add_argument("--tasks", default="", help="comma-separated task names under --suite ('all': every task; "
                    "default: the gap tasks plus a few others, see the docstring)")
    ap.add_argument("--total-minutes", type=float, default=9.0, help="wall-clock budget of the whole benchmark")
    ap.add_argument("--parallel-tasks", type=int, default=0, help="tasks at once (default: all of them)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--budget", type=int, default=6, help="candidates per task beyond the baselines")
    ap.add_argument("--baselines", default="eager,compile", help="max-autotune alone can take a minute per task")
    ap.add_argument("--precision", default="strict")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=None, help="optimize's output directory (default: a temp dir)")
    ap.add_argument("--results", type=Path, default=REPO / "testsuite" / "results")
    ap.add_argument("--ceilings-dir", type=Path, default=REPO / "testsuite" / "results" / "bench-2026-11-30-run2")
    ap.add_argument("--extra", default="", help="more arguments for kstrata optimize (e.g. '--no-ncu')")
    a = ap.parse_args(argv)

    from kstrata.agents.tasks import find_tasks

    names = default_tasks(a.suite) if not a.tasks else [t for t in a.tasks.split(",") if t]
    paths = find_tasks(a.suite) if a.tasks == "all" else _task_paths(a.suite, names)
    if a.parallel_tasks <= 0:
        a.parallel_tasks = max(1, len(paths))
    stage = Path(a.out) if a.out else Path(os.environ.get("TMPDIR", "/tmp")) / f"kstrata-bench-optimize-{os.getpid()}"
    tasks_dir = stage / "tasks"
    if tasks_dir.exists():
        shutil.rmtree(tasks_dir)
    for p in paths:  # one flat directory: optimize names outputs after the files
        rel = p.relative_to(a.suite) if p.is_relative_to(a.suite) else Path(p.name)
        dst = tasks_dir / str(rel).replace("/", "__")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, dst)
    out = stage / "optimize"
    # Each task's limit (baselines, profile, search) is its share of the budget; the final evaluation needs the rest.
    per_task = per_task_minutes(a.total_minutes, len(paths), a.parallel_tasks)
    cmd = [sys.executable, "-m", "kstrata.tools.cli", "optimize", str(tasks_dir), "--out", str(out), "--device", a.device,
           "--budget", str(a.budget), "--minutes", f"{per_task:.2f}", "--workers", str(a.workers), "--parallel-tasks",
           str(a.parallel_tasks), "--precision", a.precision, "--baselines", a.baselines, "--ceilings-dir",
           str(a.ceilings_dir), "--json", *([] if not out.exists() else ["--resume"]), *a.extra.split()]
    print(f"{len(paths)} tasks, {a.parallel_tasks} at a time, a {per_task:.2f}-minute limit each, total budget "
          f"{a.total_minutes:g} min (the search starts by half of each task's limit)", flush=True)
    print("$ " + " ".join(cmd), flush=True)
    start = time.monotonic()
    log = stage / "optimize-log.txt"
    stage.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=fh, text=True, start_new_session=True)
        killed = False
        try:
            stdout, _ = proc.communicate(timeout=a.total_minutes * 60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, _ = proc.communicate()
            killed = True
    wall = time.monotonic() - start
    (stage / "optimize.json").write_text(stdout or "")
    rows = []
    for p in paths:
        rel = p.relative_to(a.suite) if p.is_relative_to(a.suite) else Path(p.name)
        name = str(rel.with_suffix("")).replace("/", "__")
        res = out / name / "result.json"
        if res.exists():
            r = json.loads(res.read_text())
            r["name"] = str(rel.with_suffix(""))
        else:
            r = {"name": str(rel.with_suffix("")), "status": "unfinished", "error": "not finished within the budget"
                 if killed else "no result (see the log)"}
        rows.append(r)
    date = _dt.date.today().isoformat()
    meta = {"date": date, "device": a.device, "versions": _versions(), "wall_s": round(wall, 1), "killed": killed,
            "command": cmd, "total_minutes": a.total_minutes, "per_task_search_minutes": per_task}
    try:
        import torch

        if a.device == "cuda" and torch.cuda.is_available():
            meta["gpu"] = torch.cuda.get_device_name()
    except Exception:
        pass
    head = ["| task | status | incumbent baseline | chosen space | chosen | speedup vs best baseline | vs eager (final) | "
            "%SOL before | %SOL after | search s | findings | final |",
            "|---|---|---|---|---|---:|---:|---:|---:|---:|---|---|"]
    body = []
    for r in rows:
        if r.get("status") != "done":
            body.append(f"| {r['name']} | {r.get('status')} | | | | | | | | | | {r.get('error', '')[:80]} |")
            continue
        body.append(f"| {r['name']}{' (degenerate)' if r.get('degenerate') else ''} | done | {r['incumbent_baseline']} | "
                    f"{r['chosen_space']} | {r['chosen'][:60].replace('|', '/')} | {_fmt(r.get('speedup'))} | "
                    f"{_fmt(r.get('speedup_vs_eager'))} | {_fmt(r.get('sol_before'), '.1f', 100)} | "
                    f"{_fmt(r.get('sol_after'), '.1f', 100)} | {r.get('seconds', 0):.0f} | {', '.join(r.get('findings', []))} | "
                    f"{'ok' if r.get('final_ok') else r.get('final_reason', '')[:50]} |")
    won = [r for r in rows if r.get("status") == "done" and (r.get("speedup") or 0) > 1.0 and r["chosen_space"] != "baseline"]
    from kstrata.agents.optimize.report import geomean

    g = geomean([r["speedup"] for r in rows if r.get("status") == "done" and r.get("speedup") and not r.get("degenerate")])
    md = [f"# kstrata optimize benchmark ({a.device}, {date})", "",
          f"Device: {meta.get('gpu', a.device)}; versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) +
          f". Wall time {wall:.0f} s of a {a.total_minutes:g}-minute budget" + (" (killed at the budget)" if killed else "") +
          f"; {len(paths)} tasks, {a.parallel_tasks} at a time, a {per_task:.2f}-minute limit each, budget {a.budget} "
          f"candidates, {a.workers} workers per task, policy {a.precision}, baselines {a.baselines}.", "",
          f"Geomean speedup over the best baseline (non-degenerate, finished): {_fmt(g)}; made faster: "
          f"{len(won)} of {len(rows)} ({', '.join(r['name'] for r in won) or 'none'}).", "",
          "Speedups are interleaved medians against the best baseline measured in the same process; other tasks' "
          "correctness checks may share the GPU meanwhile (the guard's noise threshold covers the spread it causes). "
          "`vs eager (final)` is the fresh re-evaluation's timing (fresh processes, fresh seeds).", "",
          *head, *body, "", f"Command: `{' '.join(cmd)}`", ""]
    text = "\n".join(md)
    print(text)
    targets = [a.results] + ([Path(os.environ["OUT"])] if os.environ.get("OUT") else [])
    for d in targets:
        d.mkdir(parents=True, exist_ok=True)
        stem = f"optimize-{a.device}-{date}"
        (d / f"{stem}.md").write_text(text)
        (d / f"{stem}.json").write_text(json.dumps({"meta": meta, "tasks": rows}, indent=1, default=str) + "\n")
        print(f"wrote {d / stem}.md/.json")
    if os.environ.get("OUT"):  # the per-task reports travel back too
        dst = Path(os.environ["OUT"]) / "optimize-out"
        shutil.copytree(out, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".work", "candidates"))
        shutil.copy2(log, Path(os.environ["OUT"]) / "optimize-log.txt")
    return 0 if rows and all(r.get("status") == "done" and r.get("final_ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
