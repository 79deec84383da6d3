"""Benchmark `kstrata optimize` on the project's tasks within a stated wall-clock budget.

    python -m kstrata.tools.bench_optimize [--suite testsuite/tasks] [--tasks a,b,...] [--total-minutes 9]
        [--parallel-tasks N] [--workers 2] [--budget 6] [--device cuda|cpu] [--out DIR] [--precision strict]
        [--tag NAME]

Runs `kstrata optimize` (one process) on the selected tasks, each with its share of the total budget as
`optimize --minutes` (which covers the task's baselines, search, final re-evaluation and report: the
optimizer cuts its search short to keep that promise), and kills it only past the total budget (a killed
task is reported as unfinished with its provisional incumbent; the optimizer's trajectories stay
resumable). Then it prints and writes, per task: the incumbent baseline, the
chosen space and edit, the speedup over the best baseline (interleaved medians) and over eager (the final
fresh evaluation), %SOL before/after, the search time, which findings fired, and whether the final
re-evaluation accepted the output. Results: `testsuite/results/optimize-<device>-<date>[-<tag>].{md,json}`
(and under `$OUT` when set).

The default task list: the gap tasks of `testsuite/tasks/gaps/` when that folder exists (issue 19's tasks,
the ones the Triton templates target: the `triton` space, through the templates proposer that `optimize`
loads when `kstrata.agents.templates` is present), plus `DEFAULT_TASKS`: tasks where the 2026-11-30 H200
bench (`testsuite/results/bench-2026-11-30-run2`) left headroom that the library/compiler/graph spaces can
reach (a GEMM + bias + ReLU for the cuBLASLt epilogue, a norm, a conv3d + GroupNorm + mean that the probe
flags degenerate). The causal SDPA task is left out: its FLOP count covers the full score matrix, so eager
already measures above 100% of "SOL" and every faster candidate would be flagged.

Budgets: one task at a time per GPU (`--parallel-tasks` defaults to the number of visible GPUs, and with
more than one, `optimize --gpus all` pins one task per GPU). Tasks sharing one GPU time each other's
kernels: on the H200 (2026-12-01) torch.compile of a norm measured 384 us with nine tasks on the GPU
against 114 us alone, so the timings of a crowded run are wrong, not just noisy. The tasks then run in
waves of `--parallel-tasks`; each task gets `(total - STARTUP_S) / waves` less `SAFETY_SHARE` as its
`--minutes` (`per_task_minutes`), so every wave ends before the bench's kill at the total. Baselines eager
and compile only by default (max-autotune's autotuning alone can take a minute a task). The markdown says
how many tasks ran at once.
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
#: Seconds of the total budget for optimize's start (imports, CUDA, ceilings, loading every task) and the end
#: (summary.md): not given to any task.
STARTUP_S = 30.0
#: Share of each task's slot kept back from its `--minutes`: the optimizer's own estimate of its final
#: re-evaluation can be short by this much before the bench's kill at the total budget.
SAFETY_SHARE = 0.05


def findings_cell(kinds: list[str]) -> str:
    """The findings that fired, each once, in the order they first fired, with a count where one fired for
    several kernels ("narrow-loads x19"): a batch-1 MLP's table cell listed narrow-loads 19 times."""
    counts: dict[str, int] = {}
    for k in kinds:
        counts[k] = counts.get(k, 0) + 1
    return ", ".join(k if n == 1 else f"{k} x{n}" for k, n in counts.items())


def default_tasks(suite: Path) -> list[str]:
    """The gap tasks (when `suite/gaps` holds any) plus `DEFAULT_WITH_GAPS`; `DEFAULT_TASKS` otherwise."""
    gaps = sorted(p for p in (suite / "gaps").glob("[0-9]*.py")) if (suite / "gaps").is_dir() else []
    if not gaps:
        return list(DEFAULT_TASKS)
    return [f"gaps/{p.stem}" for p in gaps] + list(DEFAULT_WITH_GAPS)


