"""Why a template instance runs at the speed it does, on the GPU: per-kernel times (torch.profiler) and Nsight
Compute's scheduler and warp-state sections (issue rate, warps a scheduler, the stall reasons) of each kernel of
one forward call, for a gap task rendered with a given schedule.

    python -m kstrata.tools.template_probe 05:conv:'{"strategy": "fmat", "BLOCK_M": 256, "BLOCK_N": 32}' \
        02:pool2d:'{"BLOCK_H": 32, "BLOCK_W": 256, "num_warps": 4}' [--source FILE.py ...] [--no-ncu]

A probe is TASK-PREFIX:TEMPLATE:PARAMS-JSON (the parameters over the template's default schedule); `--source`
adds a ModelNew file written by hand for a gap task (named `<task stem>*.py`). The model and inputs are built on
the GPU like the templates bench's (seeded, the task's published sizes). Each probe's output is checked against
eager under strict first: a probe that is wrong is reported, never profiled. Results go to
testsuite/results/template-probe-<date><suffix>.{json,md} (and $OUT when set).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GAPS = ROOT / "testsuite" / "tasks" / "gaps"
RESULTS = ROOT / "testsuite" / "results"
NVTX = "kstrata_probe"
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "SchedulerStats", "WarpStateStats")
#: raw metrics read from the sections above (ncu's raw page): a stall reason is `..._stalled_<reason>_...`
STALL = re.compile(r"^smsp__average_warps?_(?:issue_stalled|latency_issue_stalled)_(\w+?)_per_issue_active\.ratio$")
KEEP = {
    "gpu__time_duration.sum": "duration_ns",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue_active_pct",
    "smsp__warps_active.avg.per_cycle_active": "warps_per_scheduler",
    "smsp__warps_eligible.avg.per_cycle_active": "eligible_per_scheduler",
    "launch__registers_per_thread": "registers",
    "launch__block_size": "block",
    "launch__grid_size": "grid",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
    "smsp__average_warp_latency_per_inst_issued.ratio": "cycles_per_issue",
}


def _say(msg: str) -> None:
    print(msg, flush=True)


def parse_probe(text: str) -> tuple[Path, str, dict[str, Any]]:
    """TASK-PREFIX:TEMPLATE:PARAMS-JSON -> (task path, template, params); ValueError says what is wrong."""
    parts = text.split(":", 2)
    if len(parts) != 3:
        raise ValueError(f"probe {text!r}: expected TASK-PREFIX:TEMPLATE:PARAMS-JSON")
    prefix, template, js = parts
    paths = sorted(p for p in GAPS.glob("[0-9]*.py") if p.name.startswith(prefix))
    if len(paths) != 1:
        raise ValueError(f"probe {text!r}: the prefix {prefix!r} names {len(paths)} gap tasks")
    try:
        params = json.loads(js or "{}")
    except json.JSONDecodeError as e:
        raise ValueError(f"probe {text!r}: its parameters are not JSON ({e.msg})") from None
    if not isinstance(params, dict):
        raise ValueError(f"probe {text!r}: its parameters are not a JSON object")
    return paths[0], template, params


def render(path: Path, template: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The template's source for the task with `params` over its default schedule, and the full schedule."""
    from kstrata.agents.tasks import load_task
    from kstrata.agents.templates import match

    found = [m for m in match(load_task(path), "strict") if m.template == template]
    if not found:
        raise ValueError(f"{path.name}: the template {template!r} does not match it")
    m = found[0]
    full = {**m.default_params(), **params}
    return m.render(full), full


def parse_ncu(text: str) -> dict[str, dict[str, Any]]:
    """ncu's raw CSV page -> {"kernel name #ID": {metric: value}} (numbers where they parse)."""
    from kstrata.agents.optimize.evaluation import parse_ncu_csv

    return {f"{r.get('Kernel Name', '?')} #{int(r['ID'])}": r for r in parse_ncu_csv(text)}


