"""Row softmax kernels.

Owns: a one-pass softmax that holds a whole row in one block (fp32), and an online softmax that walks a
row wider than its block in column blocks, keeping a running max and a rescaled running sum (fp16 in,
fp32 out). Row widths are not multiples of the block, so the last column block is masked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .spec import KernelArgs, SuiteKernel


@triton.jit
def softmax_onepass_kernel(x_ptr, out_ptr, n_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # -inf in the padding lanes keeps them out of the max and makes their exp exactly 0.
    x = tl.load(x_ptr + row * row_stride + cols, mask=mask, other=float("-inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * row_stride + cols, e / tl.sum(e, axis=0), mask=mask)


def _onepass_args(gen: torch.Generator) -> KernelArgs:
    m, n = 37, 300
    return {
        "x_ptr": torch.randn(m, n, generator=gen) * 3.0,
        "out_ptr": torch.empty(m, n),
        "n_cols": n,
        "row_stride": n,
    }


def _onepass_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {"out_ptr": torch.softmax(a["x_ptr"].double(), dim=1).float()}


@triton.jit
def softmax_online_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n_cols
    out_row = out_ptr + row * n_cols
    cols = tl.arange(0, BLOCK)
    # Pass 1: one read of the row. The running sum is kept relative to the running max and rescaled
    # whenever the max grows, so exp never overflows and no second read is needed for the max.
    run_max = tl.full((), float("-inf"), tl.float32)
    run_sum = tl.full((), 0.0, tl.float32)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(run_max, tl.max(x, axis=0))
        run_sum = run_sum * tl.exp(run_max - new_max) + tl.sum(tl.exp(x - new_max), axis=0)
        run_max = new_max
    inv_sum = 1.0 / run_sum
    # Pass 2: normalize.
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=float("-inf")).to(tl.float32)
        tl.store(out_row + start + cols, tl.exp(x - run_max) * inv_sum, mask=mask)


def _online_args(gen: torch.Generator) -> KernelArgs:
    m, n = 23, 1000
    # A drift along the row makes the max grow block after block, so the rescaling path is exercised.
    drift = torch.linspace(0.0, 6.0, n)
    return {
        "x_ptr": (torch.randn(m, n, generator=gen) * 2.0 + drift).half(),
        "out_ptr": torch.empty(m, n),
        "n_cols": n,
    }


def _online_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {"out_ptr": torch.softmax(a["x_ptr"].double(), dim=1).float()}


KERNELS = [
    SuiteKernel(
        name="softmax_onepass",
        fn=softmax_onepass_kernel,
        make_args=_onepass_args,
        grid=lambda a: (a["x_ptr"].shape[0],),
        reference=_onepass_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK": 512},
        atol=1e-7,
        rtol=1e-5,
        tags=("softmax", "one-pass", "reduction", "masked-tail", "fp32"),
        description="row softmax with the whole row (300 of a 512 block) in registers",
    ),
    SuiteKernel(
        name="softmax_online",
        fn=softmax_online_kernel,
        make_args=_online_args,
        grid=lambda a: (a["x_ptr"].shape[0],),
        reference=_online_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK": 128},
        atol=1e-8,
        rtol=1e-5,
        tags=("softmax", "online", "scf.for", "masked-tail", "fp16", "fp32"),
        description="online softmax over 128-wide column blocks with running max and rescaled sum (fp16 in, fp32 out)",
    ),
]
