"""Benchmark: `run-passes` over the Inductor corpus on the candidate engine, cold and with a warm engine cache,
and the engine's binary dedupe on corpus kernels.

    python -m kstrata.tools.bench_engine [--results DIR] [--jobs N] [--pipeline SPEC] [--dedupe-kernels N]

1. The corpus (`testsuite/corpus`, TTIR of kernels `torch.compile` generated, for cuda:90 and gfx942) is
   recompiled into a fresh Triton cache (`bench_run_passes.build_corpus_cache`).
2. Cold: `run-passes` with an empty engine cache (every kernel built in a worker process).
3. Warm: `run-passes` again into a fresh output directory with the same engine cache (every build is a
   cache hit: no worker process starts; the overrides and the report are written again).
4. Dedupe: for the first N cuda:90 kernels, two different edits that make the same binary — the pass
   `ttgir(num-warps{n=8})` and the option override `num_warps=8` — built through the engine; the second
   of each pair is recognised by its binary digest (checked and timed once).

Writes `engine-corpus-cpu-<date>.json` and `.md` (machine, versions, load average) under `--results`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kstrata.tools.bench_run_passes import DEFAULT_PIPELINE, build_corpus_cache


def main(argv: list[str] | None = None) -> int:
    import torch
    import triton

    from kstrata.agents.engine import Candidate, Engine, OptionsEdit, PipelineEdit
    from kstrata.agents.run_passes import run_passes

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--pipeline", default=DEFAULT_PIPELINE)
    parser.add_argument("--targets", nargs="*", default=["cuda:90", "hip:gfx942"])
    parser.add_argument("--dedupe-kernels", type=int, default=8)
    parser.add_argument("--corpus", type=Path, default=Path(__file__).resolve().parent.parent / "testsuite" / "corpus")
    ns = parser.parse_args(argv)

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kstrata-bench-engine-") as tmp:
        cache, engine_cache = Path(tmp) / "cache", Path(tmp) / "engine"
        compile_s, compile_failures = build_corpus_cache(ns.corpus, ns.targets, cache)
        runs: dict[str, Any] = {}
        for phase in ("cold", "warm"):
            start = time.perf_counter()
            report = run_passes(cache, ns.pipeline, Path(tmp) / f"out-{phase}", jobs=ns.jobs, engine_cache=engine_cache)
            runs[phase] = {"wall_s": time.perf_counter() - start, "counts": report.counts(), "engine": report.engine,
                           "failures": {k["entry"]: k["error"] for k in report.kernels if k["status"] == "failed"}}
        same = runs["cold"]["counts"] == runs["warm"]["counts"]
        dedupe: dict[str, Any] = {}
        with Engine(engine_cache, jobs=ns.jobs) as engine:
            entries = sorted(p for p in cache.iterdir() if p.is_dir() and any(p.glob("*.cubin")))[:ns.dedupe_kernels]
            candidates = []
            for entry in entries:
                base = engine.add_kernel(entry)
                candidates += [Candidate(base, "ttgir", PipelineEdit("ttgir(num-warps{n=8})")),
                               Candidate(base, "options", OptionsEdit.of({"num_warps": 8}))]
            start = time.perf_counter()
            built = engine.build_many(candidates)
            dedupe = {"kernels": len(entries), "candidates": len(candidates), "wall_s": time.perf_counter() - start,
                      "changed": sum(b.status == "changed" for b in built),
                      "deduplicated": engine.stats.deduplicated,
                      "distinct_binaries": len({b.binary_digest for b in built if b.binary_digest})}
    cold, warm = runs["cold"], runs["warm"]
    env = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "machine": platform.machine(),
           "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
           "triton": triton.__version__,
           "load_average_1m": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)}}
    speedup = cold["wall_s"] / warm["wall_s"]
    result = {"schema": "kstrata.bench-engine/1", "environment": env, "pipeline": ns.pipeline, "jobs": ns.jobs,
              "targets": ns.targets, "compile_failures": compile_failures, "triton_compile_total_s": sum(compile_s),
              "cold": cold, "warm": warm, "warm_speedup": speedup, "same_counts": same, "dedupe": dedupe}
    n = sum(cold["counts"].values())
    text = (f"# run-passes on the candidate engine: cold and warm\n\n{env['date']} · {env['cpus']} CPUs "
            f"({env['machine']}) · torch {env['torch']} · triton {env['triton']} · load average (1 min) "
            f"{env['load_average_1m']['before']} before, {env['load_average_1m']['after']} after\n\n"
            f"Pipeline `{ns.pipeline}` over the Inductor corpus (recompiled from its TTIR) for "
            f"{', '.join(ns.targets)}: {n} kernels, {ns.jobs} jobs.\n\n"
            "| run | wall | changed / unchanged / failed | built | engine-cache hits | deduplicated |\n"
            "|---|---|---|---|---|---|\n"
            + "".join(f"| {phase} | {r['wall_s']:.1f} s | {r['counts']['changed']} / {r['counts']['unchanged']} / "
                      f"{r['counts']['failed']} | {r['engine']['builds']} | {r['engine']['build_cache_hits']} | "
                      f"{r['engine']['deduplicated']} |\n" for phase, r in runs.items())
            + f"\nWarm is **{speedup:.1f}x** faster than cold (same outcome per kernel: {same}); Triton's own compile "
              f"of these kernels took {sum(compile_s):.1f} s in total.\n\n"
              f"Dedupe: {dedupe['candidates']} candidates on {dedupe['kernels']} cuda:90 corpus kernels (the pass "
              f"`ttgir(num-warps{{n=8}})` and the option override `num_warps=8` for each) gave "
              f"{dedupe['distinct_binaries']} distinct binaries; {dedupe['deduplicated']} builds were recognised as "
              "duplicates by binary digest (checked and timed once).\n")
    print(text)
    if ns.results:
        ns.results.mkdir(parents=True, exist_ok=True)
        stem = f"engine-corpus-cpu-{env['date'][:10]}"
        (ns.results / f"{stem}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        (ns.results / f"{stem}.md").write_text(text)
    return 0 if not cold["failures"] and same else 1


if __name__ == "__main__":
    sys.exit(main())