def per_task_minutes(total_minutes: float, n_tasks: int, parallel_tasks: int) -> float:
    """Each task's time limit (`optimize --minutes`, which covers its whole run, final re-evaluation included):
    its wave's share of the total after `STARTUP_S`, less `SAFETY_SHARE`. Raises SystemExit when that is below
    half a minute (too many tasks for the budget: fewer tasks, or more minutes)."""
    waves = -(-n_tasks // max(1, parallel_tasks))
    per = (total_minutes * 60 - STARTUP_S) / max(1, waves) * (1 - SAFETY_SHARE) / 60
    if per < 0.5:
        raise SystemExit(f"error: {n_tasks} tasks, {parallel_tasks} at a time, in {total_minutes:g} minutes leave "
                         f"{per * 60:.0f} s a task; give fewer --tasks or more --total-minutes")
    return per


def default_parallel_tasks(device: str) -> int:
    """One task at a time per visible GPU (tasks sharing a GPU time each other's kernels); 1 on the CPU."""
    if device != "cuda":
        return 1
    try:
        import torch

        return max(1, torch.cuda.device_count())
    except Exception:
        return 1


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


def _confirmed(r: dict[str, Any]) -> str:
    if not r.get("confirmation"):
        return ""
    ratio = r.get("speedup_confirmed")
    return f"{ratio:.3f}x ({r['confirmation']})" if ratio else str(r["confirmation"])


def _fmt(x: Any, spec: str = ".3f", scale: float = 1.0) -> str:
    return "—" if x is None else format(x * scale, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kstrata.tools.bench_optimize", description=__doc__.splitlines()[0])
    ap.add_argument("--suite", type=Path, default=REPO / "testsuite" / "tasks")
    ap.add_argument("--tasks", default="", help="comma-separated task names under --suite ('all': every task; "
                    "default: the gap tasks plus a few others, see the docstring)")
    ap.add_argument("--total-minutes", type=float, default=9.0, help="wall-clock budget of the whole benchmark")
    ap.add_argument("--parallel-tasks", type=int, default=0, help="tasks at once (default: one per visible GPU; "
                    "tasks sharing a GPU distort each other's timings)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--budget", type=int, default=6, help="candidates per task beyond the baselines")
    ap.add_argument("--baselines", default="eager,compile", help="max-autotune alone can take a minute per task")
    ap.add_argument("--precision", default="strict")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=None, help="optimize's output directory (default: a temp dir)")
    ap.add_argument("--results", type=Path, default=REPO / "testsuite" / "results")
    ap.add_argument("--ceilings-dir", type=Path, default=REPO / "testsuite" / "results" / "bench-2026-11-30-run2")
    ap.add_argument("--extra", default="", help="more arguments for kstrata optimize (e.g. '--no-ncu')")
    ap.add_argument("--tag", default="", help="results as optimize-<device>-<date>-<tag>.{md,json} (several runs a day)")
    a = ap.parse_args(argv)

    from kstrata.agents.tasks import find_tasks

    names = default_tasks(a.suite) if not a.tasks else [t for t in a.tasks.split(",") if t]
    paths = find_tasks(a.suite) if a.tasks == "all" else _task_paths(a.suite, names)
    gpus = default_parallel_tasks(a.device)
    if a.parallel_tasks <= 0:
        a.parallel_tasks = gpus
    a.parallel_tasks = min(a.parallel_tasks, max(1, len(paths)))
    spread = ["--gpus", "all"] if a.device == "cuda" and gpus > 1 and "--gpus" not in a.extra.split() else []
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
           str(a.ceilings_dir), "--json", *spread, *([] if not out.exists() else ["--resume"]), *a.extra.split()]
    at_once = f"{a.parallel_tasks} at a time on {gpus} GPU{'s' if gpus != 1 else ''}" if a.device == "cuda" else \
        f"{a.parallel_tasks} at a time"
    print(f"{len(paths)} tasks, {at_once}, a {per_task:.2f}-minute limit each (baselines, search, final "
          f"re-evaluation and report), total budget {a.total_minutes:g} min", flush=True)
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
            r = {"name": str(rel.with_suffix("")), "status": "unfinished", "error": "not started within the budget"
                 if killed else "no result (see the log)"}
        rows.append(r)
    date = _dt.date.today().isoformat()
    meta = {"date": date, "device": a.device, "versions": _versions(), "wall_s": round(wall, 1), "killed": killed,
            "command": cmd, "total_minutes": a.total_minutes, "per_task_minutes": per_task,
            "parallel_tasks": a.parallel_tasks, "gpus": gpus}
    try:
        import torch

        if a.device == "cuda" and torch.cuda.is_available():
            meta["gpu"] = torch.cuda.get_device_name()
    except Exception:
        pass
    head = ["| task | status | incumbent baseline | chosen space | chosen | speedup vs best baseline | confirmed at the end | "
            "vs eager (final) | %SOL before | %SOL after | search s | findings | final |",
            "|---|---|---|---|---|---:|---|---:|---:|---:|---:|---|---|"]
    body = []
    for r in rows:
        if r.get("status") == "unfinished" and r.get("chosen"):  # killed: its provisional incumbent (not re-evaluated)
            body.append(f"| {r['name']} | unfinished | {r.get('incumbent_baseline', '')} | {r.get('chosen_space', '')} | "
                        f"{r['chosen'][:60].replace('|', '/')} (provisional) | {_fmt(r.get('speedup'))} | | | "
                        f"{_fmt(r.get('sol_before'), '.1f', 100)} | {_fmt(r.get('sol_after'), '.1f', 100)} | "
                        f"{r.get('seconds', 0):.0f} | {findings_cell(r.get('findings', []))} | "
                        f"killed before its final re-evaluation |")
            continue
        if r.get("status") != "done":
            body.append(f"| {r['name']} | {r.get('status')} | | | | | | | | | | | {r.get('error', '')[:80]} |")
            continue
        body.append(f"| {r['name']}{' (degenerate)' if r.get('degenerate') else ''} | done | {r['incumbent_baseline']} | "
                    f"{r['chosen_space']} | {r['chosen'][:60].replace('|', '/')} | {_fmt(r.get('speedup'))} | "
                    f"{_confirmed(r)} | {_fmt(r.get('speedup_vs_eager'))} | {_fmt(r.get('sol_before'), '.1f', 100)} | "
                    f"{_fmt(r.get('sol_after'), '.1f', 100)} | {r.get('seconds', 0):.0f}{' (cut)' if r.get('cut_short') else ''} | "
                    f"{findings_cell(r.get('findings', []))} | "
                    f"{'ok' if r.get('final_ok') else r.get('final_reason', '')[:50]} |")
    # made faster: the search's choice beat the best baseline, and the end's re-measurement against it (when it
    # ran) found it faster by more than the noise, not only within it
    won = [r for r in rows if r.get("status") == "done" and (r.get("speedup") or 0) > 1.0 and r["chosen_space"] != "baseline"
           and r.get("confirmation", "faster") in ("faster", "")]
    from kstrata.agents.optimize.report import geomean

    g = geomean([r["speedup"] for r in rows if r.get("status") == "done" and r.get("speedup") and not r.get("degenerate")])
    md = [f"# kstrata optimize benchmark ({a.device}, {date})", "",
          f"Device: {meta.get('gpu', a.device)}; versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) +
          f". Wall time {wall:.0f} s of a {a.total_minutes:g}-minute budget" + (" (killed at the budget)" if killed else "") +
          f"; {len(paths)} tasks, {at_once}, a {per_task:.2f}-minute limit each (`optimize --minutes`: baselines, "
          f"search, final re-evaluation, report), budget {a.budget} candidates, {a.workers} strategy worker"
          f"{'s' if a.workers != 1 else ''} per task, policy {a.precision}, baselines {a.baselines}. "
          "`(cut)`: the search was cut short by the deadline to leave time for the final re-evaluation.", "",
          f"Geomean speedup over the best baseline (non-degenerate, finished): {_fmt(g)}; made faster: "
          f"{len(won)} of {len(rows)} ({', '.join(r['name'] for r in won) or 'none'}).", "",
          "Speedups are interleaved medians against the best baseline measured in the same process" +
          ("; other tasks' correctness checks may share the GPU meanwhile (the guard's noise threshold covers the "
           "spread it causes). " if a.parallel_tasks > gpus else ". ") +
          "`confirmed at the end`: the choice re-measured against the best baseline in a fresh process after the "
          "search (faster / within noise / slower, which falls back to the baseline). "
          "`vs eager (final)` is the fresh re-evaluation's timing (fresh processes, fresh seeds).", "",
          *head, *body, "", *[f"- {r['name']}: {r['note']}" for r in rows if r.get("note")],
          f"Command: `{' '.join(cmd)}`", ""]
    text = "\n".join(md)
    print(text)
    targets = [a.results] + ([Path(os.environ["OUT"])] if os.environ.get("OUT") else [])
    for d in targets:
        d.mkdir(parents=True, exist_ok=True)
        stem = f"optimize-{a.device}-{date}" + (f"-{a.tag}" if a.tag else "")
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
