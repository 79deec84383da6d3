"""Quantized matrix-multiply kernels: int8 weights dequantized inside the GEMM.

- `int8_weight_matmul_fp16`: fp16 activations × int8 weights stored (N, K) with one fp16 scale per output
  channel (W8A16). The int8 tile is widened to fp16 (exact) for an fp16 tensor-core dot; since the scale
  is constant along K it is applied once, to the fp32 accumulator, in the epilogue.
- `int8_weight_matmul_fp32_grouped`: fp32 activations × int8 weights with one fp32 scale per
  (K-group, output channel). The scale changes along K, so each tile is dequantized before its dot.
- `int8_w8a8_matmul`: int8 activations (per-row scales) × int8 weights (per-channel scales), an int8
  dot with an exact int32 accumulator, both scales applied in the epilogue.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .matmul import dot_acc, grouped_tile, unit_strides
from .spec import KernelArgs, SuiteKernel

_BLOCK_M, _BLOCK_N = 64, 64
_GROUP_M = 4


def _grid(a: Mapping[str, Any]) -> tuple[int, ...]:
    return (triton.cdiv(a["M"], _BLOCK_M) * triton.cdiv(a["N"], _BLOCK_N),)


def _quantize(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization of `x` with one scale per slice along `dim` (amax / 127)."""
    scale = x.abs().amax(dim=dim, keepdim=True).clamp_min(1e-8) / 127.0
    q = torch.round(x / scale).clamp(-127, 127).to(torch.int8)
    return q, scale.squeeze(dim)


# --------------------------------------------------------------------------- W8A16, per-channel


