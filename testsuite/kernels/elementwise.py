"""Elementwise kernels: a masked vector add whose length is not a multiple of the block, and a row-wise
scale whose rows are shorter than the block (each program's mask ends inside its row; the row offset is
computed in 64 bits, so launches past 2^31 elements stay in bounds)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .spec import KernelArgs, SuiteKernel


@triton.jit
def vector_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def _vector_add_args(gen: torch.Generator) -> KernelArgs:
    n = 5003  # not a multiple of BLOCK: the last program runs a masked tail
    return {
        "x_ptr": torch.randn(n, generator=gen),
        "y_ptr": torch.randn(n, generator=gen),
        "out_ptr": torch.empty(n),
        "n": n,
    }


def _vector_add_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {"out_ptr": a["x_ptr"] + a["y_ptr"]}


@triton.jit
def row_scale_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask)
    tl.store(out_ptr + row * n_cols + cols, (x.to(tl.float32) * 2.0 + 1.0).to(x.dtype), mask=mask)


def _row_scale_args(gen: torch.Generator) -> KernelArgs:
    # 33 rows of 100 fp16: 6600 bytes per buffer, not a multiple of any allocation granule, so one
    # element past the end is outside the allocation
    return {"x_ptr": torch.randn(33, 100, generator=gen).half(), "out_ptr": torch.empty(33, 100).half(), "n_cols": 100}


KERNELS = [
    SuiteKernel(
        name="vector_add",
        fn=vector_add_kernel,
        make_args=_vector_add_args,
        grid=lambda a: (triton.cdiv(a["n"], 1024),),
        reference=_vector_add_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK": 1024},
        tags=("elementwise", "masked-tail"),
        description="out = x + y over a length that is not a multiple of the block",
    ),
    SuiteKernel(
        name="row_scale",
        fn=row_scale_kernel,
        make_args=_row_scale_args,
        grid=lambda a: (a["x_ptr"].shape[0],),
        reference=lambda a: {"out_ptr": (a["x_ptr"].float() * 2.0 + 1.0).half()},
        outputs=("out_ptr",),
        constexprs={"BLOCK": 128},
        tags=("elementwise", "row-wise", "masked-tail", "fp16", "i64-offsets"),
        description="out = 2x + 1 row by row; rows of 100 under a block of 128, row offsets in 64 bits",
    ),
]
