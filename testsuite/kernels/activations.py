"""Elementwise and fused activation kernels.

Owns: a 2D-tiled GELU (tanh approximation) with a broadcast bias in fp32, SwiGLU (SiLU of one half times
the other half) in bf16, leaky-ReLU fused with a residual add in fp16, and a clamp/where kernel on int32.
Every shape leaves a masked tail in each tiled dimension.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .spec import KernelArgs, SuiteKernel

# ---------------------------------------------------------------------------------------------------
# GELU (tanh approximation) with a per-column bias, 2D tiles
# ---------------------------------------------------------------------------------------------------


@triton.jit
def gelu_tanh_bias_kernel(
    x_ptr,
    bias_ptr,
    out_ptr,
    n_rows,
    n_cols,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    b = tl.load(bias_ptr + cols, mask=cols < n_cols, other=0.0)
    z = x + b[None, :]
    # 0.5 * (1 + tanh(u)) == sigmoid(2u): this form has no cancellation where tanh(u) is close to -1,
    # and needs only exp, which the interpreter and both GPU backends provide.
    u = 0.7978845608028654 * (z + 0.044715 * z * z * z)
    y = z / (1.0 + tl.exp(-2.0 * u))
    tl.store(out_ptr + offs, y, mask=mask)


def _gelu_args(gen: torch.Generator) -> KernelArgs:
    m, n = 37, 300
    return {
        "x_ptr": torch.randn(m, n, generator=gen) * 2.0,
        "bias_ptr": torch.randn(n, generator=gen),
        "out_ptr": torch.empty(m, n),
        "n_rows": m,
        "n_cols": n,
    }


def _gelu_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    z = a["x_ptr"].double() + a["bias_ptr"].double()[None, :]
    u = math.sqrt(2.0 / math.pi) * (z + 0.044715 * z**3)
    return {"out_ptr": (0.5 * z * (1.0 + torch.tanh(u))).float()}


# ---------------------------------------------------------------------------------------------------
# SwiGLU: out = silu(x[:, :H]) * x[:, H:], bf16 in and out, fp32 math
# ---------------------------------------------------------------------------------------------------


@triton.jit
def swiglu_kernel(x_ptr, out_ptr, hidden, BLOCK_H: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = cols < hidden
    # The gate and the up projection sit side by side in one row of width 2 * hidden.
    base = x_ptr + row.to(tl.int64) * (2 * hidden)
    gate = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(base + hidden + cols, mask=mask, other=0.0).to(tl.float32)
    silu = gate / (1.0 + tl.exp(-gate))
    tl.store(out_ptr + row.to(tl.int64) * hidden + cols, (silu * up).to(tl.bfloat16), mask=mask)


def _swiglu_args(gen: torch.Generator) -> KernelArgs:
    m, h = 41, 200
    return {
        "x_ptr": (torch.randn(m, 2 * h, generator=gen) * 3.0).to(torch.bfloat16),
        "out_ptr": torch.empty(m, h, dtype=torch.bfloat16),
        "hidden": h,
    }


def _swiglu_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    h = a["hidden"]
    x = a["x_ptr"].float()
    gate, up = x[:, :h], x[:, h:]
    return {"out_ptr": (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)}


# ---------------------------------------------------------------------------------------------------
# Leaky ReLU + residual add in fp16
# ---------------------------------------------------------------------------------------------------


@triton.jit
def leaky_relu_residual_kernel(x_ptr, res_ptr, out_ptr, n, slope, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.where(x >= 0.0, x, x * slope) + r
    tl.store(out_ptr + offs, y.to(tl.float16), mask=mask)


def _leaky_args(gen: torch.Generator) -> KernelArgs:
    n = 4099
    return {
        "x_ptr": (torch.randn(n, generator=gen) * 4.0).half(),
        "res_ptr": torch.randn(n, generator=gen).half(),
        "out_ptr": torch.empty(n, dtype=torch.float16),
        "n": n,
        "slope": 0.01,
    }


def _leaky_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    x = a["x_ptr"].float()
    slope = torch.tensor(a["slope"], dtype=torch.float32)
    y = torch.where(x >= 0, x, x * slope) + a["res_ptr"].float()
    return {"out_ptr": y.half()}


# ---------------------------------------------------------------------------------------------------
# Clamp with where on int32
# ---------------------------------------------------------------------------------------------------


@triton.jit
def clamp_where_i32_kernel(x_ptr, out_ptr, n, lo, hi, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0)
    y = tl.where(x < lo, lo, tl.where(x > hi, hi, x))
    tl.store(out_ptr + offs, y, mask=mask)


def _clamp_args(gen: torch.Generator) -> KernelArgs:
    n = 3001
    return {
        "x_ptr": torch.randint(-1000, 1000, (n,), generator=gen, dtype=torch.int32),
        "out_ptr": torch.empty(n, dtype=torch.int32),
        "n": n,
        "lo": -100,
        "hi": 250,
    }


def _clamp_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {"out_ptr": a["x_ptr"].clamp(a["lo"], a["hi"])}


KERNELS = [
    SuiteKernel(
        name="gelu_tanh_bias",
        fn=gelu_tanh_bias_kernel,
        make_args=_gelu_args,
        grid=lambda a: (triton.cdiv(a["n_rows"], 16), triton.cdiv(a["n_cols"], 128)),
        reference=_gelu_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK_M": 16, "BLOCK_N": 128},
        atol=1e-6,
        rtol=1e-5,
        tags=("activation", "gelu", "fused", "2d-tile", "masked-tail", "fp32"),
        description="GELU (tanh approximation) of x + bias[col] on 2D tiles with tails in both dims",
    ),
    SuiteKernel(
        name="swiglu_bf16",
        fn=swiglu_kernel,
        make_args=_swiglu_args,
        grid=lambda a: (a["x_ptr"].shape[0], triton.cdiv(a["hidden"], 128)),
        reference=_swiglu_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK_H": 128},
        atol=1e-5,
        rtol=1e-2,
        tags=("activation", "silu", "swiglu", "fused", "masked-tail", "bf16"),
        description="SwiGLU: silu(x[:, :H]) * x[:, H:] in bf16 with fp32 math",
    ),
    SuiteKernel(
        name="leaky_relu_residual_fp16",
        fn=leaky_relu_residual_kernel,
        make_args=_leaky_args,
        grid=lambda a: (triton.cdiv(a["n"], 1024),),
        reference=_leaky_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK": 1024},
        atol=1e-3,
        rtol=1e-3,
        tags=("activation", "leaky-relu", "residual", "fused", "masked-tail", "fp16"),
        description="leaky_relu(x, slope) + residual in fp16 with fp32 math",
    ),
    SuiteKernel(
        name="clamp_where_i32",
        fn=clamp_where_i32_kernel,
        make_args=_clamp_args,
        grid=lambda a: (triton.cdiv(a["n"], 512),),
        reference=_clamp_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK": 512},
        tags=("elementwise", "clamp", "where", "masked-tail", "int32"),
        description="clamp of int32 values to runtime bounds [lo, hi] with nested where",
    ),
]
