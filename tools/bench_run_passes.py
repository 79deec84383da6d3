"""Benchmark: `run-passes` throughput on the CPU, next to Triton's own compile time for the same kernels.

    python -m kstrata.tools.bench_run_passes [--results DIR] [--jobs N] [--pipeline SPEC] [--targets T ...]

Builds the kernel suite for each target into a fresh cache (timing Triton's compile of every kernel),
then runs `run-passes` over that cache (each kernel in its own child process, as the command does) and
reports kernels per second and the cost relative to compiling the kernels in the first place. Writes
`run-passes-cpu-<date>.json` and `.md` with the machine and versions.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_PIPELINE = "llir(noalias-args{assume=true}),ptx(cache-hints),amdgcn(nontemporal-hints)"


def main(argv: list[str] | None = None) -> int:
    import torch
    import triton

    from kstrata.ir.target import Target
    from kstrata.passes.runner import run_passes
    from kstrata.testsuite.kernels import all_kernels
    from kstrata.testsuite.kernels.build import bundle_for

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--pipeline", default=DEFAULT_PIPELINE)
    parser.add_argument("--targets", nargs="*", default=["cuda:90", "hip:gfx942"])
    ns = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="kstrata-bench-") as tmp:
        cache = Path(tmp) / "cache"
        compile_s: list[float] = []
        for spelling in ns.targets:
            target = Target.parse(spelling)
            for kernel in all_kernels():
                if target.backend in kernel.unsupported_backends:
                    continue
                start = time.perf_counter()
                bundle_for(kernel, target, cache)
                compile_s.append(time.perf_counter() - start)
        from kstrata.testsuite.kernels.build import build_suite

        for spelling in ns.targets:  # writes the override-key index (the entries are cache hits by now)
            build_suite(Target.parse(spelling), cache)
        start = time.perf_counter()
        report = run_passes(cache, ns.pipeline, Path(tmp) / "out", jobs=ns.jobs)
        wall = time.perf_counter() - start
    per_kernel = [k["seconds"] for k in report.kernels]
    n = len(report.kernels)
    env = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "machine": platform.machine(),
           "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
           "triton": triton.__version__, "host": platform.node()}
    result: dict[str, Any] = {
        "schema": "kstrata.bench-run-passes/1", "environment": env, "pipeline": ns.pipeline, "jobs": ns.jobs,
        "targets": ns.targets, "kernels": n, "counts": report.counts(),
        "triton_compile_s": {"total": sum(compile_s), "median": statistics.median(compile_s)},
        "run_passes_s": {"wall": wall, "per_kernel_median": statistics.median(per_kernel),
                         "per_kernel_total": sum(per_kernel)},
        "kernels_per_second": n / wall,
        "overhead_vs_compile": wall / sum(compile_s),
    }
    text = (f"# run-passes on the CPU\n\n{env['date']} · {env['cpus']} CPUs ({env['machine']}) · torch {env['torch']} · "
            f"triton {env['triton']}\n\n"
            f"Pipeline `{ns.pipeline}` over the kernel suite for {', '.join(ns.targets)} ({n} kernels, "
            f"{report.counts()['changed']} changed, {report.counts()['failed']} failed), {ns.jobs} jobs.\n\n"
            "| measure | value |\n|---|---|\n"
            f"| Triton compile of the same kernels (serial, total) | {sum(compile_s):.1f} s |\n"
            f"| Triton compile, median per kernel | {statistics.median(compile_s):.2f} s |\n"
            f"| run-passes wall time | {wall:.1f} s |\n"
            f"| run-passes per kernel (median, in its child process) | {statistics.median(per_kernel):.2f} s |\n"
            f"| throughput | {n / wall:.2f} kernels/s |\n"
            f"| run-passes wall / Triton compile total | {wall / sum(compile_s):.2f}x |\n\n"
            "Each kernel runs in a fresh child process (isolation from compiler crashes); the per-kernel "
            "figure is measured inside that process, so the wall time also pays for starting Python and "
            "importing Triton once per kernel.\n")
    print(text)
    if ns.results:
        ns.results.mkdir(parents=True, exist_ok=True)
        stem = f"run-passes-cpu-{env['date'][:10]}"
        (ns.results / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
        (ns.results / f"{stem}.md").write_text(text)
    return 0 if report.counts()["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
