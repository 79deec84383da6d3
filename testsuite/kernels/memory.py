"""Data-movement kernels: gathers and a tiled transpose.

Owns: an embedding lookup with int64 token ids into an fp16 table, a row gather with int32 indices
where -1 means padding (the row is written as zeros) in bf16, and a 2D tiled transpose in fp32. Each is
pure data movement, so the results must match exactly; tiles leave tails in both dimensions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .spec import KernelArgs, SuiteKernel


@triton.jit
def embedding_kernel(ids_ptr, table_ptr, out_ptr, n_tokens, dim, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    tok_mask = toks < n_tokens
    mask = tok_mask[:, None] & (cols[None, :] < dim)
    ids = tl.load(ids_ptr + toks, mask=tok_mask, other=0)
    # int64 ids keep the row offset in 64 bits, as a large vocabulary times the width would need.
    vals = tl.load(table_ptr + ids[:, None] * dim + cols[None, :], mask=mask)
    tl.store(out_ptr + toks[:, None].to(tl.int64) * dim + cols[None, :], vals, mask=mask)


def _embedding_args(gen: torch.Generator) -> KernelArgs:
    vocab, dim, n_tokens = 500, 100, 77
    return {
        "ids_ptr": torch.randint(0, vocab, (n_tokens,), generator=gen, dtype=torch.int64),
        "table_ptr": torch.randn(vocab, dim, generator=gen).half(),
        "out_ptr": torch.empty(n_tokens, dim, dtype=torch.float16),
        "n_tokens": n_tokens,
        "dim": dim,
    }


def _embedding_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {"out_ptr": a["table_ptr"][a["ids_ptr"]]}


@triton.jit
def gather_rows_padded_kernel(idx_ptr, src_ptr, out_ptr, dim, BLOCK_D: tl.constexpr):
    i = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_mask = cols < dim
    src_row = tl.load(idx_ptr + i)
    # A padding index reads nothing: the masked load's `other` provides the zeros.
    vals = tl.load(src_ptr + src_row.to(tl.int64) * dim + cols, mask=col_mask & (src_row >= 0), other=0.0)
    tl.store(out_ptr + i.to(tl.int64) * dim + cols, vals, mask=col_mask)


def _gather_args(gen: torch.Generator) -> KernelArgs:
    n_src, dim, n_idx = 90, 200, 53
    idx = torch.randint(0, n_src, (n_idx,), generator=gen, dtype=torch.int32)
    idx[torch.randperm(n_idx, generator=gen)[:9]] = -1
    return {
        "idx_ptr": idx,
        "src_ptr": torch.randn(n_src, dim, generator=gen).to(torch.bfloat16),
        "out_ptr": torch.empty(n_idx, dim, dtype=torch.bfloat16),
        "dim": dim,
    }


def _gather_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    idx = a["idx_ptr"].long()
    out = a["src_ptr"][idx.clamp(min=0)].clone()
    out[idx < 0] = 0
    return {"out_ptr": out}


@triton.jit
def transpose_kernel(x_ptr, out_ptr, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    tile = tl.load(x_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask)
    # Store the transposed tile so that consecutive lanes write consecutive addresses of the output.
    out_offs = cols[:, None] * n_rows + rows[None, :]
    tl.store(out_ptr + out_offs, tl.trans(tile), mask=tl.trans(mask))


def _transpose_args(gen: torch.Generator) -> KernelArgs:
    m, n = 67, 93
    return {"x_ptr": torch.randn(m, n, generator=gen), "out_ptr": torch.empty(n, m), "n_rows": m, "n_cols": n}


def _transpose_ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {"out_ptr": a["x_ptr"].t().contiguous()}


KERNELS = [
    SuiteKernel(
        name="embedding_gather_fp16",
        fn=embedding_kernel,
        make_args=_embedding_args,
        grid=lambda a: (triton.cdiv(a["n_tokens"], 16), triton.cdiv(a["dim"], 64)),
        reference=_embedding_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK_T": 16, "BLOCK_D": 64},
        tags=("memory", "gather", "embedding", "int64-index", "2d-tile", "masked-tail", "fp16"),
        description="embedding lookup: int64 token ids into a [500, 100] fp16 table, 16x64 tiles",
    ),
    SuiteKernel(
        name="gather_rows_padded_bf16",
        fn=gather_rows_padded_kernel,
        make_args=_gather_args,
        grid=lambda a: (a["idx_ptr"].shape[0], triton.cdiv(a["dim"], 128)),
        reference=_gather_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK_D": 128},
        tags=("memory", "gather", "index-select", "int32-index", "padding", "masked-tail", "bf16"),
        description="row gather with int32 indices, -1 writing a zero row, bf16",
    ),
    SuiteKernel(
        name="transpose_2d",
        fn=transpose_kernel,
        make_args=_transpose_args,
        grid=lambda a: (triton.cdiv(a["n_rows"], 32), triton.cdiv(a["n_cols"], 32)),
        reference=_transpose_ref,
        outputs=("out_ptr",),
        constexprs={"BLOCK_M": 32, "BLOCK_N": 32},
        tags=("memory", "transpose", "2d-tile", "masked-tail", "fp32"),
        description="2D transpose of a [67, 93] fp32 matrix in 32x32 tiles",
    ),
]
