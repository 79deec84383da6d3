"""Matrix-multiply kernels: tiled GEMMs over fp16, bf16, fp32 (ieee, tf32, tf32x3, bf16x3) and fp8
(e4m3, e5m2) inputs, a GEMM with a fused bias + activation + residual epilogue, and a batched GEMM.

Every kernel here walks K in an `scf.for` loop of `tl.dot`s with an fp32 accumulator, and every problem
size is chosen so that M, N and K all leave a masked tail in the last tile. The `@triton.jit` helpers
`grouped_tile`, `dot_acc` and `accumulate_tile` and the host helper `unit_strides` are shared with the
other GEMM-shaped modules (attention, conv, quant).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .spec import KernelArgs, SuiteKernel

# Problem sizes (M, N, K); none is a multiple of its block, so every dimension has a masked tail.
# ODD rows start at any element; in ALIGNED every row stride is a multiple of 16 elements, so that rows
# start 16-byte aligned and the compiled 8/16-bit GEMMs get vector loads and async-copy pipelining, as
# real fp16/bf16/fp8 GEMMs do (fp32 rows pipeline element-wise either way).
ODD = (157, 91, 123)
ALIGNED = (157, 144, 112)
_BLOCK_M, _BLOCK_N, _BLOCK_K = 64, 64, 32
_GROUP_M = 4

_FP16_TOL = {"atol": 1e-2, "rtol": 1e-2}  # fp16/bf16/fp8 output: a few ulps of an O(1) value
_TF32_TOL = {"atol": 5e-3, "rtol": 5e-3}  # 10-bit mantissa inputs, K≈120, O(1) outputs
_FP32_TOL = {"atol": 1e-5, "rtol": 1e-5}  # ieee / tf32x3: fp32-accurate products, fp32 accumulation
_BF16X3_TOL = {"atol": 1e-4, "rtol": 1e-4}  # bf16 hi+lo split keeps ~16 mantissa bits of each input

#: True when kernels run in Triton's interpreter (the runner sets TRITON_INTERPRET before it imports kernel
#: modules). Triton 3.6's interpreter keeps bf16 values as their raw uint16 bits and its `tl.dot`
#: multiplies those bits (upstream calls bf16 arithmetic unsupported there); it also knows only the
#: input precisions ieee/tf32/tf32x3 and computes every dot in fp32 whatever the precision. So under the
#: interpreter `dot_acc` widens bf16 tiles to fp32 (exact, and what a bf16 MMA with fp32 accumulation
#: computes) and asks for "ieee". Compiled code never takes that branch.
INTERPRETED: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


# --------------------------------------------------------------------------- shared jit helpers


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Map a linear program id to (tile row, tile column), GROUP_M tile rows at a time.

    Consecutive programs then share the same few A row-panels and sweep the B column-panels together,
    which keeps the working set in L2 on a GPU; the result does not depend on the order.
    """
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_M * tiles_n
    group = pid // tiles_per_group
    first_m = group * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % tiles_per_group) % group_rows
    pid_n = (pid % tiles_per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def dot_acc(a, b, acc, PRECISION: tl.constexpr):
    """acc + a @ b, the one place a GEMM here calls `tl.dot` (see INTERPRETED for the interpreter's detour)."""
    if INTERPRETED:
        if a.dtype == tl.bfloat16:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def accumulate_tile(
    a_ptr,
    b_ptr,
    offs_m,
    offs_n,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """fp32 (BLOCK_M, BLOCK_N) tile of A[offs_m, :] @ B[:, offs_n], K walked in BLOCK_K steps.

    Out-of-range rows, columns and the K tail load as 0, which adds nothing to the dot products.
    """
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    row_ok = offs_m[:, None] < M
    col_ok = offs_n[None, :] < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=row_ok & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok, other=0.0)
        acc = dot_acc(a, b, acc, PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


# --------------------------------------------------------------------------- plain GEMM


@triton.jit
def matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = accumulate_tile(
        a_ptr, b_ptr, offs_m, offs_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
        BLOCK_M, BLOCK_N, BLOCK_K, PRECISION,
    )
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def gemm_grid(a: Mapping[str, Any]) -> tuple[int, ...]:
    """One program per (BLOCK_M, BLOCK_N) output tile, for kernels with M and N parameters."""
    return (triton.cdiv(a["M"], _BLOCK_M) * triton.cdiv(a["N"], _BLOCK_N),)


def unit_strides(make: Callable[[torch.Generator], KernelArgs], names: tuple[str, ...]) -> Callable[[torch.Generator], KernelArgs]:
    """`make` without the stride arguments `names`, which must all be 1 and which the kernel's
    `constexprs` then pin to 1.

    Triton's JIT specializes an int argument equal to 1 as a constexpr at launch, so on a GPU these
    strides are compile-time 1s anyway (contiguous, vectorizable inner dimensions, pipelined loads);
    pinning them makes the ahead-of-time build compile that same specialization.
    """

    def wrapped(gen: torch.Generator) -> KernelArgs:
        args = make(gen)
        for name in names:
            if args.pop(name) != 1:
                raise ValueError(f"stride {name} is pinned to 1 but the arguments have another value")
        return args

    return wrapped


def _gemm_constexprs(precision: str, unit: tuple[str, ...]) -> dict[str, Any]:
    return {
        "BLOCK_M": _BLOCK_M, "BLOCK_N": _BLOCK_N, "BLOCK_K": _BLOCK_K, "GROUP_M": _GROUP_M,
        "PRECISION": precision, **dict.fromkeys(unit, 1),
    }


def _operands(gen: torch.Generator, m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 A (m, k) and B (k, n) whose product has entries of about unit size."""
    a = torch.randn(m, k, generator=gen)
    b = torch.randn(k, n, generator=gen) / math.sqrt(k)
    return a, b


def _matmul_args(shape: tuple[int, int, int], in_dtype: torch.dtype, out_dtype: torch.dtype,
                 b_k_major: bool) -> Callable[[torch.Generator], KernelArgs]:
    """`make_args` for `matmul_kernel`; with `b_k_major` B is stored as its transpose (N, K), as a
    Linear layer's weight is, and reaches the kernel through its strides."""

    def make(gen: torch.Generator) -> KernelArgs:
        m, n, k = shape
        a32, b32 = _operands(gen, m, n, k)
        a = a32.to(in_dtype)
        b = b32.t().contiguous().to(in_dtype).t() if b_k_major else b32.to(in_dtype)
        c = torch.empty(m, n, dtype=out_dtype)
        return {
            "a_ptr": a, "b_ptr": b, "c_ptr": c, "M": m, "N": n, "K": k,
            "stride_am": a.stride(0), "stride_ak": a.stride(1),
            "stride_bk": b.stride(0), "stride_bn": b.stride(1),
            "stride_cm": c.stride(0), "stride_cn": c.stride(1),
        }

    return make


def _matmul_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    # float64 so that the reference itself adds no rounding beyond the final cast
    c = a["a_ptr"].to(torch.float64) @ a["b_ptr"].to(torch.float64)
    return {"c_ptr": c.to(a["c_ptr"].dtype)}


def _gemm(name: str, shape: tuple[int, int, int], in_dtype: torch.dtype, out_dtype: torch.dtype, precision: str,
          tol: Mapping[str, float], tags: tuple[str, ...], description: str, b_k_major: bool = False,
          unsupported: tuple[str, ...] = ()) -> SuiteKernel:
    unit = ("stride_ak", "stride_bk" if b_k_major else "stride_bn", "stride_cn")
    return SuiteKernel(
        name=name,
        fn=matmul_kernel,
        make_args=unit_strides(_matmul_args(shape, in_dtype, out_dtype, b_k_major), unit),
        grid=gemm_grid,
        reference=_matmul_ref,
        outputs=("c_ptr",),
        constexprs=_gemm_constexprs(precision, unit),
        num_warps=4,
        num_stages=3,
        tags=("matmul", *tags, "scf.for", "masked-tail"),
        description=description,
        unsupported_backends=unsupported,
        **tol,
    )


# --------------------------------------------------------------------------- fused epilogue


@triton.jit
def matmul_bias_act_residual_kernel(
    a_ptr,
    b_ptr,
    bias_ptr,
    residual_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_rm,
    stride_rn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    ACTIVATION: tl.constexpr,
):
    """c = act(a @ b + bias) + residual, the epilogue applied to the fp32 accumulator in registers."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = accumulate_tile(
        a_ptr, b_ptr, offs_m, offs_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
        BLOCK_M, BLOCK_N, BLOCK_K, "ieee",
    )
    col_ok = offs_n < N
    mask = (offs_m[:, None] < M) & col_ok[None, :]
    acc += tl.load(bias_ptr + offs_n, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if ACTIVATION == "gelu":
        # exact (erf) GELU, the form torch.nn.functional.gelu computes by default
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    elif ACTIVATION == "relu":
        acc = tl.maximum(acc, 0.0)
    residual = tl.load(residual_ptr + offs_m[:, None] * stride_rm + offs_n[None, :] * stride_rn, mask=mask, other=0.0)
    acc += residual.to(tl.float32)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)


def _epilogue_args(dtype: torch.dtype) -> Callable[[torch.Generator], KernelArgs]:
    def make(gen: torch.Generator) -> KernelArgs:
        m, n, k = ALIGNED
        a32, b32 = _operands(gen, m, n, k)
        a, b = a32.to(dtype), b32.to(dtype)
        bias = torch.randn(n, generator=gen).to(dtype)
        residual = torch.randn(m, n, generator=gen).to(dtype)
        c = torch.empty(m, n, dtype=dtype)
        return {
            "a_ptr": a, "b_ptr": b, "bias_ptr": bias, "residual_ptr": residual, "c_ptr": c,
            "M": m, "N": n, "K": k,
            "stride_am": a.stride(0), "stride_ak": a.stride(1),
            "stride_bk": b.stride(0), "stride_bn": b.stride(1),
            "stride_rm": residual.stride(0), "stride_rn": residual.stride(1),
            "stride_cm": c.stride(0), "stride_cn": c.stride(1),
        }

    return make


def _epilogue_ref(activation: str) -> Callable[[Mapping[str, Any]], dict[str, torch.Tensor]]:
    def ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        x = a["a_ptr"].float() @ a["b_ptr"].float() + a["bias_ptr"].float()
        x = torch.nn.functional.gelu(x) if activation == "gelu" else torch.relu(x)
        return {"c_ptr": (x + a["residual_ptr"].float()).to(a["c_ptr"].dtype)}

    return ref


def _epilogue(name: str, dtype: torch.dtype, activation: str, tags: tuple[str, ...], description: str) -> SuiteKernel:
    unit = ("stride_ak", "stride_bn", "stride_rn", "stride_cn")
    return SuiteKernel(
        name=name,
        fn=matmul_bias_act_residual_kernel,
        make_args=unit_strides(_epilogue_args(dtype), unit),
        grid=gemm_grid,
        reference=_epilogue_ref(activation),
        outputs=("c_ptr",),
        constexprs={
            "BLOCK_M": _BLOCK_M, "BLOCK_N": _BLOCK_N, "BLOCK_K": _BLOCK_K, "GROUP_M": _GROUP_M,
            "ACTIVATION": activation, **dict.fromkeys(unit, 1),
        },
        num_warps=4,
        num_stages=3,
        tags=("matmul", *tags, "epilogue-fusion", activation, "bias", "residual", "scf.for", "masked-tail"),
        description=description,
        **_FP16_TOL,
    )


# --------------------------------------------------------------------------- batched GEMM

_BATCH, _BM, _BN, _BK = 3, 77, 45, 100


@triton.jit
def bmm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_ab,
    stride_am,
    stride_ak,
    stride_bb,
    stride_bk,
    stride_bn,
    stride_cb,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """c[i] = a[i] @ b[i]; grid axis 2 walks the batch, axes 0 and 1 the output tiles."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)  # batch offsets of large problems overflow int32
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = accumulate_tile(
        a_ptr + batch * stride_ab, b_ptr + batch * stride_bb, offs_m, offs_n, M, N, K,
        stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, "ieee",
    )
    c_ptrs = c_ptr + batch * stride_cb + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def _bmm_args(gen: torch.Generator) -> KernelArgs:
    a = torch.randn(_BATCH, _BM, _BK, generator=gen).half()
    # B arrives as (batch, N, K) storage, i.e. c = a @ b_storedᵀ as in attention's Q·Kᵀ: the kernel
    # sees the transpose only through the strides it is handed.
    b_stored = (torch.randn(_BATCH, _BN, _BK, generator=gen) / math.sqrt(_BK)).half()
    b = b_stored.transpose(1, 2)
    c = torch.empty(_BATCH, _BM, _BN, dtype=torch.float16)
    return {
        "a_ptr": a, "b_ptr": b_stored, "c_ptr": c, "M": _BM, "N": _BN, "K": _BK,
        "stride_ab": a.stride(0), "stride_am": a.stride(1), "stride_ak": a.stride(2),
        "stride_bb": b.stride(0), "stride_bk": b.stride(1), "stride_bn": b.stride(2),
        "stride_cb": c.stride(0), "stride_cm": c.stride(1), "stride_cn": c.stride(2),
    }


def _bmm_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    c = torch.bmm(a["a_ptr"].float(), a["b_ptr"].float().transpose(1, 2))
    return {"c_ptr": c.half()}


_BMM_UNIT = ("stride_ak", "stride_bk", "stride_cn")


# --------------------------------------------------------------------------- the suite

KERNELS = [
    _gemm("matmul_fp16", ALIGNED, torch.float16, torch.float16, "ieee", _FP16_TOL, ("fp16", "fp32-acc", "grouped-order"),
          "C = A @ B, fp16 inputs and output, fp32 accumulation, grouped tile order"),
    _gemm("matmul_bf16", ALIGNED, torch.bfloat16, torch.bfloat16, "ieee", _FP16_TOL, ("bf16", "fp32-acc", "grouped-order"),
          "C = A @ B, bf16 inputs and output, fp32 accumulation"),
    _gemm("matmul_fp32_ieee", ODD, torch.float32, torch.float32, "ieee", _FP32_TOL, ("fp32", "ieee"),
          "C = A @ B in fp32 with input_precision='ieee' (no tensor-core rounding of the inputs)"),
    _gemm("matmul_fp32_tf32", ODD, torch.float32, torch.float32, "tf32", _TF32_TOL, ("fp32", "tf32"),
          "C = A @ B in fp32 with input_precision='tf32' (inputs rounded to a 10-bit mantissa)"),
    _gemm("matmul_fp32_tf32x3", ODD, torch.float32, torch.float32, "tf32x3", _FP32_TOL, ("fp32", "tf32x3"),
          "C = A @ B in fp32 with input_precision='tf32x3' (3 tf32 products recover fp32 accuracy); "
          "Triton 3.6's HIP backend rejects tf32x3 (gfx942 allows ieee, tf32, bf16x3, bf16x6)",
          unsupported=("hip",)),
    _gemm("matmul_fp32_bf16x3", ODD, torch.float32, torch.float32, "bf16x3", _BF16X3_TOL, ("fp32", "bf16x3"),
          "C = A @ B in fp32 with input_precision='bf16x3' (3 bf16 products, ~16-bit mantissa accuracy)"),
    _gemm("matmul_fp8e4nv", ALIGNED, torch.float8_e4m3fn, torch.float16, "ieee", _FP16_TOL, ("fp8", "fp8e4nv", "fp32-acc", "b-k-major"),
          "C = A @ B with fp8 e4m3 (OCP) inputs, B stored (N, K), fp32 accumulation, fp16 output", b_k_major=True),
    _gemm("matmul_fp8e5", ALIGNED, torch.float8_e5m2, torch.float16, "ieee", _FP16_TOL, ("fp8", "fp8e5", "fp32-acc", "b-k-major"),
          "C = A @ B with fp8 e5m2 (OCP) inputs, B stored (N, K), fp32 accumulation, fp16 output", b_k_major=True),
    _epilogue("matmul_fp16_bias_gelu_residual", torch.float16, "gelu", ("fp16", "erf"),
              "C = gelu(A @ B + bias) + residual, fp16 in/out, epilogue fused on the fp32 accumulator"),
    _epilogue("matmul_bf16_bias_relu_residual", torch.bfloat16, "relu", ("bf16",),
              "C = relu(A @ B + bias) + residual, bf16 in/out, epilogue fused on the fp32 accumulator"),
    SuiteKernel(
        name="bmm_fp16_bt",
        fn=bmm_kernel,
        make_args=unit_strides(_bmm_args, _BMM_UNIT),
        grid=lambda a: (triton.cdiv(a["M"], 32), triton.cdiv(a["N"], 32), a["a_ptr"].shape[0]),
        reference=_bmm_ref,
        outputs=("c_ptr",),
        constexprs={"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, **dict.fromkeys(_BMM_UNIT, 1)},
        num_warps=4,
        num_stages=3,
        tags=("matmul", "batched", "fp16", "3d-grid", "transposed-b", "scf.for", "masked-tail"),
        description="C[i] = A[i] @ B[i]ᵀ over a batch on grid axis 2, B given as (batch, N, K) via strides, fp16",
        **_FP16_TOL,
    ),
]
