"""What the project's timer measures for one kernel, against the device's own account (a GPU diagnostic).

    python -m kstrata.tools.timer_probe [--results DIR]

On 2026-12-04 the compiled-kernel benchmark timed Inductor's silu kernel of the MLP at 69.4 us on its own
(`time_gpu`, L2 flushed, the call span) and at 31.4 us inside the program (torch.profiler). This probe times
one Triton pointwise kernel (silu over fp16, the MLP's 8192 x 4096 and a 64x smaller one) every way the
project does, beside torch.profiler's device time for the same launches:

- `time_gpu` with the call span (the end event after a host synchronize) and with the device span (the end
  event right after the launch), each with and without the L2 flush;
- torch.profiler's kernel duration (mean of 20 launches), the L2 flushed before each launch (the kernel alone);
- the same right after a GEMM that writes the kernel's input (as in the MLP).

(The figures of 2026-12-04 took the median of the profiler's durations; this takes their mean.)

Prints a table and writes `timer-probe-gpu-DATE.md/.json` (device and versions) under `--results`.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any


def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def silu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m).to(tl.float32)
        tl.store(y_ptr + offs, (x / (1.0 + tl.exp(-x))).to(tl.float16), mask=m)

    return silu_kernel


def _profiled_us(launch: Any, before: Any, calls: int = 20) -> float:
    """The kernel's device time per launch over `calls` launches, `before` run first each time
    (`backends/device_profile.py`: a profiler session per call, the first uncounted)."""
    from kstrata.backends.device_profile import profile_calls

    p = profile_calls(launch, calls, before=before)
    k = p.by_name().get("silu_kernel")
    if k is None:
        raise RuntimeError(f"the profiler saw no silu_kernel: {p.reason or [x.name for x in p.kernels]}")
    return k.us_per_call / k.launches_per_call


def probe(rows: int, cols: int, block: int, warps: int) -> dict[str, Any]:
    import torch
    import triton

    from kstrata.backends.timing import time_gpu

    kern = _kernel()
    n = rows * cols
    x = torch.randn(rows, cols, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    grid = (triton.cdiv(n, block),)

    def launch() -> None:
        kern[grid](x, y, n, BLOCK=block, num_warps=warps)

    launch()
    torch.cuda.synchronize()
    out: dict[str, Any] = {"shape": [rows, cols], "dtype": "float16", "BLOCK": block, "num_warps": warps,
                           "buffer_bytes": 2 * x.numel() * x.element_size()}
    for span in ("call", "device"):
        for flush in (True, False):
            t = time_gpu(launch, runs=100, warmup=10, flush_l2_bytes=(256 << 20) if flush else 0, span=span)
            out[f"time_gpu_{span}_{'flush' if flush else 'noflush'}_us"] = t.median_us
    scratch = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    out["profiler_alone_flush_us"] = _profiled_us(launch, scratch.zero_)
    w = torch.randn(cols, cols, device="cuda", dtype=torch.float16) * 0.01
    a = torch.randn(rows, cols, device="cuda", dtype=torch.float16)

    def gemm() -> None:  # writes x, the kernel's input, as the MLP's GEMM writes the silu's
        scratch.zero_()
        torch.mm(a, w, out=x)

    out["profiler_after_gemm_us"] = _profiled_us(launch, gemm)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    import torch

    from kstrata.backends.timing import device_and_versions

    ap = argparse.ArgumentParser(prog="kstrata.tools.timer_probe", description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("testsuite/results"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: timer_probe needs an NVIDIA GPU (it compares CUDA event spans with the profiler)")
        return 2
    cases = [probe(8192, 4096, 512, 8), probe(8192, 4096, 1024, 4), probe(1024, 512, 1024, 4)]
    env = device_and_versions()
    keys = [k for k in cases[0] if k.endswith("_us")]
    lines = [f"# Timer probe — {env.get('device', '?')}, {_dt.date.today().isoformat()}", "",
             ", ".join(f"{k} {v}" for k, v in env.items() if k != "device"), "",
             "Median microseconds of one Triton silu launch (fp16). `time_gpu` spans: call (end event after a host "
             "synchronize), device (end event right after the launch). Profiler: CUPTI kernel duration.", "",
             "| shape | BLOCK | warps | MB moved | " + " | ".join(k[:-3] for k in keys) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(keys)]
    for c in cases:
        lines.append(f"| {c['shape'][0]}x{c['shape'][1]} | {c['BLOCK']} | {c['num_warps']} | "
                     f"{c['buffer_bytes'] / 1e6:.0f} | " + " | ".join(f"{c[k]:.1f}" for k in keys) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.results.mkdir(parents=True, exist_ok=True)
    stem = args.results / f"timer-probe-gpu-{_dt.date.today().isoformat()}"
    stem.with_suffix(".md").write_text(text)
    stem.with_suffix(".json").write_text(json.dumps({"environment": env, "cases": cases}, indent=1) + "\n")
    print(f"wrote {stem}.md/.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
