"""Elementwise kernels: a masked vector add whose length is not a multiple of the block."""

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
]
