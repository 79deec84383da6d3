"""Benchmark: `run-passes` throughput on the CPU, next to Triton's own compile time for the same kernels.

    python -m kstrata.tools.bench_run_passes [--source suite|corpus] [--results DIR] [--jobs N]
                                             [--pipeline SPEC] [--targets T ...]

`--source suite` (the default) builds the project's kernel suite for each target into a fresh cache;
`--source corpus` recompiles the Inductor corpus (`testsuite/corpus/triton` for cuda:90 and
`triton-hip` for hip:gfx942: TTIR and Triton's metadata of kernels `torch.compile` generated) from its
TTIR with the recorded compile options, so the cache holds every level down to the binary. Either way
Triton's compile of every kernel is timed, then `run-passes` runs over that cache (each kernel in its
own child process, as the command does), and the report gives kernels per second and the cost relative
to compiling the kernels in the first place. Writes `run-passes-cpu-<date>` (suite) or
`run-passes-corpus-cpu-<date>` (corpus) `.json` and `.md` with the machine and versions.
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
CORPUS_DIRS = {"cuda:90": "triton", "hip:gfx942": "triton-hip"}
#: Triton compile options kept from a corpus entry's metadata. The rest is either derived by the compiler
#: (shared memory, scratch sizes, hash) or names paths of the machine it was collected on (extern_libs).
_CORPUS_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "launch_cooperative_grid",
                   "launch_pdl", "debug", "sanitize_overflow", "waves_per_eu", "matrix_instr_nonkdim", "kpack",
                   "schedule_hint", "enable_reflect_ftz")


def build_corpus_cache(corpus: Path, targets: list[str], cache: Path) -> tuple[list[float], dict[str, str]]:
    """Compile every corpus entry of `targets` from its TTIR into the cache root `cache`.

    Returns Triton's compile time per kernel and the kernels that failed (entry -> reason). The cache
    root gets a kstrata index naming each entry's override key (the hash of the TTIR source, which is
    what Triton keys an override of an IR-file compile by), so run-passes can write overrides.
    """
    import triton
    from triton import knobs

    from kstrata.ir.target import Target
    from kstrata.ir.triton_layout import base32_key, update_index

    cache.mkdir(parents=True, exist_ok=True)
    seconds: list[float] = []
    failures: dict[str, str] = {}
    index: dict[str, dict[str, str]] = {}
    for spelling in targets:
        target = Target.parse(spelling)
        root = corpus / CORPUS_DIRS[spelling]
        for entry in sorted(d for d in root.iterdir() if d.is_dir()):
            ttir = next(entry.glob("*.ttir"))
            meta = json.loads((entry / f"{ttir.stem}.json").read_text())
            options = {k: meta[k] for k in _CORPUS_OPTIONS if meta.get(k) is not None}
            with knobs.cache.scope():
                knobs.cache.dir = str(cache)
                start = time.perf_counter()
                try:
                    compiled = triton.compile(str(ttir), target=target.to_triton(), options=options)
                except Exception as exc:  # a kernel that does not build here is reported, not fatal
                    failures[f"{spelling}/{entry.name}"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    continue
                seconds.append(time.perf_counter() - start)
            # the source Triton made of the file: its hash is the override key (see triton.compile)
            index[base32_key(compiled.hash)] = {"override_key": base32_key(compiled.src.hash()), "name": ttir.stem, "target": spelling,
                                                "source": str(ttir)}
    update_index(cache, index)
    return seconds, failures


def build_suite_cache(targets: list[str], cache: Path) -> list[float]:
    """Build the kernel suite for `targets` into `cache`; returns Triton's compile time per kernel."""
    from kstrata.ir.target import Target
    from kstrata.tools.suite import load_suite

    suite = load_suite()
    all_kernels, build_suite, bundle_for = suite.all_kernels, suite.build_suite, suite.bundle_for

    compile_s: list[float] = []
    for spelling in targets:
        target = Target.parse(spelling)
        for kernel in all_kernels():
            if target.backend in kernel.unsupported_backends:
                continue
            start = time.perf_counter()
            bundle_for(kernel, target, cache)
            compile_s.append(time.perf_counter() - start)
    for spelling in targets:  # writes the override-key index (the entries are cache hits by now)
        build_suite(Target.parse(spelling), cache)
    return compile_s


