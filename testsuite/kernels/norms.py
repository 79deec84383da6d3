"""Normalization kernels: LayerNorm and RMSNorm, forward and backward.

Owns: LayerNorm forward (fp32, saves mean and rstd), LayerNorm backward in two kernels (dx plus
per-program partial dw/db over a runtime number of rows, then a column-blocked reduction of the partials
to dw/db), RMSNorm forward (bf16 in and out, fp32 rstd saved) and RMSNorm backward (dx, with dw summed
across programs by float atomics). Row widths are not multiples of the block and the row count is not a
multiple of the rows per program.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .spec import KernelArgs, SuiteKernel

# ---------------------------------------------------------------------------------------------------
# LayerNorm forward
# ---------------------------------------------------------------------------------------------------


@triton.jit
def layernorm_fwd_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    mean_ptr,
    rstd_ptr,
    n_cols,
    eps,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    base = row.to(tl.int64) * n_cols
    x = tl.load(x_ptr + base + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    # Two-pass variance over registers; the padding lanes must not contribute (x - mean)^2.
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / n_cols
    rstd = tl.rsqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    tl.store(y_ptr + base + cols, xc * rstd * w + b, mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


def _ln_fwd_args(gen: torch.Generator) -> KernelArgs:
    m, n = 37, 300
    return {
        "x_ptr": torch.randn(m, n, generator=gen) * 2.0 + 0.5,
        "w_ptr": torch.randn(n, generator=gen),
        "b_ptr": torch.randn(n, generator=gen),
        "y_ptr": torch.empty(m, n),
        "mean_ptr": torch.empty(m),
        "rstd_ptr": torch.empty(m),
        "n_cols": n,
        "eps": 1e-5,
    }


def _ln_fwd_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    x = a["x_ptr"].double()
    mean = x.mean(dim=1)
    var = x.var(dim=1, unbiased=False)
    rstd = 1.0 / torch.sqrt(var + a["eps"])
    y = (x - mean[:, None]) * rstd[:, None] * a["w_ptr"].double() + a["b_ptr"].double()
    return {"y_ptr": y.float(), "mean_ptr": mean.float(), "rstd_ptr": rstd.float()}


# ---------------------------------------------------------------------------------------------------
# LayerNorm backward: dx and partial dw/db
# ---------------------------------------------------------------------------------------------------


@triton.jit
def layernorm_bwd_dx_kernel(
    x_ptr,
    dy_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    dx_ptr,
    dw_part_ptr,
    db_part_ptr,
    n_rows,
    n_cols,
    rows_per_prog,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    # int64 rows: the induction variable then addresses rows without 32-bit overflow.
    row_start = pid.to(tl.int64) * rows_per_prog
    # The last program owns fewer rows: the trip count is a runtime value.
    row_end = tl.minimum(row_start + rows_per_prog, n_rows)
    for row in range(row_start, row_end):
        base = row * n_cols
        x = tl.load(x_ptr + base + cols, mask=mask, other=0.0)
        dy = tl.load(dy_ptr + base + cols, mask=mask, other=0.0)
        mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + row)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / n_cols
        c2 = tl.sum(wdy, axis=0) / n_cols
        dx = (wdy - (xhat * c1 + c2)) * rstd
        tl.store(dx_ptr + base + cols, dx, mask=mask)
        dw_acc += dy * xhat
        db_acc += dy
    tl.store(dw_part_ptr + pid * n_cols + cols, dw_acc, mask=mask)
    tl.store(db_part_ptr + pid * n_cols + cols, db_acc, mask=mask)


_LN_ROWS_PER_PROG = 8


def _ln_bwd_args(gen: torch.Generator) -> KernelArgs:
    m, n = 37, 300
    groups = triton.cdiv(m, _LN_ROWS_PER_PROG)
    x = torch.randn(m, n, generator=gen) * 1.5 + 0.3
    mean = x.double().mean(dim=1)
    rstd = 1.0 / torch.sqrt(x.double().var(dim=1, unbiased=False) + 1e-5)
    return {
        "x_ptr": x,
        "dy_ptr": torch.randn(m, n, generator=gen),
        "w_ptr": torch.randn(n, generator=gen),
        "mean_ptr": mean.float(),
        "rstd_ptr": rstd.float(),
        "dx_ptr": torch.empty(m, n),
        "dw_part_ptr": torch.empty(groups, n),
        "db_part_ptr": torch.empty(groups, n),
        "n_rows": m,
        "n_cols": n,
        "rows_per_prog": _LN_ROWS_PER_PROG,
    }


def _ln_bwd_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    x, dy, w = a["x_ptr"].double(), a["dy_ptr"].double(), a["w_ptr"].double()
    mean, rstd = a["mean_ptr"].double()[:, None], a["rstd_ptr"].double()[:, None]
    xhat = (x - mean) * rstd
    wdy = w * dy
    c1 = (xhat * wdy).mean(dim=1, keepdim=True)
    c2 = wdy.mean(dim=1, keepdim=True)
    dx = (wdy - (xhat * c1 + c2)) * rstd
    m, rpp = x.shape[0], a["rows_per_prog"]
    groups = torch.arange(m) // rpp
    n_groups = triton.cdiv(m, rpp)
    dw_part = torch.zeros(n_groups, x.shape[1], dtype=torch.float64).index_add_(0, groups, dy * xhat)
    db_part = torch.zeros(n_groups, x.shape[1], dtype=torch.float64).index_add_(0, groups, dy)
    return {"dx_ptr": dx.float(), "dw_part_ptr": dw_part.float(), "db_part_ptr": db_part.float()}


# ---------------------------------------------------------------------------------------------------
# LayerNorm backward: reduce the partials to dw/db
# ---------------------------------------------------------------------------------------------------


@triton.jit
def layernorm_bwd_dwdb_kernel(
    dw_part_ptr,
    db_part_ptr,
    dw_ptr,
    db_ptr,
    n_parts,
    n_cols,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    # Accumulate a 2D tile and reduce it once at the end: fewer cross-thread reductions per step.
    acc_w = tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.float32)
    for g0 in range(0, n_parts, BLOCK_G):
        rows = g0 + tl.arange(0, BLOCK_G)
        mask = (rows[:, None] < n_parts) & col_mask[None, :]
        offs = rows[:, None] * n_cols + cols[None, :]
        acc_w += tl.load(dw_part_ptr + offs, mask=mask, other=0.0)
        acc_b += tl.load(db_part_ptr + offs, mask=mask, other=0.0)
    tl.store(dw_ptr + cols, tl.sum(acc_w, axis=0), mask=col_mask)
    tl.store(db_ptr + cols, tl.sum(acc_b, axis=0), mask=col_mask)


def _ln_dwdb_args(gen: torch.Generator) -> KernelArgs:
    g, n = 45, 300
    return {
        "dw_part_ptr": torch.randn(g, n, generator=gen),
        "db_part_ptr": torch.randn(g, n, generator=gen),
        "dw_ptr": torch.empty(n),
        "db_ptr": torch.empty(n),
        "n_parts": g,
        "n_cols": n,
    }


def _ln_dwdb_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {
        "dw_ptr": a["dw_part_ptr"].double().sum(dim=0).float(),
        "db_ptr": a["db_part_ptr"].double().sum(dim=0).float(),
    }


# ---------------------------------------------------------------------------------------------------
# RMSNorm forward (bf16)
# ---------------------------------------------------------------------------------------------------


@triton.jit
def rmsnorm_fwd_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    base = row.to(tl.int64) * n_cols
    x = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + base + cols, (x * rstd * w).to(tl.bfloat16), mask=mask)
    tl.store(rstd_ptr + row, rstd)


def _rms_fwd_args(gen: torch.Generator) -> KernelArgs:
    m, n = 37, 300
    return {
        "x_ptr": (torch.randn(m, n, generator=gen) * 2.0).to(torch.bfloat16),
        "w_ptr": (1.0 + 0.2 * torch.randn(n, generator=gen)).to(torch.bfloat16),
        "y_ptr": torch.empty(m, n, dtype=torch.bfloat16),
        "rstd_ptr": torch.empty(m),
        "n_cols": n,
        "eps": 1e-6,
    }


def _rms_fwd_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    x = a["x_ptr"].double()
    rstd = 1.0 / torch.sqrt((x * x).mean(dim=1) + a["eps"])
    y = x * rstd[:, None] * a["w_ptr"].double()
    return {"y_ptr": y.to(torch.bfloat16), "rstd_ptr": rstd.float()}


# ---------------------------------------------------------------------------------------------------
# RMSNorm backward: dx per row, dw across programs with float atomics
# ---------------------------------------------------------------------------------------------------


@triton.jit
def rmsnorm_bwd_kernel(
    x_ptr,
    dy_ptr,
    w_ptr,
    rstd_ptr,
    dx_ptr,
    dw_ptr,
    n_rows,
    n_cols,
    rows_per_prog,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    row_start = pid.to(tl.int64) * rows_per_prog
    row_end = tl.minimum(row_start + rows_per_prog, n_rows)
    for row in range(row_start, row_end):
        base = row * n_cols
        x = tl.load(x_ptr + base + cols, mask=mask, other=0.0)
        dy = tl.load(dy_ptr + base + cols, mask=mask, other=0.0)
        rstd = tl.load(rstd_ptr + row)
        wdy = w * dy
        c = tl.sum(wdy * x, axis=0) / n_cols
        dx = (wdy - x * (c * rstd * rstd)) * rstd
        tl.store(dx_ptr + base + cols, dx, mask=mask)
        dw_acc += dy * x * rstd
    # One atomic add per program and column: the order of the adds varies, so dw is not bitwise
    # reproducible across runs, which the tolerance allows for.
    tl.atomic_add(dw_ptr + cols, dw_acc, mask=mask)


_RMS_ROWS_PER_PROG = 6


def _rms_bwd_args(gen: torch.Generator) -> KernelArgs:
    m, n = 37, 300
    x = torch.randn(m, n, generator=gen)
    rstd = 1.0 / torch.sqrt((x.double() ** 2).mean(dim=1) + 1e-6)
    return {
        "x_ptr": x,
        "dy_ptr": torch.randn(m, n, generator=gen),
        "w_ptr": 1.0 + 0.2 * torch.randn(n, generator=gen),
        "rstd_ptr": rstd.float(),
        "dx_ptr": torch.empty(m, n),
        "dw_ptr": torch.zeros(n),
        "n_rows": m,
        "n_cols": n,
        "rows_per_prog": _RMS_ROWS_PER_PROG,
    }


def _rms_bwd_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    x, dy, w = a["x_ptr"].double(), a["dy_ptr"].double(), a["w_ptr"].double()
    rstd = a["rstd_ptr"].double()[:, None]
    wdy = w * dy
    c = (wdy * x).mean(dim=1, keepdim=True)
    dx = (wdy - x * c * rstd * rstd) * rstd
    dw = a["dw_ptr"].double() + (dy * x * rstd).sum(dim=0)
    return {"dx_ptr": dx.float(), "dw_ptr": dw.float()}


KERNELS = [
    SuiteKernel(
        name="layernorm_fwd",
        fn=layernorm_fwd_kernel,
        make_args=_ln_fwd_args,
        grid=lambda a: (a["x_ptr"].shape[0],),
        reference=_ln_fwd_ref,
        outputs=("y_ptr", "mean_ptr", "rstd_ptr"),
        constexprs={"BLOCK_N": 512},
        atol=1e-5,
        rtol=1e-5,
        tags=("norm", "layernorm", "forward", "reduction", "masked-tail", "fp32"),
        description="LayerNorm forward over 300-wide rows, saving mean and rstd",
    ),
    SuiteKernel(
        name="layernorm_bwd_dx",
        fn=layernorm_bwd_dx_kernel,
        make_args=_ln_bwd_args,
        grid=lambda a: (triton.cdiv(a["n_rows"], a["rows_per_prog"]),),
        reference=_ln_bwd_ref,
        outputs=("dx_ptr", "dw_part_ptr", "db_part_ptr"),
        constexprs={"BLOCK_N": 512},
        atol=1e-5,
        rtol=1e-5,
        tags=("norm", "layernorm", "backward", "reduction", "scf.for", "masked-tail", "fp32"),
        description="LayerNorm backward: dx per row and per-program partial dw/db over a runtime row count",
    ),
    SuiteKernel(
        name="layernorm_bwd_dwdb",
        fn=layernorm_bwd_dwdb_kernel,
        make_args=_ln_dwdb_args,
        grid=lambda a: (triton.cdiv(a["n_cols"], 64),),
        reference=_ln_dwdb_ref,
        outputs=("dw_ptr", "db_ptr"),
        constexprs={"BLOCK_G": 16, "BLOCK_N": 64},
        atol=1e-5,
        rtol=1e-5,
        tags=("norm", "layernorm", "backward", "column-reduction", "scf.for", "masked-tail", "fp32"),
        description="LayerNorm backward: sum the [45, 300] partial dw/db over programs into dw/db",
    ),
    SuiteKernel(
        name="rmsnorm_fwd_bf16",
        fn=rmsnorm_fwd_kernel,
        make_args=_rms_fwd_args,
        grid=lambda a: (a["x_ptr"].shape[0],),
        reference=_rms_fwd_ref,
        outputs=("y_ptr", "rstd_ptr"),
        constexprs={"BLOCK_N": 512},
        atol=1e-5,
        rtol=1e-2,
        tags=("norm", "rmsnorm", "forward", "reduction", "masked-tail", "bf16"),
        description="RMSNorm forward in bf16 with fp32 math, saving rstd in fp32",
    ),
    SuiteKernel(
        name="rmsnorm_bwd",
        fn=rmsnorm_bwd_kernel,
        make_args=_rms_bwd_args,
        grid=lambda a: (triton.cdiv(a["n_rows"], a["rows_per_prog"]),),
        reference=_rms_bwd_ref,
        outputs=("dx_ptr", "dw_ptr"),
        inout=("dw_ptr",),
        constexprs={"BLOCK_N": 512},
        atol=1e-5,
        rtol=1e-5,
        tags=("norm", "rmsnorm", "backward", "atomic", "scf.for", "masked-tail", "fp32"),
        description="RMSNorm backward: dx per row, dw summed across programs with float atomic_add",
    ),
]
