"""A pointwise kernel written as Inductor writes a LayerNorm's last step, `(x - mean[row]) * rstd[row] *
weight[col] + bias[col]` over a flat index (`row = i // cols`, `col = i % cols`): its weight and bias loads
repeat with the program id, the input the `interleaved-pid` pass rewrites, and the kernel its execution tests
and GPU run compare against. Not in `KERNELS`; use `BROADCAST_ROWS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .spec import KernelArgs, SuiteKernel


@triton.jit
def norm_apply_rows_kernel(x_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, out_ptr, n, COLS: tl.constexpr,
                           XBLOCK: tl.constexpr):
    offs = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = offs < n
    row = offs // COLS
    col = offs % COLS
    x = tl.load(x_ptr + offs, mask)
    mean = tl.load(mean_ptr + row, mask, eviction_policy="evict_last")
    rstd = tl.load(rstd_ptr + row, mask, eviction_policy="evict_last")
    w = tl.load(w_ptr + col, mask, eviction_policy="evict_last")
    b = tl.load(b_ptr + col, mask, eviction_policy="evict_last")
    tl.store(out_ptr + offs, (x - mean) * rstd * w + b, mask)


def broadcast_rows(name: str, rows: int, cols: int, xblock: int) -> SuiteKernel:
    """`rows` rows of `cols` (fp32) normalized with per-row statistics and per-column weight and bias, XBLOCK
    elements a program."""

    def make_args(gen: torch.Generator) -> KernelArgs:
        return {"x_ptr": torch.randn(rows, cols, generator=gen), "mean_ptr": torch.randn(rows, generator=gen),
                "rstd_ptr": torch.rand(rows, generator=gen) + 0.5, "w_ptr": torch.randn(cols, generator=gen),
                "b_ptr": torch.randn(cols, generator=gen), "out_ptr": torch.empty(rows, cols), "n": rows * cols}

    def reference(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        x, mean, rstd = a["x_ptr"], a["mean_ptr"][:, None], a["rstd_ptr"][:, None]
        return {"out_ptr": (x - mean) * rstd * a["w_ptr"] + a["b_ptr"]}

    return SuiteKernel(
        name=name,
        fn=norm_apply_rows_kernel,
        make_args=make_args,
        grid=lambda a: (triton.cdiv(a["n"], xblock),),
        reference=reference,
        outputs=("out_ptr",),
        constexprs={"COLS": cols, "XBLOCK": xblock},
        num_warps=4,
        tags=("elementwise", "broadcast", "masked-tail"),
        description=f"LayerNorm's affine step over {rows} rows of {cols}, weight and bias broadcast over the rows",
        rtol=1e-6,
        atol=1e-6,
    )


BROADCAST_ROWS = {
    # 16 rows of 1000 over blocks of 128: 125 programs, not a whole number of 4 or 16 slices (the order kept)
    "norm_apply_rows_odd": broadcast_rows("norm_apply_rows_odd", 16, 1000, 128),
    # 16 rows of 1024: 128 programs, 16 slices of 8 (a row a slice)
    "norm_apply_rows": broadcast_rows("norm_apply_rows", 16, 1024, 128),
}
