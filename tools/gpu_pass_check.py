"""On an NVIDIA GPU: the passes' execution twins and the run-passes proof on a real program.

    python -m kstrata.tools.gpu_pass_check --results DIR [--work DIR] [--skip-program]

Part 1, execution twins: for each NVIDIA-side pass and a set of suite kernels, compile the kernel for
cuda:90, run the pass pipeline (lower levels rebuilt), and launch the original and the rewritten binary
through Triton's launcher on the same inputs (outputs poisoned first). Exact passes must give
bit-identical outputs; passes with a declared tolerance are compared with the kernel's reference
tolerance. Both binaries are timed (CUDA events, L2 flushed before each run, median of 100).

Part 2, the proof on a real program: a child process runs a `torch.compile`d model and some suite
kernels with a fresh Triton cache and `TRITON_KERNEL_DUMP=1`; `run-passes` rewrites that cache into an
override directory; a second child process runs the same program with `TRITON_KERNEL_OVERRIDE=1` and a
fresh cache. The outputs must be bit-identical, the overrides must have been used (Triton says so), and
per-kernel device times before and after are read from the PyTorch profiler (CUPTI durations, mean over
the iterations; L2 is not flushed there).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

TWIN_KERNELS = ("vector_add", "gelu_tanh_bias", "softmax_online", "layernorm_fwd", "rmsnorm_fwd_bf16",
                "row_sum_bf16", "transpose_2d", "bmm_fp16_bt", "matmul_fp16", "flash_attention_fwd",
                "conv2d_nchw_fp16", "int8_weight_matmul_fp16", "matmul_fp32_tf32", "matmul_fp32_ieee")
TWIN_PIPELINES = (
    "ttir(dot-precision)", "ttir(load-eviction)", "ttgir(num-warps{n=8})", "ttgir(num-stages{n=4})", "llir(noalias-args{assume=true})", "llir(flush-denormals)",
    "ptx(ld-nc{assume_noalias=true})", "ptx(cache-hints)", "ptx(ptxas-options{opt_level=1})",
    "ptx(max-registers{n=64})", "ptx(ptx-reorder)", "ptx(ptx-reorder{strategy=sink-stores})", "ptx(redundant-cvt)",
    "ptx(ptx-predicate)",
)
PROOF_PIPELINE = "llir(noalias-args{assume=true}),ptx(ld-nc{assume_noalias=true},cache-hints)"


def _launch_and_time(bundle: Any, kernel: Any, host: dict[str, Any], grid: tuple[int, ...],
                     runs: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Launch `bundle`'s binary on fresh copies of `host` (outputs poisoned), then time it."""
    import torch

    from kstrata.backends.launch import LoadedKernel
    from kstrata.backends.poison import poison_
    from kstrata.backends.timing import time_gpu

    loaded = LoadedKernel(bundle)
    args = {k: (v.to("cuda") if isinstance(v, torch.Tensor) else v) for k, v in host.items()}
    for out in kernel.outputs:
        if out not in kernel.inout:
            poison_(args[out])
    loaded.call_by_name(grid, args)
    torch.cuda.synchronize()
    outs = {o: args[o].clone() for o in kernel.outputs}

    def once() -> None:
        loaded.call_by_name(grid, args)

    return outs, time_gpu(once, runs=runs, span="device").to_json()


