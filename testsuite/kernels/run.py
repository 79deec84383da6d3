"""Run suite kernels against their PyTorch references, on a GPU or under the Triton interpreter.

    python -m kstrata.testsuite.kernels.run --device cpu   [--only NAME ...] [--json] [--results DIR]
    python -m kstrata.testsuite.kernels.run --device cuda  [--only NAME ...] [--json] [--results DIR]

`--device cpu` sets TRITON_INTERPRET=1 before any kernel is imported, so every kernel runs in Triton's
interpreter on CPU tensors. Pure outputs are poisoned (NaN, or an unlikely integer pattern) before the
launch, so an element the kernel never writes is a mismatch. With `--results DIR` a dated JSON and
markdown file with the device and versions are written there.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from kstrata.backends.poison import first_mismatch, poison_

from .spec import SuiteKernel


@dataclass
class KernelRun:
    """The outcome of one suite kernel run against its reference."""

    name: str
    ok: bool
    device: str
    seconds: float
    max_abs_error: float | None = None
    #: The first output element that differs: output name, index, got, expected.
    mismatch: dict[str, Any] | None = None
    error: str | None = None


def _max_abs_error(got: torch.Tensor, want: torch.Tensor) -> float:
    d = (got.detach().cpu().to(torch.float64) - want.detach().cpu().to(torch.float64)).abs()
    d = d[~torch.isnan(d)]
    return float(d.max()) if d.numel() else 0.0


def launch(kernel: SuiteKernel, args: Mapping[str, Any]) -> None:
    """Launch `kernel` once with `args` (already on the device) as Triton's JIT would."""
    grid = kernel.grid(args)
    kernel.fn[grid](**args, **kernel.constexprs, num_warps=kernel.num_warps, num_stages=kernel.num_stages)


def run_kernel(kernel: SuiteKernel, device: str, seed: int = 0) -> KernelRun:
    """Run `kernel` once on `device` with inputs from `seed` and compare every output with the reference."""
    start = time.perf_counter()
    try:
        gen = torch.Generator().manual_seed(seed)
        host_args = kernel.make_args(gen)
        params = [p for p in kernel.param_names if p not in kernel.constexprs]
        if list(host_args) != params:
            raise ValueError(f"make_args returned {list(host_args)}, expected the runtime parameters {params}")
        snapshot = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in host_args.items()}
        expected = kernel.reference(snapshot)
        if set(expected) != set(kernel.outputs):
            raise ValueError(f"reference returned {sorted(expected)}, expected outputs {sorted(kernel.outputs)}")
        dev_args = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in host_args.items()}
        for out in kernel.outputs:
            if out not in kernel.inout:
                poison_(dev_args[out])
        launch(kernel, dev_args)
        if device != "cpu":
            torch.cuda.synchronize()
        mismatch = None
        worst = 0.0
        for out in kernel.outputs:
            worst = max(worst, _max_abs_error(dev_args[out], expected[out]))
            mismatch = mismatch or first_mismatch(out, dev_args[out], expected[out], kernel.atol, kernel.rtol)
        return KernelRun(kernel.name, mismatch is None, device, time.perf_counter() - start, worst, mismatch)
    except Exception as exc:  # a failing kernel is reported, the run goes on
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return KernelRun(kernel.name, False, device, time.perf_counter() - start, error=detail)


def _environment(device: str) -> dict[str, Any]:
    import triton

    env: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "host": platform.node(),
    }
    if device == "cpu":
        env["device"] = "CPU (Triton interpreter)"
    else:
        env["device"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    return env


def write_results(runs: list[KernelRun], env: dict[str, Any], directory: Path) -> Path:
    """Write `suite-check-<device>-<date>.json` and `.md` under `directory`; return the JSON path."""
    directory.mkdir(parents=True, exist_ok=True)
    tag = "cpu" if env["device"].startswith("CPU") else "gpu"
    stem = f"suite-check-{tag}-{env['date'][:10]}"
    payload = {"schema": "kstrata.suite-check/1", "environment": env, "runs": [asdict(r) for r in runs]}
    json_path = directory / f"{stem}.json"
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    passed = sum(r.ok for r in runs)
    lines = [
        f"# Suite check on {env['device']}",
        "",
        f"{env['date']} · torch {env['torch']} · triton {env['triton']}" + (f" · CUDA {env['cuda']}" if "cuda" in env else ""),
        "",
        f"**{passed}/{len(runs)} kernels match their PyTorch reference.**",
        "",
        "| kernel | verdict | max abs error | seconds | detail |",
        "|---|---|---|---|---|",
    ]
    for r in runs:
        detail = r.error or (json.dumps(r.mismatch) if r.mismatch else "")
        err = "" if r.max_abs_error is None else f"{r.max_abs_error:.3g}"
        lines.append(f"| {r.name} | {'ok' if r.ok else 'FAIL'} | {err} | {r.seconds:.2f} | {detail.replace('|', '/')} |")
    (directory / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return json_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--only", nargs="*", default=None, help="kernel names to run (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the runs as JSON")
    parser.add_argument("--results", type=Path, default=None, help="write dated results files here")
    ns = parser.parse_args(argv)

    if ns.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        print("error: --device cuda asked for, but torch sees no GPU", file=sys.stderr)
        return 2
    from . import all_kernels  # imported only now: TRITON_INTERPRET must be set first

    kernels = all_kernels()
    if ns.only:
        unknown = set(ns.only) - {k.name for k in kernels}
        if unknown:
            print(f"error: unknown suite kernels: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        kernels = [k for k in kernels if k.name in ns.only]
    runs = []
    for kernel in kernels:
        run = run_kernel(kernel, ns.device, ns.seed)
        runs.append(run)
        if not ns.json:
            mark = "ok  " if run.ok else "FAIL"
            print(f"{mark} {run.name:32s} {run.seconds:7.2f}s  {run.error or run.mismatch or ''}", flush=True)
    env = _environment(ns.device)
    if ns.results:
        path = write_results(runs, env, ns.results)
        if not ns.json:
            print(f"results: {path}")
    if ns.json:
        print(json.dumps({"environment": env, "runs": [asdict(r) for r in runs]}, indent=2))
    else:
        print(f"{sum(r.ok for r in runs)} passed, {sum(not r.ok for r in runs)} failed")
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
