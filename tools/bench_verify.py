"""Benchmark: how long `kstrata verify` takes on the CPU for GPU-sized launches.

    python -m kstrata.tools.bench_verify [--results DIR] [--seeds N] [--only NAME ...] [--json]

Three workloads, each a suite kernel at a GPU-sized launch: a 1M-element elementwise add, a softmax
over 4096 rows, and a 1024^3 fp16 matmul. The candidate is the kernel after `ttir(load-eviction)` (a
sound TTIR rewrite: only the eviction hints of loads change, so TTIR and TTGIR differ and the
interpreter runs on both levels). Reported per workload: the whole `verify` on the CPU (static checks and
the interpreter on every input set, each run in a child process), and one interpreter run of the
original's TTIR and TTGIR in this process. With `--results DIR`, a dated JSON and markdown file with the
machine and versions is written there.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import torch
import typer


def _workloads() -> dict[str, Callable[[], Any]]:
    import importlib

    from kstrata.tools.suite import load_suite

    get_kernel = load_suite().get_kernel
    # the module of a suite kernel, for its input helpers (untyped: the suite's kernel modules are not type-checked)
    matmul_module: Any = importlib.import_module(get_kernel("matmul_fp16").fn.fn.__module__)

    def elementwise() -> Any:
        n = 1 << 20

        def make(gen: torch.Generator) -> dict[str, Any]:
            return {"x_ptr": torch.randn(n, generator=gen), "y_ptr": torch.randn(n, generator=gen),
                    "out_ptr": torch.empty(n), "n": n}

        return dataclasses.replace(get_kernel("vector_add"), make_args=make)

    def softmax() -> Any:
        rows, cols = 4096, 500

        def make(gen: torch.Generator) -> dict[str, Any]:
            return {"x_ptr": torch.randn(rows, cols, generator=gen), "out_ptr": torch.empty(rows, cols),
                    "n_cols": cols, "row_stride": cols}

        return dataclasses.replace(get_kernel("softmax_onepass"), make_args=make)

    def matmul() -> Any:
        unit = ("stride_ak", "stride_bn", "stride_cn")
        make = matmul_module.unit_strides(
            matmul_module._matmul_args((1024, 1024, 1024), torch.float16, torch.float16, False), unit)
        return dataclasses.replace(get_kernel("matmul_fp16"), make_args=make)

    return {"elementwise-1M": elementwise, "softmax-4096-rows": softmax, "matmul-1024^3-fp16": matmul}


def bench_one(name: str, make_kernel: Callable[[], Any], seeds: int, workdir: Path) -> dict[str, Any]:
    from kstrata.backends.dynamic import interpret_launch
    from kstrata.backends.replay import replay_args
    from kstrata.backends.verify import verify
    from kstrata.ir.launch import TensorArg
    from kstrata.ir.target import Target
    from kstrata.passes.pipeline import parse_pipeline, run_pipeline
    from kstrata.tools.suite import load_suite

    suite = load_suite()
    bundle_for, suite_launch_record = suite.bundle_for, suite.suite_launch_record

    kernel = make_kernel()
    target = Target.parse("cuda:90")
    original = bundle_for(kernel, target)
    candidate = run_pipeline(original, parse_pipeline("ttir(load-eviction)")).bundle
    record = suite_launch_record(kernel, str(target), snapshot_dir=workdir / name)
    row: dict[str, Any] = {"workload": name, "kernel": kernel.name, "grid": list(record.grid),
                           "tensor_elements": sum(a.needed_numel for a in record.args if isinstance(a, TensorArg))}
    for level in ("ttir", "ttgir"):
        args = replay_args(record, "cpu", 0)
        start = time.perf_counter()
        interpret_launch(original, level, record, args)
        row[f"interpret_{level}_s"] = round(time.perf_counter() - start, 3)
    start = time.perf_counter()
    report = verify(original, candidate, record, seeds=seeds, device="cpu", timeout=1800.0, launch_dir=workdir / name)
    row["verify_s"] = round(time.perf_counter() - start, 2)
    row["verify_ok"] = report.ok
    row["interpreter_checks"] = sum(1 for c in report.checks if c.name.startswith("interpreter"))
    row["checks"] = [dataclasses.asdict(c) for c in report.checks]
    return row


def _write_results(rows: list[dict[str, Any]], results: Path, seeds: int) -> Path:
    import numpy
    import triton
    import xdsl

    date = _dt.date.today().isoformat()
    meta = {"date": date, "machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "triton": triton.__version__, "numpy": numpy.__version__,
            "xdsl": str(getattr(xdsl, "__version__", "?")), "seeds": seeds,
            "load_average": [round(x, 2) for x in os.getloadavg()]}
    results.mkdir(parents=True, exist_ok=True)
    base = results / f"verify-cpu-{date}"
    base.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = [f"# kstrata verify on the CPU — {date}", "",
             f"Machine: {meta['cpus']} CPUs ({meta['machine']}), Python {meta['python']}, torch {meta['torch']}, "
             f"Triton {meta['triton']}, numpy {meta['numpy']}, xDSL {meta['xdsl']}; load average at the end "
             f"{meta['load_average']} (other jobs on the same cores inflate the times).", "",
             f"Command: `python -m kstrata.tools.bench_verify --seeds {seeds} --results {results}`. Candidate: "
             "`ttir(load-eviction)` (TTIR and TTGIR differ, so the interpreter runs both levels on every input "
             "set: the suite inputs as a recorded snapshot, the random seeds and the edge-value set).", "",
             "| workload | grid | tensor elements | interpret TTIR (s) | interpret TTGIR (s) | interpreter checks "
             "| whole verify (s) | verdict |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['workload']} | | | | | | | error: {r['error']} |")
            continue
        lines.append(f"| {r['workload']} | {r['grid']} | {r['tensor_elements']} | {r['interpret_ttir_s']} | "
                     f"{r['interpret_ttgir_s']} | {r['interpreter_checks']} | {r['verify_s']} | "
                     f"{'equivalent' if r['verify_ok'] else 'rejected'} |")
    base.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return base.with_suffix(".md")


def main(argv: list[str] | None = None) -> int:
    from kstrata.tools.console import run_command

    return run_command(command, argv, help=__doc__)


def command(
    results: Annotated[Path | None, typer.Option("--results", help="Write dated results here.")] = None,
    seeds: Annotated[int, typer.Option("--seeds", help="Random input sets per verify.")] = 1,
    only: Annotated[list[str] | None, typer.Option("--only", help="Only this workload (repeatable).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> int:
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory(prefix="kstrata-bench-verify-") as tmp:
        for name, make in _workloads().items():
            if only and name not in only:
                continue
            print(f"{name} ...", file=sys.stderr, flush=True)
            try:
                row = bench_one(name, make, seeds, Path(tmp))
            except Exception as exc:  # one failing workload is reported, the others still run
                row = {"workload": name, "error": f"{type(exc).__name__}: {exc}"}
            rows.append(row)
            print(f"  {json.dumps({k: v for k, v in row.items() if k != 'checks'})}", file=sys.stderr, flush=True)
    if as_json:
        print(json.dumps(rows, indent=1))
    if results:
        print(f"results: {_write_results(rows, results, seeds)}", file=sys.stderr)
    return 0 if all("error" not in r and r["verify_ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
