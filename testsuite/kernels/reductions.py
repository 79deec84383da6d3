"""Reduction kernels: row sum, row max, row argmax and a column sum.

Owns: a row sum of bf16 data accumulated in fp32 over column blocks, a row max holding the whole row
in one block (some rows all negative, so wrong padding shows), a row argmax over column blocks with
many ties (first occurrence wins, as in torch.argmax), and an int32 column sum over row blocks. Every
reduced extent has a masked tail.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .spec import KernelArgs, SuiteKernel


@triton.jit
def row_sum_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    # A vector accumulator defers the cross-lane reduction to a single one after the loop.
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        acc += tl.load(x_ptr + row * n_cols + start + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def _row_sum_args(gen: torch.Generator) -> KernelArgs:
    m, n = 29, 1000
    return {
        "x_ptr": torch.randn(m, n, generator=gen).to(torch.bfloat16),
        "out_ptr": torch.empty(m),
        "n_cols": n,
    }


def _row_sum_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {"out_ptr": a["x_ptr"].double().sum(dim=1).float()}


@triton.jit
def row_max_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=float("-inf"))
    tl.store(out_ptr + row, tl.max(x, axis=0))


def _row_max_args(gen: torch.Generator) -> KernelArgs:
    m, n = 37, 300
    x = torch.randn(m, n, generator=gen)
    # Every third row is entirely negative: padding with 0 instead of -inf would win the max there.
    x[::3] = -x[::3].abs() - 0.5
    return {"x_ptr": x, "out_ptr": torch.empty(m), "n_cols": n}


def _row_max_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {"out_ptr": a["x_ptr"].amax(dim=1)}


@triton.jit
def row_argmax_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    best_val = tl.full((), float("-inf"), tl.float32)
    best_idx = tl.full((), 0, tl.int32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_ptr + row * n_cols + start + cols, mask=start + cols < n_cols, other=float("-inf"))
        blk_val, blk_idx = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        # Strictly greater: on a tie the earlier block keeps the index, giving the first occurrence.
        better = blk_val > best_val
        best_idx = tl.where(better, start + blk_idx, best_idx)
        best_val = tl.where(better, blk_val, best_val)
    tl.store(out_ptr + row, best_idx.to(tl.int64))


def _row_argmax_args(gen: torch.Generator) -> KernelArgs:
    m, n = 37, 300
    # Small integers as floats: the row max occurs several times, so tie-breaking is checked.
    x = torch.randint(-40, 40, (m, n), generator=gen).float()
    # A few rows have their unique max in the masked last block.
    x[1, 290] = 100.0
    x[5, n - 1] = 100.0
    return {"x_ptr": x, "out_ptr": torch.empty(m, dtype=torch.int64), "n_cols": n}


def _row_argmax_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    x = a["x_ptr"]
    # torch.argmax documents the first maximal index; derive it explicitly so the reference holds anyway.
    first = (x == x.amax(dim=1, keepdim=True)).int().argmax(dim=1)
    return {"out_ptr": first.to(torch.int64)}


@triton.jit
def col_sum_i32_kernel(x_ptr, out_ptr, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
    for r0 in range(0, n_rows, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < n_rows) & col_mask[None, :]
        acc += tl.load(x_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0), mask=col_mask)


def _col_sum_args(gen: torch.Generator) -> KernelArgs:
    m, n = 300, 37
    return {
        "x_ptr": torch.randint(-1000, 1000, (m, n), generator=gen, dtype=torch.int32),
        "out_ptr": torch.empty(n, dtype=torch.int32),
        "n_rows": m,
        "n_cols": n,
    }


def _col_sum_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {"out_ptr": a["x_ptr"].sum(dim=0, dtype=torch.int32)}


KERNELS = [
    SuiteKernel(
        name="row_sum_bf16",
        fn=row_sum_kernel,
        make_args=_row_sum_args,
        grid=lambda a: (a["x_ptr"].shape[0],),
        reference=_row_sum_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK": 256},
        atol=1e-4,
        rtol=1e-5,
        tags=("reduction", "sum", "scf.for", "masked-tail", "bf16", "fp32"),
        description="row sum of bf16 data over 256-wide column blocks, fp32 accumulator and output",
    ),
    SuiteKernel(
        name="row_max",
        fn=row_max_kernel,
        make_args=_row_max_args,
        grid=lambda a: (a["x_ptr"].shape[0],),
        reference=_row_max_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK": 512},
        tags=("reduction", "max", "masked-tail", "fp32"),
        description="row max with the whole row in one block, -inf padding, all-negative rows",
    ),
    SuiteKernel(
        name="row_argmax",
        fn=row_argmax_kernel,
        make_args=_row_argmax_args,
        grid=lambda a: (a["x_ptr"].shape[0],),
        reference=_row_argmax_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK": 64},
        tags=("reduction", "argmax", "scf.for", "ties", "masked-tail", "fp32", "int64"),
        description="row argmax over 64-wide column blocks with ties; first occurrence, int64 output",
    ),
    SuiteKernel(
        name="col_sum_i32",
        fn=col_sum_i32_kernel,
        make_args=_col_sum_args,
        grid=lambda a: (triton.cdiv(a["n_cols"], 16),),
        reference=_col_sum_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK_M": 32, "BLOCK_N": 16},
        tags=("reduction", "sum", "column-reduction", "scf.for", "masked-tail", "int32"),
        description="column sum of an int32 [300, 37] matrix over 32-row blocks",
    ),
]