def main(argv: list[str] | None = None) -> int:
    import torch
    import triton

    from kstrata.agents.run_passes import run_passes

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--pipeline", default=DEFAULT_PIPELINE)
    parser.add_argument("--targets", nargs="*", default=["cuda:90", "hip:gfx942"])
    parser.add_argument("--source", choices=("suite", "corpus"), default="suite")
    parser.add_argument("--corpus", type=Path, default=Path(__file__).resolve().parent.parent / "testsuite" / "corpus")
    ns = parser.parse_args(argv)

    load_before = os.getloadavg()  # other work on the machine skews every figure below: say how much there was
    with tempfile.TemporaryDirectory(prefix="kstrata-bench-") as tmp:
        cache = Path(tmp) / "cache"
        if ns.source == "corpus":
            compile_s, compile_failures = build_corpus_cache(ns.corpus, ns.targets, cache)
        else:
            compile_s, compile_failures = build_suite_cache(ns.targets, cache), {}
        start = time.perf_counter()
        # a fresh engine cache: every kernel is built (tools/bench_engine.py measures the warm case)
        report = run_passes(cache, ns.pipeline, Path(tmp) / "out", jobs=ns.jobs, engine_cache=Path(tmp) / "engine")
        wall = time.perf_counter() - start
    per_kernel = [k["seconds"] for k in report.kernels]
    n = len(report.kernels)
    env = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "machine": platform.machine(),
           "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
           "triton": triton.__version__, "host": platform.node(),
           "load_average_1m": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)}}
    result: dict[str, Any] = {
        "schema": "kstrata.bench-run-passes/1", "environment": env, "pipeline": ns.pipeline, "jobs": ns.jobs,
        "source": ns.source, "targets": ns.targets, "kernels": n, "counts": report.counts(),
        "compile_failures": compile_failures,
        "run_passes_failures": {k["entry"]: k["error"] for k in report.kernels if k["status"] == "failed"},
        "triton_compile_s": {"total": sum(compile_s), "median": statistics.median(compile_s)},
        "run_passes_s": {"wall": wall, "per_kernel_median": statistics.median(per_kernel),
                         "per_kernel_total": sum(per_kernel)},
        "kernels_per_second": n / wall,
        "overhead_vs_compile": wall / sum(compile_s),
        # where a kernel's time goes: the passes themselves (with their rebuilds and verifiers) vs the rest
        # (loading, resource reports before and after, static checks, writing the override)
        "per_kernel": [{"name": k["name"], "target": k["target"], "status": k["status"], "seconds": k["seconds"],
                        "pass_seconds": sum(p.get("seconds", 0.0) for p in k["passes"])} for k in report.kernels],
    }
    pass_s = [k["pass_seconds"] for k in result["per_kernel"]]
    what = ("the Inductor corpus (recompiled from its TTIR)" if ns.source == "corpus" else "the kernel suite")
    failed = result["run_passes_failures"]
    notes = "".join(f"\n- Triton could not compile {k}: {v}" for k, v in compile_failures.items()) + \
        "".join(f"\n- run-passes failed on {k}: {v}" for k, v in failed.items())
    text = (f"# run-passes on the CPU\n\n{env['date']} · {env['cpus']} CPUs ({env['machine']}) · torch {env['torch']} · "
            f"triton {env['triton']} · load average (1 min) {env['load_average_1m']['before']} before, "
            f"{env['load_average_1m']['after']} after\n\n"
            f"Pipeline `{ns.pipeline}` over {what} for {', '.join(ns.targets)} ({n} kernels, "
            f"{report.counts()['changed']} changed, {report.counts()['failed']} failed), {ns.jobs} jobs.\n\n"
            "| measure | value |\n|---|---|\n"
            f"| Triton compile of the same kernels (serial, total{', from TTIR' if ns.source == 'corpus' else ''}) | "
            f"{sum(compile_s):.1f} s |\n"
            f"| Triton compile, median per kernel | {statistics.median(compile_s):.2f} s |\n"
            f"| run-passes wall time | {wall:.1f} s |\n"
            f"| run-passes per kernel (median, in its child process) | {statistics.median(per_kernel):.2f} s |\n"
            f"| of which the pipeline's passes, rebuilds and verifiers (median) | {statistics.median(pass_s):.2f} s |\n"
            f"| throughput | {n / wall:.2f} kernels/s |\n"
            f"| run-passes wall / Triton compile total | {wall / sum(compile_s):.2f}x |\n\n"
            "Each kernel runs in a fresh child process (isolation from compiler crashes); the per-kernel "
            "figure is measured inside that process, so the wall time also pays for starting Python and "
            "importing Triton once per kernel.\n" + (f"\nFailures:{notes}\n" if notes else ""))
    print(text)
    if ns.results:
        ns.results.mkdir(parents=True, exist_ok=True)
        stem = f"run-passes{'-corpus' if ns.source == 'corpus' else ''}-cpu-{env['date'][:10]}"
        (ns.results / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
        (ns.results / f"{stem}.md").write_text(text)
    return 0 if report.counts()["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
