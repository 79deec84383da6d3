"""Benchmark and table: the symbolic checker on every TTIR/TTGIR pass's output for the suite kernels.

    python -m kstrata.testsuite.bench_symbolic [--target cuda:90] [--only KERNEL]... [--timeout S] [--jobs N]
                                            [--results DIR] [--json] [--no-planted]

For each suite kernel (compiled for the target) and each pass of the table below whose output differs
from the kernel's level, `kstrata.ir.symbolic.check(original, rewritten, level)` runs with the given
time limit per query; the kernel against itself (`identity`) is the coverage row: it says whether the
checker models the kernel at all. Reported per pass and kernel: proved / undecided (with the reason)
/ counterexample (confirmed by the interpreter), the whole check's seconds and the slowest query; per
pass the counts and the median and worst check time. Passes that declare a tolerance (not bit-exact)
are expected to get counterexamples: the checker's claims are bit-exact. (It lives in `testsuite/`, not
`tools/`: it reads the suite and the planted cases, and `tools/` never imports `testsuite/`.) The planted TTIR/TTGIR cases
(`testsuite/planted`) follow unless `--no-planted` or `--only` is given. With `--results DIR`,
`symbolic-cpu-<date>.md` and `.json` (machine, versions) are written there.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import typer

#: (pipeline, level) pairs; `identity` compares a level with itself.
PASSES: tuple[tuple[str, str], ...] = (
    ("identity", "ttir"),
    ("identity", "ttgir"),
    ("ttir(load-eviction)", "ttir"),
    ("ttir(dot-precision{precision=ieee})", "ttir"),
    ("ttgir(num-stages{n=2})", "ttgir"),
    ("ttgir(num-warps{n=8})", "ttgir"),
)


def _tolerant(spec: str) -> bool:
    from kstrata.passes.pipeline import parse_pipeline

    if spec == "identity":
        return False
    return any(p.declared_tolerance() is not None for s in parse_pipeline(spec).stages for p in s.passes)


def run_kernel(job: tuple[str, str, float, Path]) -> list[dict[str, Any]]:
    """Every pass of `PASSES` on one suite kernel; one row per (pass, level)."""
    name, target, timeout_s, cache = job
    from kstrata.ir.symbolic import check
    from kstrata.ir.target import Target
    from kstrata.passes.pipeline import apply_passes_only, parse_pipeline
    from kstrata.testsuite.kernels import get_kernel
    from kstrata.testsuite.kernels.build import bundle_for

    rows: list[dict[str, Any]] = []
    try:
        bundle = bundle_for(get_kernel(name), Target.parse(target), cache / name)
    except Exception as exc:  # a kernel that does not compile here is a row, not a crash of the table
        return [{"kernel": name, "pass": "-", "level": "-", "status": "error", "reason": f"{type(exc).__name__}: {exc}",
                 "seconds": 0.0, "worst_query": 0.0, "claims": 0, "tolerance": False}]
    for spec, level in PASSES:
        row: dict[str, Any] = {"kernel": name, "pass": spec, "level": level, "tolerance": _tolerant(spec)}
        original = bundle.text(level)
        try:
            if spec == "identity":
                candidate = original
            else:
                text, _, touched = apply_passes_only(bundle, parse_pipeline(spec))
                candidate = text if touched == level else original
        except Exception as exc:
            rows.append({**row, "status": "error", "reason": f"the pass failed: {type(exc).__name__}: {exc}",
                         "seconds": 0.0, "worst_query": 0.0, "claims": 0})
            continue
        if spec != "identity" and candidate == original:
            rows.append({**row, "status": "unchanged", "reason": "the pass changed nothing", "seconds": 0.0,
                         "worst_query": 0.0, "claims": 0})
            continue
        start = time.perf_counter()
        try:
            result = check(original, candidate, level, timeout_s=timeout_s)
            rows.append({**row, "status": result.status, "reason": result.reason,
                         "seconds": round(time.perf_counter() - start, 3),
                         "worst_query": round(max(result.query_seconds, default=0.0), 3), "claims": result.claims,
                         "confirmed": bool(result.counterexample and result.counterexample.confirmed)})
        except Exception as exc:
            rows.append({**row, "status": "error", "reason": f"{type(exc).__name__}: {exc}",
                         "seconds": round(time.perf_counter() - start, 3), "worst_query": 0.0, "claims": 0})
    return rows


def planted_texts(case: Any) -> tuple[str, str]:
    """The original and the candidate text of a planted TTIR/TTGIR case at its level (no lower level
    is rebuilt: the symbolic check reads that level only)."""
    from kstrata.passes.pipeline import apply_passes_only, parse_pipeline
    from kstrata.testsuite.planted.candidate import original_bundle

    original = original_bundle(case)
    before = original.text(case.level)
    if case.pipeline:
        after, _, touched = apply_passes_only(original, parse_pipeline(case.pipeline))
        if touched != case.level:
            raise ValueError(f"planted case {case.name}: the pipeline touches {touched}, not {case.level}")
    else:
        after = case.apply_edits(before)
    if after == before:
        raise ValueError(f"planted case {case.name}: the candidate's {case.level} is the original's")
    return before, after


def run_planted(timeout_s: float) -> list[dict[str, Any]]:
    """The planted TTIR/TTGIR cases (`testsuite/planted`): every bug must get a confirmed counterexample,
    no correct rewrite one."""
    from kstrata.ir.symbolic import check
    from kstrata.testsuite.planted import CASES

    rows: list[dict[str, Any]] = []
    for case in CASES:
        if case.level not in ("ttir", "ttgir"):
            continue
        row: dict[str, Any] = {"case": case.name, "kernel": case.kernel, "level": case.level,
                               "expected": "accept" if case.correct else "reject"}
        try:
            before, after = planted_texts(case)
            start = time.perf_counter()
            r = check(before, after, case.level, timeout_s=timeout_s)
            confirmed = bool(r.counterexample and r.counterexample.confirmed)
            ok = (r.status != "counterexample") if case.correct else (r.status == "counterexample" and confirmed)
            rows.append({**row, "status": r.status, "ok": ok, "seconds": round(time.perf_counter() - start, 3),
                         "worst_query": round(max(r.query_seconds, default=0.0), 3), "reason": r.reason})
        except Exception as exc:
            rows.append({**row, "status": "error", "ok": False, "seconds": 0.0, "worst_query": 0.0,
                         "reason": f"{type(exc).__name__}: {exc}"})
    return rows


def _environment() -> dict[str, Any]:
    import triton
    import z3

    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
            "python": platform.python_version(), "triton": triton.__version__, "z3": z3.get_version_string(),
            "cpus": os.cpu_count(), "machine": platform.machine()}


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for spec, level in PASSES:
        mine = [r for r in rows if r["pass"] == spec and r["level"] == level]
        checked = [r for r in mine if r["status"] in ("proved", "undecided", "counterexample")]
        times = sorted(r["seconds"] for r in checked)
        out.append({"pass": spec, "level": level, "kernels": len(mine),
                    **{s: sum(r["status"] == s for r in mine)
                       for s in ("proved", "undecided", "counterexample", "unchanged", "error")},
                    "median_s": round(statistics.median(times), 3) if times else None,
                    "worst_s": round(times[-1], 3) if times else None, "tolerance": _tolerant(spec)})
    return out


def _reason_kind(reason: str) -> str:
    """The reason without its per-kernel details (for the counts of why rows are undecided)."""
    if reason.startswith("unsupported: "):
        return reason[:100]
    if reason.startswith("the solver refuted"):
        return "refuted under the abstraction, no difference in the interpreter"
    if reason.startswith("the time budget"):
        return "the time budget ran out"
    return reason.split(":")[0][:100]


def write_results(rows: list[dict[str, Any]], env: dict[str, Any], target: str, timeout_s: float,
                  directory: Path, planted: list[dict[str, Any]] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"symbolic-cpu-{env['date'][:10]}"
    summary = summarize(rows)
    payload = {"schema": "kstrata.bench-symbolic/1", "environment": env, "target": target, "timeout_s": timeout_s,
               "summary": summary, "rows": rows, "planted": planted or []}
    (directory / f"{stem}.json").write_text(json.dumps(payload, indent=1) + "\n")  # first: the table is derived
    lines = [f"# Symbolic translation validation on the suite kernels ({target})", "",
             f"{env['date']} · {env['host']} ({env['cpus']} CPUs) · python {env['python']} · triton {env['triton']} · "
             f"z3 {env['z3']} · {timeout_s:g} s per query · command: `python -m kstrata.testsuite.bench_symbolic "
             f"--target {target} --timeout {timeout_s:g}`", "",
             "Seconds are one whole `check` (both programs executed symbolically, every claim solved, a refuted "
             "claim replayed in the interpreter). `identity` checks a level against itself: whether the checker "
             "models the kernel. Passes marked *tolerance* are not bit-exact by their own declaration: a "
             "counterexample there is the expected answer.", "",
             "## Per pass", "",
             "| pass | level | kernels | proved | undecided | counterexample | unchanged | error | median s | worst s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        name = s["pass"] + (" *(tolerance)*" if s["tolerance"] else "")
        lines.append(f"| {name} | {s['level']} | {s['kernels']} | {s['proved']} | {s['undecided']} | "
                     f"{s['counterexample']} | {s['unchanged']} | {s['error']} | {s['median_s']} | {s['worst_s']} |")
    reasons: dict[str, int] = {}
    for r in rows:
        if r["status"] == "undecided":
            k = _reason_kind(r["reason"])
            reasons[k] = reasons.get(k, 0) + 1
    lines += ["", "## Why undecided", "", "| reason | rows |", "|---|---|"]
    lines += [f"| {k.replace('|', '/')} | {n} |" for k, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
    if planted:
        good = sum(r["ok"] for r in planted)
        lines += ["", f"## Planted TTIR/TTGIR cases: {good} of {len(planted)} as expected", "",
                  "A bug must get a counterexample the interpreter confirms; a correct rewrite must not get one.", "",
                  "| case | level | expected | status | ok | s | reason |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['case']} | {r['level']} | {r['expected']} | {r['status']} | {'yes' if r['ok'] else 'NO'} | "
                  f"{r['seconds']} | {r['reason'][:150].replace('|', '/')} |" for r in planted]
    kernels: dict[str, list[float]] = {}
    for r in rows:
        if r["status"] in ("proved", "undecided", "counterexample"):
            kernels.setdefault(r["kernel"], []).append(r["seconds"])
    lines += ["", "## Check time per kernel (over its passes and levels)", "", "| kernel | checks | median s | worst s |",
              "|---|---|---|---|"]
    lines += [f"| {k} | {len(v)} | {statistics.median(v):.3f} | {max(v):.3f} |" for k, v in kernels.items()]
    lines += ["", "## Per kernel", "", "| kernel | pass | level | status | s | slowest query s | claims | reason |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] == "unchanged":
            continue
        reason = "" if r["status"] == "proved" else r["reason"][:160].replace("|", "/")
        lines.append(f"| {r['kernel']} | {r['pass']} | {r['level']} | {r['status']} | {r['seconds']} | "
                     f"{r['worst_query']} | {r['claims']} | {reason} |")
    path = directory / f"{stem}.md"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    from kstrata.tools.console import run_command

    return run_command(command, argv, help=__doc__)


def command(
    target: Annotated[str, typer.Option("--target", help="The target the suite is compiled for.")] = "cuda:90",
    only: Annotated[list[str] | None, typer.Option("--only", help="Only this suite kernel (repeatable).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds per solver query.")] = 5.0,
    jobs: Annotated[int, typer.Option("--jobs", help="Kernels checked in parallel.")] = 1,
    results: Annotated[Path | None, typer.Option("--results", help="Write dated results here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    no_planted: Annotated[bool, typer.Option("--no-planted", help="Leave out the planted TTIR/TTGIR cases.")] = False,
) -> int:
    import tempfile

    ns = SimpleNamespace(target=target, only=only, timeout=timeout, jobs=jobs, results=results, json=as_json,
                         no_planted=no_planted)
    from kstrata.testsuite.kernels import all_kernels

    names = [k.name for k in all_kernels()]
    if ns.only:
        unknown = sorted(set(ns.only) - set(names))
        if unknown:
            print(f"error: unknown suite kernels: {', '.join(unknown)}", file=sys.stderr)
            return 2
        names = [n for n in names if n in ns.only]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kstrata-bench-symbolic-") as cache:
        work = [(n, ns.target, ns.timeout, Path(cache)) for n in names]
        pool = ProcessPoolExecutor(max_workers=ns.jobs) if ns.jobs > 1 else None
        outputs = pool.map(run_kernel, work) if pool is not None else map(run_kernel, work)
        for kernel_rows in outputs:
            rows += kernel_rows
            if not ns.json:
                for r in kernel_rows:
                    if r["status"] != "unchanged":
                        print(f"{r['kernel']:34s} {r['pass']:38s} {r['level']:6s} {r['status']:15s} "
                              f"{r['seconds']:7.2f}s  {r['reason'][:90]}", flush=True)
        if pool is not None:
            pool.shutdown()
    planted = [] if ns.no_planted or ns.only else run_planted(ns.timeout)
    for p in planted:
        if not ns.json:
            print(f"planted {p['case']:30s} {p['level']:6s} expected {p['expected']:6s} {p['status']:15s} "
                  f"{'ok' if p['ok'] else 'UNEXPECTED'} {p['seconds']:6.2f}s", flush=True)
    env = _environment()
    if ns.results:
        path = write_results(rows, env, ns.target, ns.timeout, ns.results, planted)
        if not ns.json:
            print(f"results: {path}")
    if ns.json:
        print(json.dumps({"environment": env, "summary": summarize(rows), "rows": rows}, indent=1))
    else:
        for s in summarize(rows):
            print(f"{s['pass']:38s} {s['level']:6s} proved {s['proved']:2d} undecided {s['undecided']:2d} "
                  f"counterexample {s['counterexample']:2d} unchanged {s['unchanged']:2d} error {s['error']:2d} "
                  f"median {s['median_s']} s worst {s['worst_s']} s")
    wrong = [r for r in rows if r["status"] == "counterexample" and not r["tolerance"]]
    return 1 if wrong or any(not p["ok"] for p in planted) else 0


if __name__ == "__main__":
    sys.exit(main())
