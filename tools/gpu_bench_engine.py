"""On an NVIDIA GPU: `kstrata bench` through the candidate engine, cold, from the engine cache, and again.

    python -m kstrata.tools.gpu_bench_engine --results testsuite/results [--only NAME ...] [--runs N]

Three runs of `bench` on a few small suite tasks (eager and compile) into fresh output directories, one
engine cache for all three: `cold` (empty engine cache: every baseline evaluated and timed), `warm` (the
same tasks and versions: every row must come from the engine cache, with the same fields), `no-cache`
(`use_cache=False`: evaluated and timed again; its medians beside the cold ones show the run-to-run
spread). Prints a short table and writes `bench-engine-gpu-<date>.json` and `.md` with the device and
versions. Exit 0 when the warm run was served entirely from the cache with identical rows, the no-cache
run evaluated everything, and every baseline was correct.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

#: Small tasks of the suite (seconds each to evaluate on an H200).
TASKS = ("level1/11_relu_fp32", "level1/17_softmax_fp32", "level2/01_gemm_bias_relu_fp16")


def main(argv: list[str] | None = None) -> int:
    from kstrata.tools.console import run_command

    return run_command(command, argv, help=__doc__)


def _rows(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{task} {b}": r for task, e in results["tasks"].items() for b, r in e["baselines"].items()}


def command(
    results: Annotated[Path, typer.Option("--results", help="Where the dated results files go.")],
    only: Annotated[list[str] | None, typer.Option("--only", help="Tasks whose path contains this (repeatable).")] = None,
    runs: Annotated[int, typer.Option("--runs", help="Timed runs per baseline (median).")] = 50,
) -> int:
    import torch
    import triton

    from kstrata.agents.bench import run_bench
    from kstrata.agents.roofline import load_or_measure

    if not torch.cuda.is_available():
        print("error: needs an NVIDIA GPU", file=sys.stderr)
        return 2
    suite = Path(__file__).resolve().parents[1] / "testsuite" / "tasks"
    work = Path(tempfile.mkdtemp(prefix="kstrata-bench-engine-"))
    ceilings, _ = load_or_measure(work)  # measured on this GPU (copy bandwidth, matmul rates)
    engine = work / "engine"
    runs_out: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    for name, use_cache in (("cold", True), ("warm", True), ("no-cache", False)):
        start = time.perf_counter()
        runs_out[name] = run_bench(suite, ["eager", "compile"], work / name, runs=runs, only=list(only or TASKS),
                                   ceilings=ceilings, engine_cache=engine, use_cache=use_cache,
                                   on_progress=lambda m: print(m, flush=True))
        seconds[name] = time.perf_counter() - start
    cold, warm, fresh = (_rows(runs_out[k]) for k in ("cold", "warm", "no-cache"))

    def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
        return {k: v for k, v in a.items() if k != "engine"} == {k: v for k, v in b.items() if k != "engine"}

    table = []
    for key, r in cold.items():
        w, f = warm.get(key, {}), fresh.get(key, {})
        table.append({"row": key, "correct": r.get("correct"), "cold_us": (r.get("timing") or {}).get("median_us"),
                      "no_cache_us": (f.get("timing") or {}).get("median_us"),
                      "warm_cached": bool(w.get("engine", {}).get("cached")), "warm_identical": same(r, w),
                      "no_cache_evaluated": f.get("engine", {}).get("cached") is False})
    env = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "python": platform.python_version()}
    ok = bool(table) and all(t["correct"] and t["warm_cached"] and t["warm_identical"] and t["no_cache_evaluated"]
                             for t in table)
    data = {"schema": "kstrata.bench-engine-gpu/1", "environment": env, "seconds": seconds, "ok": ok, "rows": table,
            "engine": {k: v.get("engine") for k, v in runs_out.items()}}
    results.mkdir(parents=True, exist_ok=True)
    stem = f"bench-engine-gpu-{env['date'][:10]}"
    (results / f"{stem}.json").write_text(json.dumps(data, indent=2, default=str) + "\n")

    def us(x: Any) -> str:
        return "—" if x is None else f"{x:.1f}"

    lines = [f"# kstrata bench through the candidate engine on {env['device']}", "",
             f"{env['date']} · torch {env['torch']} · triton {env['triton']} · CUDA {env['cuda']} · runs {runs}", "",
             "Wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()), "",
             "| task baseline | correct | cold µs | no-cache µs | warm from engine cache | warm rows identical |",
             "|---|---|---:|---:|---|---|"]
    lines += [f"| {t['row']} | {'yes' if t['correct'] else 'NO'} | {us(t['cold_us'])} | {us(t['no_cache_us'])} | "
              f"{'yes' if t['warm_cached'] else 'NO'} | {'yes' if t['warm_identical'] else 'NO'} |" for t in table]
    (results / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
