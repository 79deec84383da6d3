"""Convolution kernels: 2D convolution as an implicit GEMM, in NCHW and in NHWC (channels-last) layout.

The convolution y[n, k, p, q] = Σ_{c,r,s} x[n, c, p·σh − πh + r·δh, q·σw − πw + s·δw] · w[k, c, r, s] + bias[k]
is the GEMM (N·P·Q × C·R·S) @ (C·R·S × K): rows are output pixels, columns output channels. The kernel
never materializes the im2col matrix; it decodes each A-tile element's (n, p, q) and (c, r, s) with
index arithmetic and masks taps that fall into the padding. Every tensor is addressed through its
strides, so one kernel serves both layouts; the GEMM's K order follows the layout so that consecutive
K indices are adjacent in memory (s fastest for NCHW, c fastest for NHWC).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from .matmul import dot_acc, grouped_tile, unit_strides
from .spec import KernelArgs, SuiteKernel

_BLOCK_M, _BLOCK_N, _BLOCK_K, _GROUP_M = 64, 32, 32, 4


@triton.jit
def conv2d_implicit_gemm_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    N,
    C,
    H,
    W,
    K,
    P,
    Q,
    stride_h,
    stride_w,
    pad_h,
    pad_w,
    dil_h,
    dil_w,
    sxn,
    sxc,
    sxh,
    sxw,
    swk,
    swc,
    swr,
    sws,
    syn,
    syk,
    syp,
    syq,
    R: tl.constexpr,
    S: tl.constexpr,
    CHANNELS_LAST_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PRECISION: tl.constexpr,
):
    gemm_m = N * P * Q
    gemm_k = C * R * S
    pid_m, pid_n = grouped_tile(tl.program_id(0), gemm_m, K, BLOCK_M, BLOCK_N, GROUP_M)

    # Output pixel of each GEMM row, and the input corner its filter window starts at.
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < gemm_m
    img = offs_m // (P * Q)
    pq = offs_m % (P * Q)
    out_p = pq // Q
    out_q = pq % Q
    ih0 = out_p * stride_h - pad_h
    iw0 = out_q * stride_w - pad_w
    x_rows = x_ptr + img * sxn

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, gemm_k, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < gemm_k
        if CHANNELS_LAST_K:
            c = kk % C
            tap = kk // C
        else:
            c = kk // (R * S)
            tap = kk % (R * S)
        r = tap // S
        s = tap % S
        ih = ih0[:, None] + (r * dil_h)[None, :]
        iw = iw0[:, None] + (s * dil_w)[None, :]
        # taps in the zero padding load 0; their (possibly negative) addresses are never read
        inside = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        a_mask = m_ok[:, None] & k_ok[None, :] & inside
        a = tl.load(x_rows[:, None] + c[None, :] * sxc + ih * sxh + iw * sxw, mask=a_mask, other=0.0)
        w_off = c * swc + r * swr + s * sws
        b = tl.load(w_ptr + w_off[:, None] + offs_n[None, :] * swk, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = dot_acc(a, b, acc, PRECISION)

    acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y_off = img * syn + out_p * syp + out_q * syq
    y_ptrs = y_ptr + y_off[:, None] + offs_n[None, :] * syk
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@dataclass(frozen=True)
class ConvCase:
    """One convolution problem: shapes, hyper-parameters, layout and element type."""

    batch: int
    in_ch: int
    height: int
    width: int
    out_ch: int
    kernel: int
    stride: int
    pad: int
    dilation: int
    channels_last: bool
    dtype: torch.dtype

    def out_size(self, size: int) -> int:
        return (size + 2 * self.pad - self.dilation * (self.kernel - 1) - 1) // self.stride + 1

    @property
    def unit(self) -> tuple[str, ...]:
        """The stride arguments that are 1 in this layout (the innermost dimension of each tensor)."""
        return ("sxc", "swc", "syk") if self.channels_last else ("sxw", "sws", "syq")


def _conv_args(case: ConvCase) -> Callable[[torch.Generator], KernelArgs]:
    def make(gen: torch.Generator) -> KernelArgs:
        fmt = torch.channels_last if case.channels_last else torch.contiguous_format
        fan_in = case.in_ch * case.kernel * case.kernel
        x = torch.randn(case.batch, case.in_ch, case.height, case.width, generator=gen)
        w = torch.randn(case.out_ch, case.in_ch, case.kernel, case.kernel, generator=gen) / math.sqrt(fan_in)
        bias = torch.randn(case.out_ch, generator=gen)
        p, q = case.out_size(case.height), case.out_size(case.width)
        y = torch.empty(case.batch, case.out_ch, p, q, dtype=case.dtype, memory_format=fmt)
        x = x.to(case.dtype).contiguous(memory_format=fmt)
        w = w.to(case.dtype).contiguous(memory_format=fmt)
        args: KernelArgs = {
            "x_ptr": x, "w_ptr": w, "bias_ptr": bias.to(case.dtype), "y_ptr": y,
            "N": case.batch, "C": case.in_ch, "H": case.height, "W": case.width, "K": case.out_ch, "P": p, "Q": q,
            "stride_h": case.stride, "stride_w": case.stride, "pad_h": case.pad, "pad_w": case.pad,
            "dil_h": case.dilation, "dil_w": case.dilation,
        }
        for prefix, t in (("sx", x), ("sw", w), ("sy", y)):
            names = ("n", "c", "h", "w") if prefix == "sx" else ("k", "c", "r", "s") if prefix == "sw" else ("n", "k", "p", "q")
            args.update(zip((prefix + d for d in names), t.stride(), strict=True))
        return args

    return make


def _conv_ref(case: ConvCase) -> Callable[[Mapping[str, Any]], dict[str, torch.Tensor]]:
    def ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        y = torch.nn.functional.conv2d(
            a["x_ptr"].double(), a["w_ptr"].double(), a["bias_ptr"].double(),
            stride=case.stride, padding=case.pad, dilation=case.dilation,
        )
        return {"y_ptr": y.to(case.dtype)}

    return ref


def _conv(name: str, case: ConvCase, precision: str, tol: float, tags: tuple[str, ...], description: str) -> SuiteKernel:
    return SuiteKernel(
        name=name,
        fn=conv2d_implicit_gemm_kernel,
        make_args=unit_strides(_conv_args(case), case.unit),
        grid=lambda a: (triton.cdiv(a["N"] * a["P"] * a["Q"], _BLOCK_M) * triton.cdiv(a["K"], _BLOCK_N),),
        reference=_conv_ref(case),
        outputs=("y_ptr",),
        constexprs={
            "R": case.kernel, "S": case.kernel, "CHANNELS_LAST_K": case.channels_last,
            "BLOCK_M": _BLOCK_M, "BLOCK_N": _BLOCK_N, "BLOCK_K": _BLOCK_K, "GROUP_M": _GROUP_M,
            "PRECISION": precision, **dict.fromkeys(case.unit, 1),
        },
        num_warps=4,
        num_stages=2,
        atol=tol,
        rtol=tol,
        tags=("conv2d", "implicit-gemm", *tags, "bias", "scf.for", "masked-tail"),
        description=description,
    )


KERNELS = [
    _conv(
        "conv2d_nchw_fp16",
        ConvCase(2, 13, 17, 19, 20, 3, 1, 1, 1, channels_last=False, dtype=torch.float16),
        "ieee", 1e-2, ("nchw", "fp16", "fp32-acc", "padding"),
        "3×3 conv, stride 1, pad 1, + bias, NCHW fp16 (fp32 accumulation) as an implicit GEMM vs F.conv2d",
    ),
    _conv(
        "conv2d_nhwc_fp32_tf32",
        ConvCase(2, 16, 14, 14, 24, 3, 2, 2, 2, channels_last=True, dtype=torch.float32),
        "tf32", 5e-3, ("nhwc", "channels-last", "fp32", "tf32", "strided", "dilated", "padding"),
        "3×3 conv, stride 2, pad 2, dilation 2, + bias, NHWC fp32 with tf32 dots, as an implicit GEMM vs F.conv2d",
    ),
]
