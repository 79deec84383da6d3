"""Kernels whose point is structured control flow in the TTIR.

Owns: a data-dependent `while` loop (`scf.while`: Collatz step counts, iterating until every lane of
the block has reached 1), a branch on a value each program computes (`scf.if`: per-row norm clipping),
and a `for` loop over a runtime trip count (`scf.for`: Horner evaluation of a polynomial whose degree
is a kernel argument). Lengths are not multiples of the block.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .spec import KernelArgs, SuiteKernel

# ---------------------------------------------------------------------------------------------------
# scf.while: Collatz step counts
# ---------------------------------------------------------------------------------------------------


@triton.jit
def collatz_steps_kernel(x_ptr, steps_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # Padding lanes start at 1, already done, so they never keep the loop alive.
    v = tl.load(x_ptr + offs, mask=mask, other=1)
    steps = tl.zeros([BLOCK], dtype=tl.int32)
    # The trip count depends on the loaded data: this is a while loop, not a for loop.
    while tl.max(v, axis=0) > 1:
        active = v > 1
        v = tl.where(active, tl.where(v % 2 == 0, v // 2, 3 * v + 1), v)
        steps += active.to(tl.int32)
    tl.store(steps_ptr + offs, steps, mask=mask)


def _collatz_args(gen: torch.Generator) -> KernelArgs:
    n = 500
    return {
        "x_ptr": torch.randint(1, 1000, (n,), generator=gen, dtype=torch.int32),
        "steps_ptr": torch.empty(n, dtype=torch.int32),
        "n": n,
    }


def _collatz_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    steps = []
    for start in a["x_ptr"].tolist():
        v, k = start, 0
        while v > 1:
            v = v // 2 if v % 2 == 0 else 3 * v + 1
            k += 1
        steps.append(k)
    return {"steps_ptr": torch.tensor(steps, dtype=torch.int32)}


# ---------------------------------------------------------------------------------------------------
# scf.if: clip each row to a maximum L2 norm
# ---------------------------------------------------------------------------------------------------


@triton.jit
def row_clip_norm_kernel(x_ptr, out_ptr, clipped_ptr, n_cols, max_norm, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    sq = tl.sum(x * x, axis=0)
    clipped = tl.full((), 0, tl.int32)
    # A branch on a per-program value: only rows over the limit pay for the sqrt and the rescale.
    if sq > max_norm * max_norm:
        x = x * (max_norm / tl.sqrt(sq))
        clipped = tl.full((), 1, tl.int32)
    tl.store(out_ptr + row * n_cols + cols, x, mask=mask)
    tl.store(clipped_ptr + row, clipped)


def _clip_args(gen: torch.Generator) -> KernelArgs:
    m, n = 37, 300
    # Row norms are about 0.9 or about 52, far on either side of max_norm, so the branch taken is
    # not decided by rounding.
    scale = torch.where(torch.rand(m, 1, generator=gen) < 0.5, 0.05, 3.0)
    return {
        "x_ptr": torch.randn(m, n, generator=gen) * scale,
        "out_ptr": torch.empty(m, n),
        "clipped_ptr": torch.empty(m, dtype=torch.int32),
        "n_cols": n,
        "max_norm": 5.0,
    }


def _clip_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    x = a["x_ptr"].double()
    norm = x.norm(dim=1, keepdim=True)
    over = norm > a["max_norm"]
    out = torch.where(over, x * (a["max_norm"] / norm), x)
    return {"out_ptr": out.float(), "clipped_ptr": over.squeeze(1).to(torch.int32)}


# ---------------------------------------------------------------------------------------------------
# scf.for over a runtime trip count: Horner's rule
# ---------------------------------------------------------------------------------------------------


@triton.jit
def horner_kernel(x_ptr, coef_ptr, out_ptr, n, n_coef, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    # Coefficients are stored lowest degree first; Horner walks them from the highest.
    for i in range(n_coef):
        c = tl.load(coef_ptr + (n_coef - 1 - i))
        acc = acc * x + c
    tl.store(out_ptr + offs, acc, mask=mask)


def _horner_args(gen: torch.Generator) -> KernelArgs:
    n, n_coef = 3001, 9
    return {
        "x_ptr": (torch.rand(n, generator=gen) * 2.4 - 1.2),
        "coef_ptr": torch.randn(n_coef, generator=gen),
        "out_ptr": torch.empty(n),
        "n": n,
        "n_coef": n_coef,
    }


def _horner_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    x = a["x_ptr"].double()
    acc = torch.zeros_like(x)
    for c in reversed(a["coef_ptr"].double().tolist()):
        acc = acc * x + c
    return {"out_ptr": acc.float()}


KERNELS = [
    SuiteKernel(
        name="collatz_while",
        fn=collatz_steps_kernel,
        make_args=_collatz_args,
        grid=lambda a: (triton.cdiv(a["n"], 256),),
        reference=_collatz_ref,
        outputs=("steps_ptr",),
        constexprs={"BLOCK": 256},
        tags=("control-flow", "scf.while", "data-dependent", "reduction", "masked-tail", "int32"),
        description="Collatz step counts: a while loop until every lane of the block reaches 1",
    ),
    SuiteKernel(
        name="row_clip_norm_if",
        fn=row_clip_norm_kernel,
        make_args=_clip_args,
        grid=lambda a: (a["x_ptr"].shape[0],),
        reference=_clip_ref,
        outputs=("out_ptr", "clipped_ptr"),
        constexprs={"BLOCK": 512},
        atol=1e-6,
        rtol=1e-5,
        tags=("control-flow", "scf.if", "per-program-branch", "reduction", "masked-tail", "fp32"),
        description="clip each row to L2 norm <= max_norm, branching on the row's own norm",
    ),
    SuiteKernel(
        name="horner_for",
        fn=horner_kernel,
        make_args=_horner_args,
        grid=lambda a: (triton.cdiv(a["n"], 1024),),
        reference=_horner_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK": 1024},
        atol=1e-5,
        rtol=1e-5,
        tags=("control-flow", "scf.for", "runtime-trip-count", "polynomial", "masked-tail", "fp32"),
        description="Horner evaluation of a polynomial whose coefficient count is a runtime argument",
    ),
]