def _twins(runs: int, pipelines: tuple[str, ...] = TWIN_PIPELINES) -> list[dict[str, Any]]:
    import torch

    from kstrata.backends.poison import first_mismatch
    from kstrata.ir.target import Target
    from kstrata.passes.pipeline import parse_pipeline, run_pipeline
    from kstrata.tools.suite import load_suite

    get_kernel, bundle_for = load_suite().get_kernel, load_suite().bundle_for

    rows = []
    for name in TWIN_KERNELS:
        kernel = get_kernel(name)
        original = bundle_for(kernel, Target.parse("cuda:90"))
        host = kernel.make_args(torch.Generator().manual_seed(0))
        expected = kernel.reference({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in host.items()})
        grid = kernel.grid(host)

        base_out, base_t = _launch_and_time(original, kernel, host, grid, runs)
        for spec in pipelines:
            row: dict[str, Any] = {"kernel": name, "pipeline": spec}
            try:
                outcome = run_pipeline(original, parse_pipeline(spec))
                row["status"] = outcome.records[0].status
                row["reason"] = outcome.records[0].reason
                if not outcome.changed:
                    rows.append(row)
                    continue
                new_out, new_t = _launch_and_time(outcome.bundle, kernel, host, grid, runs)
                declared = parse_pipeline(spec).passes[0][1].declared_tolerance()
                tolerance = declared.spelling() if declared else None
                bitwise = all(torch.equal(new_out[o].view(torch.uint8), base_out[o].view(torch.uint8))
                              for o in kernel.outputs)
                mismatch = None
                for o in kernel.outputs:
                    mismatch = mismatch or first_mismatch(o, new_out[o], expected[o], kernel.atol, kernel.rtol)
                row.update(bitwise_equal=bitwise, matches_reference=mismatch is None, mismatch=mismatch,
                           declared_tolerance=tolerance, ok=bitwise if tolerance is None else mismatch is None,
                           before_us=base_t, after_us=new_t, speedup=base_t["median_us"] / new_t["median_us"],
                           binary_changed=outcome.bundle.level("cubin") != original.level("cubin"))
            except Exception as exc:  # a failing combination is reported, the run goes on
                row.update(status="error", ok=False, error=f"{type(exc).__name__}: {exc}")
            rows.append(row)
            print(json.dumps({k: row.get(k) for k in ("kernel", "pipeline", "status", "ok", "speedup")}), flush=True)
    return rows


_PROGRAM = r'''
import json, os, sys, torch, torch.nn as nn
torch.manual_seed(0)
from kstrata.tools.suite import load_suite
get_kernel, launch = load_suite().get_kernel, load_suite().launch

class Block(nn.Module):
    def __init__(self, d=1024):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
    def forward(self, x):
        h = self.norm(x)
        return x + self.down(torch.nn.functional.gelu(self.up(h)) * torch.sigmoid(h).repeat(1, 4))

model = Block().cuda().half()
x = torch.randn(4096, 1024, device="cuda", dtype=torch.half)
compiled = torch.compile(model)
with torch.no_grad():
    outs = {"model": compiled(x)}
    for name in ("vector_add", "softmax_online", "layernorm_fwd", "rmsnorm_fwd_bf16"):
        k = get_kernel(name)
        args = {a: (v.cuda() if isinstance(v, torch.Tensor) else v) for a, v in k.make_args(torch.Generator().manual_seed(0)).items()}
        launch(k, args)
        outs[name] = args[k.outputs[0]]
    torch.cuda.synchronize()
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            compiled(x)
        torch.cuda.synchronize()
times = {}
for e in prof.key_averages():
    total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
    if total > 0 and (e.key.startswith("triton") or "_kernel" in e.key):
        times[e.key] = {"mean_us": total / max(e.count, 1), "count": e.count}
torch.save({k: v.cpu() for k, v in outs.items()}, sys.argv[1])
print(json.dumps({"kernel_times": times}))
'''


def _program(out: Path, env: dict[str, str], log: Path) -> dict[str, Any]:
    script = out.with_suffix(".py")
    script.write_text(_PROGRAM)
    proc = subprocess.run([sys.executable, str(script), str(out)], env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"program failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {"times": json.loads(proc.stdout.strip().splitlines()[-1])["kernel_times"],
            "overrides_used": proc.stdout.count("Overriding kernel with file")}


def _proof(work: Path, results: Path) -> dict[str, Any]:
    import torch

    from kstrata.agents.run_passes import run_passes

    base = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "TORCHINDUCTOR_"))}
    fresh = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
    env_a = {**base, **fresh, "TRITON_CACHE_DIR": str(work / "cache-a"), "TRITON_KERNEL_DUMP": "1",
             "TRITON_DUMP_DIR": str(work / "dump"), "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-a")}
    before = _program(work / "out-a.pt", env_a, results / "program-before.log")
    report = run_passes(work / "cache-a", PROOF_PIPELINE, work / "overrides", jobs=8, dump_dir=work / "dump")
    env_c = {**base, **fresh, "TRITON_CACHE_DIR": str(work / "cache-c"), "TRITON_KERNEL_OVERRIDE": "1",
             "TRITON_OVERRIDE_DIR": str(work / "overrides" / "cuda-90"),
             "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor-c")}
    after = _program(work / "out-c.pt", env_c, results / "program-after.log")
    a, c = torch.load(work / "out-a.pt"), torch.load(work / "out-c.pt")
    equal = {k: bool(torch.equal(a[k].view(torch.uint8), c[k].view(torch.uint8))) for k in a}
    per_kernel = {}
    for name, t in before["times"].items():
        if name in after["times"]:
            per_kernel[name] = {"before_us": t["mean_us"], "after_us": after["times"][name]["mean_us"],
                                "speedup": t["mean_us"] / after["times"][name]["mean_us"]}
    return {"pipeline": PROOF_PIPELINE, "run_passes": report.counts(), "run_passes_seconds": report.seconds,
            "overrides_used": after["overrides_used"], "outputs_bitwise_equal": equal,
            "per_kernel_profiler": per_kernel,
            "kernels": [{k: v for k, v in x.items() if k in ("name", "status", "error", "resources_before",
                                                            "resources_after")} for x in report.kernels]}


