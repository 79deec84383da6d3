"""On an NVIDIA GPU: launch cubins built by kstrata's backend — the original and an assembly-patched
one — with the arguments Triton would pass, compare their outputs, and time both.

    python -m kstrata.tools.gpu_asm_check [--results DIR] [--runs N]

For each kernel: compile it for cuda:90 (Triton's cubin), rebuild the cubin from its PTX with kstrata
(`assemble_ptx`), apply an `AsmPatch` that turns every `ld.global` into `ld.global.nc` (read-only data
path; sound here because none of these kernels reads memory it writes), rebuild, and launch all three
binaries through Triton's launcher on the same inputs. Outputs are poisoned before each launch; the
rebuilt and patched outputs must equal Triton's bit for bit, and Triton's must match the PyTorch
reference. Times are medians of CUDA-event timings with L2 flushed before every run.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

#: Kernels whose loads are all from buffers the kernel never writes, and that load with `ld.global`
#: (Hopper matmuls load through cp.async / TMA instead, which this patch does not touch).
READ_ONLY_KERNELS = (
    "vector_add", "gelu_tanh_bias", "softmax_online", "layernorm_fwd", "rmsnorm_fwd_bf16", "row_sum_bf16",
    "embedding_gather_fp16", "transpose_2d", "bmm_fp16_bt", "flash_attention_fwd", "conv2d_nchw_fp16",
    "int8_weight_matmul_fp16",
)


def _check_kernel(name: str, runs: int) -> dict[str, Any]:
    import torch

    from kstrata.backends.asm import patch_bundle
    from kstrata.backends.launch import LoadedKernel
    from kstrata.backends.nvidia import compare_cubins, rebuild_cubin
    from kstrata.backends.patch import make_patch
    from kstrata.backends.poison import first_mismatch, poison_
    from kstrata.backends.timing import time_gpu
    from kstrata.ir.bundle import KernelBundle
    from kstrata.ir.target import Target
    from kstrata.tools.suite import load_suite

    get_kernel, bundle_for = load_suite().get_kernel, load_suite().bundle_for

    kernel = get_kernel(name)
    original = bundle_for(kernel, Target.parse("cuda:90"))
    rebuilt = rebuild_cubin(original)
    same = compare_cubins(original.level("cubin"), rebuilt.cubin)  # type: ignore[arg-type]
    rebuilt_bundle = KernelBundle(original.name, original.target, {**original.levels, "cubin": rebuilt.cubin},
                                  dict(original.metadata))
    ptx = original.text("ptx")
    patch = make_patch("ptx", ptx, ptx.replace("ld.global.", "ld.global.nc.").replace(".nc.nc.", ".nc."),
                       original.name, "loads through the read-only (non-coherent) data path")
    patched = patch_bundle(original, patch)

    gen = torch.Generator().manual_seed(0)
    host = kernel.make_args(gen)
    expected = kernel.reference({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in host.items()})
    grid = kernel.grid(host)
    results: dict[str, Any] = {"kernel": name, "triton_name": original.name, "grid": list(grid),
                               "rebuild": same.describe(), "hunks": len(patch.hunks),
                               "patch_checks": patched.checks,
                               "registers": {"before": patched.resources_before.get("registers"),
                                             "after": patched.resources_after.get("registers")}}
    outputs: dict[str, dict[str, torch.Tensor]] = {}
    timings: dict[str, Any] = {}
    for label, bundle in (("triton", original), ("rebuilt", rebuilt_bundle), ("patched", patched.bundle)):
        loaded = LoadedKernel(bundle)
        args = {k: (v.to("cuda") if isinstance(v, torch.Tensor) else v) for k, v in host.items()}
        for out in kernel.outputs:
            if out not in kernel.inout:
                poison_(args[out])
        loaded.call_by_name(grid, args)
        torch.cuda.synchronize()
        outputs[label] = {o: args[o].clone() for o in kernel.outputs}
        def once(loaded: LoadedKernel = loaded, args: dict[str, Any] = args) -> None:
            loaded.call_by_name(grid, args)

        timings[label] = time_gpu(once, runs=runs, span="device").to_json()
    ref_mismatch = None
    for o in kernel.outputs:
        ref_mismatch = ref_mismatch or first_mismatch(o, outputs["triton"][o], expected[o], kernel.atol, kernel.rtol)
    results["matches_reference"] = ref_mismatch is None
    results["reference_mismatch"] = ref_mismatch
    for label in ("rebuilt", "patched"):
        equal = all(torch.equal(outputs[label][o].view(torch.uint8), outputs["triton"][o].view(torch.uint8))
                    for o in kernel.outputs)
        results[f"{label}_bitwise_equal"] = equal
    results["timing_us"] = timings
    results["speedup_patched"] = timings["triton"]["median_us"] / timings["patched"]["median_us"]
    return results


def main(argv: list[str] | None = None) -> int:
    from kstrata.tools.console import run_command

    return run_command(command, argv, help=__doc__)


def command(
    results: Annotated[Path | None, typer.Option("--results", help="Write dated results here.")] = None,
    runs: Annotated[int, typer.Option("--runs", help="Timed runs per binary.")] = 100,
    only: Annotated[list[str] | None, typer.Option("--only", help="Only this suite kernel (repeatable).")] = None,
) -> int:
    import torch
    import triton

    if not torch.cuda.is_available():
        print("error: needs an NVIDIA GPU", file=sys.stderr)
        return 2
    env = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
           "python": platform.python_version()}
    rows = []
    for name in only or READ_ONLY_KERNELS:
        try:
            rows.append(_check_kernel(name, runs))
        except Exception as exc:  # a failing kernel is reported, the run goes on
            rows.append({"kernel": name, "error": f"{type(exc).__name__}: {exc}"})
        r = rows[-1]
        if "error" in r:
            print(f"FAIL {name:28s} {r['error'][:200]}", flush=True)
        else:
            t = r["timing_us"]
            print(f"{'ok  ' if r['matches_reference'] and r['rebuilt_bitwise_equal'] and r['patched_bitwise_equal'] else 'FAIL'} "
                  f"{name:28s} triton {t['triton']['median_us']:8.2f}us  rebuilt {t['rebuilt']['median_us']:8.2f}us  "
                  f"patched {t['patched']['median_us']:8.2f}us  x{r['speedup_patched']:.3f}  regs "
                  f"{r['registers']['before']}->{r['registers']['after']}  rebuild: {r['rebuild'][:40]}", flush=True)
    ok = all("error" not in r and r["matches_reference"] and r["rebuilt_bitwise_equal"] and r["patched_bitwise_equal"]
             for r in rows)
    if results:
        results.mkdir(parents=True, exist_ok=True)
        stem = f"asm-patch-gpu-{env['date'][:10]}"
        (results / f"{stem}.json").write_text(json.dumps({"schema": "kstrata.asm-patch-gpu/1", "environment": env,
                                                             "kernels": rows}, indent=2, default=str) + "\n")
        lines = [f"# Patched cubins on {env['device']}", "",
                 f"{env['date']} · torch {env['torch']} · triton {env['triton']} · CUDA {env['cuda']}", "",
                 "Original = Triton's cubin; rebuilt = kstrata's ptxas rebuild of the same PTX; patched = PTX with "
                 "`ld.global` → `ld.global.nc`, rebuilt. Median of CUDA-event timings, L2 flushed before each run.", "",
                 "| kernel | ref | rebuilt == triton | patched == triton | triton µs | patched µs (p10–p90) | speedup | regs |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['kernel']} | error: {r['error'][:80]} | | | | | | |")
                continue
            t, p = r["timing_us"]["triton"], r["timing_us"]["patched"]
            lines.append(f"| {r['kernel']} | {'ok' if r['matches_reference'] else 'FAIL'} | {r['rebuilt_bitwise_equal']} "
                         f"| {r['patched_bitwise_equal']} | {t['median_us']:.2f} | {p['median_us']:.2f} "
                         f"({p['p10_us']:.2f}–{p['p90_us']:.2f}) | {r['speedup_patched']:.3f} | "
                         f"{r['registers']['before']}→{r['registers']['after']} |")
        (results / f"{stem}.md").write_text("\n".join(lines) + "\n")
        print(f"results: {results / stem}.json")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