def summarize(metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics read from one kernel: KEEP's, and the stall reasons by cycles a issued instruction."""
    s: dict[str, Any] = {short: metrics[m] for m, short in KEEP.items() if isinstance(metrics.get(m), float)}
    stalls = {}
    for k, v in metrics.items():
        mt = STALL.match(k)
        if mt and isinstance(v, float) and v > 0:
            stalls[mt.group(1)] = round(v, 3)
    s["stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1])[:8])
    return s


def child(source: str, task: str) -> int:
    """Run one forward of the ModelNew in `source` inside the NVTX range (under ncu)."""
    import torch

    env = _task_env(Path(task))
    model = env.build(Path(source).read_text(), "probe")
    with torch.no_grad():
        model(*env.inputs)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(NVTX)  # type: ignore[no-untyped-call]
        model(*env.inputs)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()  # type: ignore[no-untyped-call]
    return 0


def _task_env(path: Path) -> Any:
    from kstrata.agents.tasks import load_task
    from kstrata.agents.templates import match
    from kstrata.agents.templates.tune import TaskOnDevice

    ms = match(load_task(path), "strict")
    if not ms:
        raise ValueError(f"{path.name}: no template matches it")
    return TaskOnDevice(ms[0])


def _margins(c: Any) -> dict[str, float | None]:
    """The output's errors against float64 beside eager's and the strict bounds (`evaluate.OutputComparison`)."""
    if c is None:
        return {}
    return {"rel_l2": c.candidate_rel_l2, "bound_rel_l2": c.strict_bound_rel_l2, "eager_rel_l2": c.reference_rel_l2,
            "max_abs": c.candidate_max_abs, "bound_max_abs": c.strict_bound_max_abs}


def probe_one(label: str, path: Path, source: str, ncu: str | None, work: Path) -> dict[str, Any]:
    import torch

    from kstrata.backends.timing import time_gpu

    entry: dict[str, Any] = {"probe": label, "task": path.stem}
    env = _task_env(path)
    model = env.build(source, re.sub(r"\W+", "_", label)[:40])
    with torch.no_grad():
        out = model(*env.inputs)
    why, comparison = env.judge(out)
    entry["correct"] = why is None
    m = entry["strict"] = _margins(comparison)
    if m and None not in m.values():
        _say(f"  {label}: rel L2 {m['rel_l2']:.3g} (bound {m['bound_rel_l2']:.3g}, eager {m['eager_rel_l2']:.3g}), "
             f"max abs {m['max_abs']:.3g} (bound {m['bound_max_abs']:.3g})")
    if why is not None:
        entry["error"] = f"not correct under strict: {why}"
        return entry
    with torch.no_grad():
        entry["median_us"] = round(float(time_gpu(lambda: model(*env.inputs), runs=20, warmup=3).median_us), 1)
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                model(*env.inputs)
            torch.cuda.synchronize()
    kernels: dict[str, float] = {}
    for ev in prof.key_averages():
        dev = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if dev and ev.count:
            kernels[ev.key] = round(dev / 5, 1)
    entry["kernels_us"] = dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:8])
    _say(f"  {label}: {entry['median_us']} us; kernels " + ", ".join(f"{k[:40]} {v}" for k, v in entry['kernels_us'].items()))
    model = out = env = None  # the task's inputs freed before ncu's child builds its own
    torch.cuda.empty_cache()
    if ncu:
        src = work / f"{re.sub(r'[^A-Za-z0-9]+', '_', label)[:60]}.py"
        src.write_text(source)
        cmd = [ncu, "--nvtx", "--nvtx-include", f"{NVTX}/", *[a for s in SECTIONS for a in ("--section", s)],
               "--csv", "--page", "raw", sys.executable, "-m", "kstrata.tools.template_probe", "--child", str(src),
               "--child-task", str(path)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
            parsed = parse_ncu(r.stdout)
            if not parsed:
                tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
                entry["ncu_error"] = f"ncu exit {r.returncode}, no kernels: {' | '.join(tail)[:300]}"
            entry["ncu"] = {k: summarize(v) for k, v in parsed.items()}
        except subprocess.TimeoutExpired:
            entry["ncu_error"] = "ncu ran past 240 s"
        for k, s in entry.get("ncu", {}).items():
            _say(f"    {k[:50]}: {s.get('duration_ns', 0) / 1e3:.1f} us, issue {s.get('issue_active_pct', 0):.0f}%, "
                 f"{s.get('warps_per_scheduler', 0):.1f} warps/scheduler ({s.get('eligible_per_scheduler', 0):.2f} "
                 f"eligible), {s.get('registers', 0):.0f} regs; stalls {s.get('stalls')}")
        if "ncu_error" in entry:
            _say(f"    {entry['ncu_error']}")
    return entry


def markdown(res: dict[str, Any]) -> str:
    out = [f"# Template probes — {res['device']}, {res['date']}", "",
           f"torch {res['versions']['torch']}, Triton {res['versions']['triton']}. Times: median us (L2 flushed); "
           "kernel times from torch.profiler (mean of 5 calls); issue and stalls from Nsight Compute (one call, "
           "its kernels replayed), stalls in cycles per issued instruction.", "",
           *([] if res.get("complete", True) else ["**Incomplete: the run stopped after the probes below.**", ""]),
           "| probe | median us | kernel | us | issue % | warps/sched | eligible | regs | top stalls |",
           "|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for e in res["probes"]:
        if "error" in e:
            out.append(f"| {e['probe']} | | | | | | | | {e['error']} |")
            continue
        first = True
        for k, s in (e.get("ncu") or {"(no ncu)": {}}).items():
            stalls = ", ".join(f"{n} {v}" for n, v in list(s.get("stalls", {}).items())[:4])
            out.append(f"| {e['probe'] if first else ''} | {e['median_us'] if first else ''} | {k[:48]} | "
                       f"{s.get('duration_ns', 0) / 1e3:.1f} | {s.get('issue_active_pct', 0):.0f} | "
                       f"{s.get('warps_per_scheduler', 0):.2f} | {s.get('eligible_per_scheduler', 0):.2f} | "
                       f"{s.get('registers', 0):.0f} | {stalls} |")
            first = False
        if e.get("ncu_error"):
            out.append(f"| | | {e['ncu_error']} | | | | | | |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="template_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("probes", nargs="*", help="TASK-PREFIX:TEMPLATE:PARAMS-JSON")
    p.add_argument("--source", action="append", default=[], help="TASK-PREFIX:FILE.py, a ModelNew written by hand")
    p.add_argument("--no-ncu", action="store_true")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--suffix", default="")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-task", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.child:
        return child(ns.child, ns.child_task)
    todo: list[tuple[str, Path, str]] = []
    try:
        for t in ns.probes:
            path, template, params = parse_probe(t)
            src, _ = render(path, template, params)
            todo.append((f"{path.stem[:2]} {template} {json.dumps(params, sort_keys=True)}", path, src))
        for s in ns.source:
            prefix, _, file = s.partition(":")
            paths = sorted(q for q in GAPS.glob("[0-9]*.py") if q.name.startswith(prefix))
            if len(paths) != 1 or not Path(file).is_file():
                raise ValueError(f"--source {s!r}: expected TASK-PREFIX:FILE.py naming one gap task and a file")
            todo.append((f"{paths[0].stem[:2]} {Path(file).name}", paths[0], Path(file).read_text()))
    except ValueError as e:
        print(f"template_probe: {e}", file=sys.stderr)
        return 2
    import torch
    import triton

    if not torch.cuda.is_available():
        print("template_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    ncu = None if ns.no_ncu else (shutil.which("ncu") or next((c for c in ("/usr/local/cuda/bin/ncu",)
                                                              if os.path.exists(c)), None))
    work = Path(tempfile.mkdtemp(prefix="kstrata-probe-"))
    res: dict[str, Any] = {"schema": "kstrata.template-probe/1", "device": torch.cuda.get_device_name(),
                           "date": dt.date.today().isoformat(), "ncu": ncu,
                           "versions": {"torch": torch.__version__, "triton": triton.__version__}, "probes": []}
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    md = ""
    for label, path, src in todo:
        _say(f"probe {label}")
        try:
            res["probes"].append(probe_one(label, path, src, ncu, work))
        except Exception as e:  # one probe's failure is a row of the report
            res["probes"].append({"probe": label, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            _say(f"  failed: {type(e).__name__}: {str(e)[:300]}")
        torch.cuda.empty_cache()
        # written after every probe: a call's limit that stops the run keeps the probes measured before it
        res["complete"] = len(res["probes"]) == len(todo)
        md = markdown(res)
        for d in [Path(ns.results), *([out_dir] if out_dir else [])]:
            d.mkdir(parents=True, exist_ok=True)
            for ext, text in (("json", json.dumps(res, indent=1) + "\n"), ("md", md)):
                target = d / f"template-probe-{res['date']}{ns.suffix}.{ext}"
                tmp = target.with_name(target.name + ".tmp")
                tmp.write_text(text)
                tmp.replace(target)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
