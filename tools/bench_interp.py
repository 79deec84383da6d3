"""Benchmark: the Triton-IR interpreter (`kstrata.ir.interp`) on every suite kernel, at TTIR and TTGIR.

    python -m kstrata.tools.bench_interp [--cache-dir DIR] [--repeat N] [--only NAME ...] [--json]

Builds the suite for cuda:90 and hip:gfx942 (into `--cache-dir`, reused when it already holds the
build), then runs each kernel on its own inputs at TTIR (cuda:90) and TTGIR (cuda:90, hip:gfx942),
checks the outputs against the PyTorch reference and reports the median wall time of `--repeat` runs,
with the number of programs and of output elements.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

LEVELS = (("cuda:90", "ttir"), ("cuda:90", "ttgir"), ("hip:gfx942", "ttgir"))


def bench(cache: Path, repeat: int, only: list[str] | None) -> list[dict[str, Any]]:
    import torch

    from kstrata.backends.poison import first_mismatch, poison_
    from kstrata.ir.interp import Buffer, run_bundle
    from kstrata.ir.target import Target
    from kstrata.ir.triton_layout import load_cache_entry, read_index
    from kstrata.tools.suite import load_suite

    suite = load_suite()
    all_kernels, build_suite = suite.all_kernels, suite.build_suite

    kernels = [k for k in all_kernels() if not only or k.name in only]
    index = read_index(cache) if cache.exists() else {}
    built = {(rec["suite_kernel"], rec["target"]) for rec in index.values()}
    for spelling in {t for t, _ in LEVELS}:
        todo = [k for k in kernels if (k.name, spelling) not in built]
        if todo:
            build_suite(Target.parse(spelling), cache, todo)
    index = read_index(cache)
    bundles = {(rec["suite_kernel"], rec["target"]): load_cache_entry(cache / key, index) for key, rec in index.items()}
    rows: list[dict[str, Any]] = []
    for kernel in kernels:
        for target, level in LEVELS:
            bundle = bundles.get((kernel.name, target))
            if bundle is None:
                continue
            times: list[float] = []
            ok = True
            grid: tuple[int, ...] = ()
            for _ in range(repeat):
                args = kernel.make_args(torch.Generator().manual_seed(0))
                expected = kernel.reference({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in args.items()})
                for out in kernel.outputs:
                    if out not in kernel.inout:
                        poison_(args[out])
                params = {p.name for p in bundle.params}
                values = {k: (Buffer.from_torch(v) if isinstance(v, torch.Tensor) else v)
                          for k, v in args.items() if k in params}
                grid = tuple(kernel.grid(args))
                start = time.perf_counter()
                run_bundle(bundle, level, grid + (1,) * (3 - len(grid)), values)
                times.append(time.perf_counter() - start)
                ok = ok and all(first_mismatch(o, args[o], expected[o], kernel.atol, kernel.rtol) is None
                                for o in kernel.outputs)
            programs = 1
            for g in grid:
                programs *= g
            rows.append({"kernel": kernel.name, "target": target, "level": level, "ok": ok,
                         "seconds": statistics.median(times), "programs": programs,
                         "output_elements": sum(int(args[o].numel()) for o in kernel.outputs)})
    return rows


def main(argv: list[str] | None = None) -> int:
    from kstrata.tools.console import run_command

    return run_command(command, argv, help=__doc__)


def command(
    cache_dir: Annotated[Path | None, typer.Option("--cache-dir", help="Suite build to reuse (default: a fresh one).")] = None,
    repeat: Annotated[int, typer.Option("--repeat", help="Runs per kernel and level (the median is reported).")] = 3,
    only: Annotated[list[str] | None, typer.Option("--only", help="Only this suite kernel (repeatable).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        rows = bench(cache_dir or Path(tmp), repeat, only)
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        print("| kernel | target | level | ok | programs | output elements | seconds |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['kernel']} | {r['target']} | {r['level']} | {'ok' if r['ok'] else 'FAIL'} | {r['programs']} "
                  f"| {r['output_elements']} | {r['seconds']:.3f} |")
        total = sum(r["seconds"] for r in rows)
        print(f"\n{sum(r['ok'] for r in rows)}/{len(rows)} match the reference; {total:.1f} s in all (medians)")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
