"""Scan (prefix) kernels.

Owns: a row cumsum through `tl.associative_scan` with our own @triton.jit add combine (fp32, the row in
one block), an int32 row cumsum with `tl.cumsum` over column blocks carrying the running total between
blocks, and a first-order linear recurrence h[t] = a[t] * h[t-1] + b[t] as an associative scan over
pairs (a two-operand combine). Rows are shorter or longer than the block, never a multiple of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .spec import KernelArgs, SuiteKernel


@triton.jit
def _add_combine(a, b):
    return a + b


@triton.jit
def cumsum_scan_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # Padding lanes sit after the valid ones, so the 0 they carry cannot reach a stored prefix.
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    y = tl.associative_scan(x, 0, _add_combine)
    tl.store(out_ptr + row * n_cols + cols, y, mask=mask)


def _cumsum_scan_args(gen: torch.Generator) -> KernelArgs:
    m, n = 13, 200
    return {"x_ptr": torch.randn(m, n, generator=gen), "out_ptr": torch.empty(m, n), "n_cols": n}


def _cumsum_scan_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {"out_ptr": a["x_ptr"].double().cumsum(dim=1).float()}


@triton.jit
def cumsum_carry_i32_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    carry = tl.full((), 0, tl.int32)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * n_cols + start + cols, mask=mask, other=0)
        y = tl.cumsum(x, axis=0) + carry
        tl.store(out_ptr + row * n_cols + start + cols, y, mask=mask)
        # The padding loads 0, so the block total is the total of its valid lanes.
        carry += tl.sum(x, axis=0)


def _cumsum_carry_args(gen: torch.Generator) -> KernelArgs:
    m, n = 11, 1000
    return {
        "x_ptr": torch.randint(-500, 500, (m, n), generator=gen, dtype=torch.int32),
        "out_ptr": torch.empty(m, n, dtype=torch.int32),
        "n_cols": n,
    }


def _cumsum_carry_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {"out_ptr": a["x_ptr"].cumsum(dim=1).to(torch.int32)}


@triton.jit
def _affine_combine(a_left, b_left, a_right, b_right):
    # Composing h -> a_l*h + b_l, then h -> a_r*h + b_r gives h -> (a_l*a_r)*h + (a_r*b_l + b_r).
    return a_left * a_right, a_right * b_left + b_right


@triton.jit
def linear_recurrence_kernel(a_ptr, b_ptr, h_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # The identity map (a=1, b=0) pads the tail, past every valid step.
    a = tl.load(a_ptr + row * n_cols + cols, mask=mask, other=1.0)
    b = tl.load(b_ptr + row * n_cols + cols, mask=mask, other=0.0)
    _, h = tl.associative_scan((a, b), 0, _affine_combine)
    tl.store(h_ptr + row * n_cols + cols, h, mask=mask)


def _linrec_args(gen: torch.Generator) -> KernelArgs:
    m, n = 7, 150
    return {
        "a_ptr": 0.5 + 0.5 * torch.rand(m, n, generator=gen),
        "b_ptr": torch.randn(m, n, generator=gen),
        "h_ptr": torch.empty(m, n),
        "n_cols": n,
    }


def _linrec_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    coef, inp = a["a_ptr"].double(), a["b_ptr"].double()
    h = torch.empty_like(coef)
    state = torch.zeros(coef.shape[0], dtype=torch.float64)
    for t in range(coef.shape[1]):
        state = coef[:, t] * state + inp[:, t]
        h[:, t] = state
    return {"h_ptr": h.float()}


KERNELS = [
    SuiteKernel(
        name="cumsum_assoc_scan",
        fn=cumsum_scan_kernel,
        make_args=_cumsum_scan_args,
        grid=lambda a: (a["x_ptr"].shape[0],),
        reference=_cumsum_scan_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK": 256},
        atol=1e-5,
        rtol=1e-5,
        tags=("scan", "cumsum", "associative_scan", "custom-combine", "masked-tail", "fp32"),
        description="row cumsum via tl.associative_scan with a user @triton.jit add combine",
    ),
    SuiteKernel(
        name="cumsum_carry_i32",
        fn=cumsum_carry_i32_kernel,
        make_args=_cumsum_carry_args,
        grid=lambda a: (a["x_ptr"].shape[0],),
        reference=_cumsum_carry_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK": 128},
        tags=("scan", "cumsum", "scf.for", "carry", "masked-tail", "int32"),
        description="int32 row cumsum with tl.cumsum per 128-wide block and a carried running total",
    ),
    SuiteKernel(
        name="linear_recurrence_scan",
        fn=linear_recurrence_kernel,
        make_args=_linrec_args,
        grid=lambda a: (a["a_ptr"].shape[0],),
        reference=_linrec_ref,
        outputs=("h_ptr",),
        constexprs={"BLOCK": 256},
        atol=1e-5,
        rtol=1e-5,
        tags=("scan", "associative_scan", "custom-combine", "multi-operand", "masked-tail", "fp32"),
        description="h[t] = a[t]*h[t-1] + b[t] as an associative scan over (a, b) pairs",
    ),
]