def main(argv: list[str] | None = None) -> int:
    from kstrata.tools.console import run_command

    return run_command(command, argv, help=__doc__)


def command(
    results: Annotated[Path, typer.Option("--results", help="Where the dated results files go.")],
    work: Annotated[Path | None, typer.Option("--work", help="Work directory for the program proof.")] = None,
    runs: Annotated[int, typer.Option("--runs", help="Timed runs per binary.")] = 100,
    skip_program: Annotated[bool, typer.Option("--skip-program", help="Only the execution twins.")] = False,
    skip_twins: Annotated[bool, typer.Option("--skip-twins", help="Only the program proof.")] = False,
    pipelines: Annotated[list[str] | None, typer.Option("--pipeline", help="Only this twin pipeline (repeatable).")] = None,
) -> int:
    import torch
    import triton

    if not torch.cuda.is_available():
        print("error: needs an NVIDIA GPU", file=sys.stderr)
        return 2
    results.mkdir(parents=True, exist_ok=True)
    env = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "python": platform.python_version()}
    payload: dict[str, Any] = {"schema": "kstrata.pass-gpu-check/1", "environment": env}
    if not skip_twins:
        payload["twins"] = _twins(runs, tuple(pipelines) if pipelines else TWIN_PIPELINES)
    if not skip_program:
        work = work or Path(tempfile.mkdtemp(prefix="kstrata-proof-"))
        try:
            payload["proof"] = _proof(work, results)
        except Exception as exc:
            payload["proof"] = {"error": f"{type(exc).__name__}: {exc}"}
    stem = f"passes-gpu-{env['date'][:10]}" + ("-" + "-".join(p.split("(")[1].split(")")[0].split("{")[0]
                                                                for p in pipelines) if pipelines else "")
    (results / f"{stem}.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    lines = [f"# Passes on {env['device']}", "", f"{env['date']} · torch {env['torch']} · triton {env['triton']} · "
             f"CUDA {env['cuda']}", "", "## Execution twins (original vs rewritten binary, same inputs)", "",
             "| kernel | pipeline | status | outputs | before µs | after µs | speedup |", "|---|---|---|---|---|---|---|"]
    for r in payload.get("twins", []):
        if r.get("status") != "changed":
            lines.append(f"| {r['kernel']} | `{r['pipeline']}` | {r.get('status')} {r.get('reason') or r.get('error', '')} | | | | |")
            continue
        verdict = ("bit-identical" if r["bitwise_equal"] else
                   f"within declared tolerance: {r['matches_reference']}")
        lines.append(f"| {r['kernel']} | `{r['pipeline']}` | changed | {verdict} | {r['before_us']['median_us']:.2f} "
                     f"| {r['after_us']['median_us']:.2f} | {r['speedup']:.3f} |")
    proof = payload.get("proof")
    if proof:
        lines += ["", "## run-passes on a real program", ""]
        if "error" in proof:
            lines.append(f"error: {proof['error']}")
        else:
            lines += [f"Pipeline `{proof['pipeline']}`: {proof['run_passes']} in {proof['run_passes_seconds']:.1f} s; "
                      f"Triton reported {proof['overrides_used']} overridden kernels in the second run.", "",
                      f"Outputs bit-identical: {proof['outputs_bitwise_equal']}", "",
                      "| kernel (profiler) | before µs | after µs | speedup |", "|---|---|---|---|"]
            for name, t in sorted(proof["per_kernel_profiler"].items()):
                lines.append(f"| {name} | {t['before_us']:.2f} | {t['after_us']:.2f} | {t['speedup']:.3f} |")
    (results / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    ok = all(r.get("ok", True) for r in payload.get("twins", []))
    if proof and "error" not in proof:
        ok = ok and all(proof["outputs_bitwise_equal"].values()) and proof["overrides_used"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
