"""A GEMM whose 1-D grid is split row-major (`pid // tiles_n`, `pid % tiles_n`), without the
GROUP_SIZE_M ordering the suite's GEMMs use: the input the `grouped-pid` pass rewrites, and the kernel
its execution tests and GPU benchmark compare against. Not in `KERNELS` (the suite's GEMMs already
group their programs); use `ROWMAJOR_MATMULS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .matmul import _FP16_TOL, _FP32_TOL, ODD, _matmul_args, _matmul_ref, accumulate_tile, unit_strides
from .spec import SuiteKernel

_BLOCK_M, _BLOCK_N, _BLOCK_K = 64, 64, 32


@triton.jit
def matmul_rowmajor_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // tiles_n
    pid_n = pid % tiles_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = accumulate_tile(
        a_ptr, b_ptr, offs_m, offs_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
        BLOCK_M, BLOCK_N, BLOCK_K, PRECISION,
    )
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def rowmajor_matmul(name: str, shape: tuple[int, int, int], in_dtype: torch.dtype, precision: str,
                    tol: dict[str, float], blocks: tuple[int, int, int] = (_BLOCK_M, _BLOCK_N, _BLOCK_K),
                    num_warps: int = 4, num_stages: int = 3) -> SuiteKernel:
    """The row-major GEMM on `shape` (M, N, K) with `blocks` (BLOCK_M, BLOCK_N, BLOCK_K), as a suite-style
    kernel (reference, inputs, launch grid)."""
    unit = ("stride_ak", "stride_bn", "stride_cn")
    block_m, block_n, block_k = blocks

    def grid(a: Mapping[str, Any]) -> tuple[int, ...]:
        return (triton.cdiv(a["M"], block_m) * triton.cdiv(a["N"], block_n),)

    return SuiteKernel(
        name=name,
        fn=matmul_rowmajor_kernel,
        make_args=unit_strides(_matmul_args(shape, in_dtype, in_dtype, False), unit),
        grid=grid,
        reference=_matmul_ref,
        outputs=("c_ptr",),
        constexprs={"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "PRECISION": precision,
                    **dict.fromkeys(unit, 1)},
        num_warps=num_warps,
        num_stages=num_stages,
        tags=("matmul", "row-major-grid", "scf.for", "masked-tail"),
        description=f"GEMM {shape} {in_dtype}, row-major program order (no GROUP_SIZE_M)",
        **tol,
    )


ROWMAJOR_MATMULS = {
    "matmul_rowmajor_fp32": rowmajor_matmul("matmul_rowmajor_fp32", ODD, torch.float32, "ieee", _FP32_TOL),
    "matmul_rowmajor_fp16": rowmajor_matmul("matmul_rowmajor_fp16", ODD, torch.float16, "ieee", _FP16_TOL),
}