@triton.jit
def int8_weight_matmul_kernel(
    a_ptr,
    w_ptr,
    scale_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_wn,
    stride_wk,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """c = (a @ wᵀ) · scale[None, :], w int8 (N, K)."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    w_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0)
        acc = dot_acc(a, w.to(a.dtype), acc, "ieee")
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
    scale = tl.load(scale_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    acc = acc * scale[None, :]
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


_W8A16 = (93, 144, 208)  # M, N, K; rows of 208 int8/fp16 elements start 16-byte aligned


def _w8a16_args(gen: torch.Generator) -> KernelArgs:
    m, n, k = _W8A16
    a = torch.randn(m, k, generator=gen).half()
    w_q, w_scale = _quantize(torch.randn(n, k, generator=gen) / math.sqrt(k), dim=1)
    c = torch.empty(m, n, dtype=torch.float16)
    return {
        "a_ptr": a, "w_ptr": w_q, "scale_ptr": w_scale.half(), "c_ptr": c, "M": m, "N": n, "K": k,
        "stride_am": a.stride(0), "stride_ak": a.stride(1),
        "stride_wn": w_q.stride(0), "stride_wk": w_q.stride(1),
        "stride_cm": c.stride(0), "stride_cn": c.stride(1),
    }


def _w8a16_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    w = a["w_ptr"].double() * a["scale_ptr"].double()[:, None]
    return {"c_ptr": (a["a_ptr"].double() @ w.t()).half()}


_W8A16_UNIT = ("stride_ak", "stride_wk", "stride_cn")


# --------------------------------------------------------------------------- fp32 activations, grouped scales


@triton.jit
def int8_weight_grouped_matmul_kernel(
    a_ptr,
    w_ptr,
    scale_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_wk,
    stride_wn,
    stride_sg,
    stride_sn,
    stride_cm,
    stride_cn,
    GROUP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """c = a @ (w · scale[k // GROUP_K, n]), w int8 (K, N), dequantized tile by tile."""
    # a K tile must not straddle two scale groups
    tl.static_assert(GROUP_K % BLOCK_K == 0)
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    w_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0)
        scale = tl.load(scale_ptr + (k0 // GROUP_K) * stride_sg + offs_n * stride_sn, mask=n_ok, other=0.0)
        acc = dot_acc(a, w.to(tl.float32) * scale[None, :], acc, "ieee")
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


_GROUPED = (77, 91, 200)  # M, N, K: K ends in a partial scale group (200 = 3·64 + 8)
_GROUP_K = 64


def _grouped_args(gen: torch.Generator) -> KernelArgs:
    m, n, k = _GROUPED
    groups = triton.cdiv(k, _GROUP_K)
    a = torch.randn(m, k, generator=gen)
    w = torch.randn(k, n, generator=gen) / math.sqrt(k)
    # pad K to whole groups so each (group, channel) slice quantizes with its own amax
    w_pad = torch.zeros(groups * _GROUP_K, n)
    w_pad[:k] = w
    w_q, scale = _quantize(w_pad.view(groups, _GROUP_K, n), dim=1)
    w_q = w_q.view(groups * _GROUP_K, n)[:k].contiguous()
    c = torch.empty(m, n)
    return {
        "a_ptr": a, "w_ptr": w_q, "scale_ptr": scale, "c_ptr": c, "M": m, "N": n, "K": k,
        "stride_am": a.stride(0), "stride_ak": a.stride(1),
        "stride_wk": w_q.stride(0), "stride_wn": w_q.stride(1),
        "stride_sg": scale.stride(0), "stride_sn": scale.stride(1),
        "stride_cm": c.stride(0), "stride_cn": c.stride(1),
    }


def _grouped_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    k = a["K"]
    scale = a["scale_ptr"].double().repeat_interleave(_GROUP_K, dim=0)[:k]
    w = a["w_ptr"].double() * scale
    return {"c_ptr": (a["a_ptr"].double() @ w).float()}


_GROUPED_UNIT = ("stride_ak", "stride_wn", "stride_sn", "stride_cn")


# --------------------------------------------------------------------------- W8A8, int32 accumulation


@triton.jit
def int8_w8a8_matmul_kernel(
    a_ptr,
    w_ptr,
    a_scale_ptr,
    w_scale_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_wn,
    stride_wk,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """c = (a_q @ w_qᵀ) · a_scale[:, None] · w_scale[None, :], the int8 products summed exactly in int32."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    w_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0)
        acc = tl.dot(a, w, acc, out_dtype=tl.int32)
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
    a_scale = tl.load(a_scale_ptr + offs_m, mask=m_ok, other=0.0)
    w_scale = tl.load(w_scale_ptr + offs_n, mask=n_ok, other=0.0)
    out = acc.to(tl.float32) * a_scale[:, None] * w_scale[None, :]
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


_W8A8 = (157, 144, 208)  # M, N, K


def _w8a8_args(gen: torch.Generator) -> KernelArgs:
    m, n, k = _W8A8
    a_q, a_scale = _quantize(torch.randn(m, k, generator=gen), dim=1)
    w_q, w_scale = _quantize(torch.randn(n, k, generator=gen) / math.sqrt(k), dim=1)
    c = torch.empty(m, n, dtype=torch.float16)
    return {
        "a_ptr": a_q, "w_ptr": w_q, "a_scale_ptr": a_scale, "w_scale_ptr": w_scale, "c_ptr": c,
        "M": m, "N": n, "K": k,
        "stride_am": a_q.stride(0), "stride_ak": a_q.stride(1),
        "stride_wn": w_q.stride(0), "stride_wk": w_q.stride(1),
        "stride_cm": c.stride(0), "stride_cn": c.stride(1),
    }


def _w8a8_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    exact = a["a_ptr"].double() @ a["w_ptr"].double().t()  # integers below 2**53: exact in float64
    out = exact * a["a_scale_ptr"].double()[:, None] * a["w_scale_ptr"].double()[None, :]
    return {"c_ptr": out.half()}


_W8A8_UNIT = ("stride_ak", "stride_wk", "stride_cn")


# --------------------------------------------------------------------------- the suite


def _blocks(block_k: int) -> dict[str, int]:
    return {"BLOCK_M": _BLOCK_M, "BLOCK_N": _BLOCK_N, "BLOCK_K": block_k, "GROUP_M": _GROUP_M}


KERNELS = [
    SuiteKernel(
        name="int8_weight_matmul_fp16",
        fn=int8_weight_matmul_kernel,
        make_args=unit_strides(_w8a16_args, _W8A16_UNIT),
        grid=_grid,
        reference=_w8a16_ref,
        outputs=("c_ptr",),
        constexprs={**_blocks(32), **dict.fromkeys(_W8A16_UNIT, 1)},
        num_warps=4,
        num_stages=3,
        atol=1e-2,
        rtol=1e-2,
        tags=("matmul", "quant", "int8", "w8a16", "fp16", "per-channel-scale", "dequant", "scf.for", "masked-tail"),
        description="W8A16: fp16 A @ dequant(int8 W stored (N, K))ᵀ, per-output-channel fp16 scale in the epilogue",
    ),
    SuiteKernel(
        name="int8_weight_matmul_fp32_grouped",
        fn=int8_weight_grouped_matmul_kernel,
        make_args=unit_strides(_grouped_args, _GROUPED_UNIT),
        grid=_grid,
        reference=_grouped_ref,
        outputs=("c_ptr",),
        constexprs={"GROUP_K": _GROUP_K, **_blocks(32), **dict.fromkeys(_GROUPED_UNIT, 1)},
        num_warps=4,
        num_stages=3,
        atol=1e-5,
        rtol=1e-5,
        tags=("matmul", "quant", "int8", "fp32", "ieee", "group-scale", "dequant", "scf.for", "masked-tail"),
        description="fp32 A @ dequant(int8 W), one fp32 scale per 64-deep K group and channel, dequantized per tile",
    ),
    SuiteKernel(
        name="int8_w8a8_matmul",
        fn=int8_w8a8_matmul_kernel,
        make_args=unit_strides(_w8a8_args, _W8A8_UNIT),
        grid=_grid,
        reference=_w8a8_ref,
        outputs=("c_ptr",),
        constexprs={**_blocks(64), **dict.fromkeys(_W8A8_UNIT, 1)},
        num_warps=4,
        num_stages=3,
        atol=1e-2,
        rtol=1e-2,
        tags=("matmul", "quant", "int8", "w8a8", "int32-acc", "per-row-scale", "per-channel-scale", "scf.for",
              "masked-tail"),
        description="W8A8: int8 A @ int8 Wᵀ with exact int32 accumulation, per-row × per-channel scales, fp16 out",
    ),
]
