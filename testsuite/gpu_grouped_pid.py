"""On an NVIDIA GPU: what the `grouped-pid` rewrite (GROUP_SIZE_M program-id ordering) does to a
row-major GEMM, measured.

    python -m kstrata.testsuite.gpu_grouped_pid --results testsuite/results [--runs 30] [--rounds 6]

For each problem (fp16, 128x128x64 tiles, 8 warps, 3 stages; sizes whose B panels do not fit in L2),
the row-major kernel is compiled for the GPU's target, rewritten with `ttir(grouped-pid{group=G})` for
G in 4, 8, 16 (lower levels rebuilt with Triton's stages), and launched through kstrata's launcher on
the same inputs: every variant's output must be bit-identical to the original's. Then each variant
is timed against the original, interleaved (ABBA rounds of CUDA-event timings, L2 flushed before each
run, median of the round medians, spread = range of round medians). Prints a table and writes
`grouped-pid-gpu-<date>.json` and `.md` under `--results` (device and versions included).

Lives in `testsuite/` rather than `tools/` because its kernel is a test-suite kernel, which `tools/`
may not import. Needs xDSL for the rewrite (a pure-Python wheel).
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

PROBLEMS = ((4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 8192))
GROUPS = (4, 8, 16)


def _measure(shape: tuple[int, int, int], runs: int, rounds: int) -> list[dict[str, Any]]:
    import torch

    from kstrata.backends.launch import LoadedKernel
    from kstrata.backends.timing import interleaved_ab
    from kstrata.ir.target import Target
    from kstrata.passes.pipeline import parse_pipeline, run_pipeline
    from kstrata.testsuite.kernels.build import bundle_for
    from kstrata.testsuite.kernels.matmul_rowmajor import rowmajor_matmul

    major, minor = torch.cuda.get_device_capability()
    target = Target.parse(f"cuda:{major * 10 + minor}")
    kernel = rowmajor_matmul(f"rowmajor_{'x'.join(map(str, shape))}", shape, torch.float16, "ieee",
                             {"atol": 1e-2, "rtol": 1e-2}, blocks=(128, 128, 64), num_warps=8, num_stages=3)
    original = bundle_for(kernel, target)
    host = kernel.make_args(torch.Generator().manual_seed(0))
    args = {k: (v.to("cuda") if isinstance(v, torch.Tensor) else v) for k, v in host.items()}
    grid = tuple(int(g) for g in kernel.grid(args))
    base = LoadedKernel(original)

    def run(loaded: LoadedKernel) -> torch.Tensor:
        args["c_ptr"].fill_(float("nan"))
        loaded.call_by_name(grid, args)
        torch.cuda.synchronize()
        return args["c_ptr"].clone()

    expected = run(base)
    flops = 2.0 * shape[0] * shape[1] * shape[2]
    rows = []
    for group in GROUPS:
        spec = f"ttir(grouped-pid{{group={group}}})"
        row: dict[str, Any] = {"shape": list(shape), "pipeline": spec, "grid": list(grid)}
        try:
            outcome = run_pipeline(original, parse_pipeline(spec))
            if not outcome.changed:
                row["error"] = "; ".join(r.reason for r in outcome.records)
                rows.append(row)
                continue
            candidate = LoadedKernel(outcome.bundle)
            row["bitwise_equal"] = bool(torch.equal(expected.view(torch.int16), run(candidate).view(torch.int16)))
            ab = interleaved_ab(functools.partial(base.call_by_name, grid, args),
                                functools.partial(candidate.call_by_name, grid, args),
                                rounds=rounds, runs=runs, margin=10.0)  # no early stop: every variant is reported
            row.update(ab.to_json())
            row["before_us"], row["after_us"] = ab.median_a_us, ab.median_b_us
            row["speedup"] = ab.speedup
            row["tflops_before"] = flops / (ab.median_a_us * 1e-6) / 1e12
            row["tflops_after"] = flops / (ab.median_b_us * 1e-6) / 1e12
        except Exception as exc:  # a failing variant is reported, the others still run
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
        print(json.dumps({k: row.get(k) for k in ("shape", "pipeline", "bitwise_equal", "before_us", "after_us",
                                                   "speedup", "error")}), flush=True)
    return rows


def command(
    results: Annotated[Path, typer.Option("--results", help="Where the dated results files go.")],
    runs: Annotated[int, typer.Option("--runs", help="Timed runs per round.")] = 30,
    rounds: Annotated[int, typer.Option("--rounds", help="Interleaved A/B rounds per variant.")] = 6,
) -> int:
    import torch

    from kstrata.backends.timing import device_and_versions

    if not torch.cuda.is_available() or torch.version.hip is not None:
        print("gpu_grouped_pid: needs an NVIDIA GPU visible to torch; nothing was run", file=sys.stderr)
        return 2
    env = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **device_and_versions()}
    rows = [r for shape in PROBLEMS for r in _measure(shape, runs, rounds)]
    lines = [f"# grouped-pid on {env.get('device')}", "",
             f"{env['date']} · torch {env.get('torch')} · triton {env.get('triton')} · CUDA {env.get('cuda')}", "",
             "Row-major fp16 GEMM (128x128x64 tiles, 8 warps, 3 stages) against the same kernel rewritten with "
             "`grouped-pid`; interleaved rounds, L2 flushed before each run, median of round medians "
             "(range of round medians in brackets).", "",
             "| M x N x K | pipeline | bit-identical | before µs | after µs | speedup (range) | TFLOP/s before → after |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        size = "x".join(map(str, r["shape"]))
        if "error" in r:
            lines.append(f"| {size} | `{r['pipeline']}` | error: {r['error'][:120]} | | | | |")
            continue
        lo, hi = r.get("speedup_range", [r["speedup"], r["speedup"]])
        lines.append(f"| {size} | `{r['pipeline']}` | {r['bitwise_equal']} | {r['before_us']:.1f} | {r['after_us']:.1f} "
                     f"| {r['speedup']:.3f} ({lo:.3f}–{hi:.3f}) | {r['tflops_before']:.0f} → {r['tflops_after']:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    results.mkdir(parents=True, exist_ok=True)
    stem = f"grouped-pid-gpu-{env['date'][:10]}"
    (results / f"{stem}.json").write_text(json.dumps({"schema": "kstrata.grouped-pid-gpu/1", "environment": env,
                                                      "rows": rows}, indent=1, default=str) + "\n")
    (results / f"{stem}.md").write_text(text)
    return 0 if all("error" not in r and r["bitwise_equal"] for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    from kstrata.tools.console import run_command

    return run_command(command, argv, help=__doc__)


if __name__ == "__main__":
    sys.exit(main())
