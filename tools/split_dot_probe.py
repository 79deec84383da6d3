"""How fast and how exact fp32 products split over the tensor cores are (Triton's `input_precision`), beside
IEEE fp32: a GPU diagnostic for the templates that compute a GEMM or a convolution under `strict`.

    python -m kstrata.tools.split_dot_probe [--m 32768 --n 4096 --k 1024] [--suffix=-x]

One Triton GEMM kernel (128 x 128 x 32 tiles, 8 warps, 3 stages, grouped program order) with each of
`ieee`, `tf32x3`, `bf16x6`, `bf16x3` and `tf32`, and PyTorch's fp32 `torch.mm` with TF32 off, on randn
operands (seeded): per variant the median time (L2 flushed), TFLOP/s and the relative L2 and largest absolute
error against the float64 product, with the `strict` bound that PyTorch's own error sets (`kstrata eval`'s
rule: 4 x PyTorch's error + a floor of a few ULPs). Results go to
testsuite/results/split-dot-probe-<date><suffix>.{json,md} (and $OUT when set). The results of 2026-12-04 (`-a`,
`-b`) were measured with the fp32 and the pre-split loops as two kernels; they are one kernel since, with the
same loop bodies.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "testsuite" / "results"
PRECISIONS = ("ieee", "tf32x3", "bf16x6", "bf16x3", "tf32")


#: How the six products of pre-split bf16 parts are accumulated (the kernel's MODE other than "fp32"): into the one
#: accumulator, the smallest first ("chain"); per K step into a fresh tile added to the accumulator by an fp32
#: add ("step"); the five small products into a second accumulator, added at the end ("two").
PARTS_MODES = ("chain", "step", "two")


def _kernel() -> Any:
    """The probe's GEMM: MODE "fp32" takes fp32 operands and `tl.dot` at PREC (masked tails); the PARTS_MODES take
    the operands' bf16 parts, (3, M, K) and (3, K, N), and need M and N multiples of BM and BN, K of BK."""
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def gemm(a_ptr, b_ptr, c_ptr, M, N, K, MODE: tl.constexpr, PREC: tl.constexpr,  # type: ignore[no-untyped-def]
             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BM)
        tiles_n = tl.cdiv(N, BN)
        per_group = GROUP * tiles_n
        first = (pid // per_group) * GROUP
        rows = tl.minimum(tiles_m - first, GROUP)
        pm = first + (pid % per_group) % rows
        pn = (pid % per_group) // rows
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros([BM, BN], tl.float32)
        small = tl.zeros([BM, BN], tl.float32)
        for k0 in range(0, K, BK):
            ap = a_ptr + rm[:, None] * K + (k0 + rk)[None, :]
            bp = b_ptr + (k0 + rk)[:, None] * N + rn[None, :]
            if MODE == "fp32":
                a = tl.load(ap, mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0)
                b = tl.load(bp, mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
                acc = tl.dot(a, b, acc, input_precision=PREC)
            else:
                a0 = tl.load(ap)
                a1 = tl.load(ap + M * K)
                a2 = tl.load(ap + 2 * M * K)
                b0 = tl.load(bp)
                b1 = tl.load(bp + K * N)
                b2 = tl.load(bp + 2 * K * N)
                if MODE == "chain":
                    acc = tl.dot(a2, b0, acc)
                    acc = tl.dot(a1, b1, acc)
                    acc = tl.dot(a0, b2, acc)
                    acc = tl.dot(a1, b0, acc)
                    acc = tl.dot(a0, b1, acc)
                    acc = tl.dot(a0, b0, acc)
                elif MODE == "step":
                    t = tl.dot(a2, b0)
                    t = tl.dot(a1, b1, t)
                    t = tl.dot(a0, b2, t)
                    t = tl.dot(a1, b0, t)
                    t = tl.dot(a0, b1, t)
                    t = tl.dot(a0, b0, t)
                    acc += t
                else:
                    small = tl.dot(a2, b0, small)
                    small = tl.dot(a1, b1, small)
                    small = tl.dot(a0, b2, small)
                    small = tl.dot(a1, b0, small)
                    small = tl.dot(a0, b1, small)
                    acc = tl.dot(a0, b0, acc)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc + small, mask=(rm[:, None] < M) & (rn[None, :] < N))

    return gemm


def split3(x: Any) -> Any:
    """x as its three bf16 parts (3, *x.shape): hi, mid, lo with hi + mid + lo == x (round to nearest)."""
    import torch

    hi = x.to(torch.bfloat16)
    r1 = x - hi.float()
    mid = r1.to(torch.bfloat16)
    return torch.stack([hi, mid, (r1 - mid.float()).to(torch.bfloat16)])


def run(m: int, n: int, k: int) -> dict[str, Any]:
    import torch
    import triton

    from kstrata.agents.evaluate import strict_bounds
    from kstrata.agents.templates.tune import errors
    from kstrata.backends.timing import time_gpu

    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(k, n, device="cuda")
    truth = a.double() @ b.double()
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = a @ b
    ref_abs, ref_rel = errors(ref, truth)
    scale = float(truth.abs().max())
    bound_abs, bound_rel = strict_bounds(torch.float32, ref_abs, ref_rel, scale)
    flop = 2.0 * m * n * k
    rows: list[dict[str, Any]] = []
    t = time_gpu(lambda: a @ b, runs=20, warmup=3).median_us
    rows.append({"variant": "torch.mm fp32 (TF32 off)", "median_us": round(t, 1), "tflops": round(flop / t / 1e6, 1),
                 "rel_l2": ref_rel, "max_abs": ref_abs, "strict_ok": True})
    gemm = _kernel()
    c = torch.empty(m, n, device="cuda")
    grid = (triton.cdiv(m, 128) * triton.cdiv(n, 128),)
    for prec in PRECISIONS:
        def call(prec: str = prec) -> None:
            gemm[grid](a, b, c, m, n, k, MODE="fp32", PREC=prec, BM=128, BN=128, BK=32, GROUP=8, num_warps=8, num_stages=3)
        try:
            call()
            torch.cuda.synchronize()
        except Exception as e:  # a precision this Triton or GPU does not take: reported, the others go on
            rows.append({"variant": f"triton {prec}", "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
            continue
        e_abs, e_rel = errors(c, truth)
        t = time_gpu(call, runs=20, warmup=3).median_us
        rows.append({"variant": f"triton {prec}", "median_us": round(t, 1), "tflops": round(flop / t / 1e6, 1),
                     "rel_l2": e_rel, "max_abs": e_abs, "strict_ok": bool(e_rel <= bound_rel and e_abs <= bound_abs)})
        print(f"{prec:8s} {t:9.1f} us {flop / t / 1e6:7.1f} TFLOP/s  rel L2 {e_rel:.3g}  max abs {e_abs:.3g}  "
              f"strict {'ok' if rows[-1]['strict_ok'] else 'REJECTED'}", flush=True)
    a3, b3 = split3(a), split3(b)
    exact = bool(((a3.float().sum(0) - a) == 0).all() and ((b3.float().sum(0) - b) == 0).all())
    print(f"parts: hi + mid + lo == x for every operand element: {exact}", flush=True)
    if m % 128 or n % 128 or k % 32:
        rows.append({"variant": "pre-split parts", "error": "needs M, N multiples of 128 and K of 32"})
    else:
        for mode in PARTS_MODES:
            def call_parts(mode: str = mode) -> None:
                gemm[grid](a3, b3, c, m, n, k, MODE=mode, PREC="ieee", BM=128, BN=128, BK=32, GROUP=8, num_warps=8, num_stages=3)
            call_parts()
            torch.cuda.synchronize()
            e_abs, e_rel = errors(c, truth)
            t = time_gpu(call_parts, runs=20, warmup=3).median_us
            rows.append({"variant": f"triton pre-split parts, {mode}", "median_us": round(t, 1),
                         "tflops": round(flop / t / 1e6, 1), "rel_l2": e_rel, "max_abs": e_abs,
                         "strict_ok": bool(e_rel <= bound_rel and e_abs <= bound_abs)})
            print(f"parts {mode:6s} {t:9.1f} us {flop / t / 1e6:7.1f} TFLOP/s  rel L2 {e_rel:.3g}  max abs {e_abs:.3g}", flush=True)
    return {"shape": [m, n, k], "parts_exact": exact, "bound_rel_l2": bound_rel, "bound_max_abs": bound_abs, "rows": rows}


def markdown(res: dict[str, Any]) -> str:
    m, n, k = res["shape"]
    out = [f"# Split tensor-core products against IEEE fp32 — {res['device']}, {res['date']}", "",
           f"torch {res['versions']['torch']}, Triton {res['versions']['triton']}. GEMM {m}x{n}x{k} fp32, randn "
           f"operands; errors against the float64 product; strict bound: relative L2 {res['bound_rel_l2']:.3g}, "
           f"max abs {res['bound_max_abs']:.3g} (4 x PyTorch's error + the floor). Pre-split parts: each operand as three "
           f"bf16 tensors (hi, mid, lo), whose sum is the operand exactly: {res.get('parts_exact')}.", "",
           "| variant | median us | TFLOP/s | rel L2 | max abs | strict |", "|---|---:|---:|---:|---:|---|"]
    for r in res["rows"]:
        if "error" in r:
            out.append(f"| {r['variant']} | | | | | {r['error']} |")
        else:
            out.append(f"| {r['variant']} | {r['median_us']} | {r['tflops']} | {r['rel_l2']:.3g} | {r['max_abs']:.3g} | "
                       f"{'ok' if r['strict_ok'] else 'rejected'} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="split_dot_probe", description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=32768)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--suffix", default="")
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    import torch
    import triton

    if not torch.cuda.is_available():
        print("error: split_dot_probe needs an NVIDIA GPU")
        return 2
    if min(args.m, args.n, args.k) < 1:
        print("error: --m, --n and --k must be positive")
        return 2
    res = run(args.m, args.n, args.k)
    res.update(device=torch.cuda.get_device_name(), date=dt.date.today().isoformat(),
               versions={"torch": torch.__version__, "triton": triton.__version__})
    stem = f"split-dot-probe-{res['date']}{args.suffix}"
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"{stem}.json").write_text(json.dumps(res, indent=1) + "\n")
    (args.results / f"{stem}.md").write_text(markdown(res))
    if os.environ.get("OUT"):
        for ext in ("json", "md"):
            shutil.copy(args.results / f"{stem}.{ext}", Path(os.environ["OUT"]) / f"{stem}.{ext}")
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
