"""Attention kernels: a flash-attention forward pass (online softmax over K/V blocks), causal and not.

One program owns BLOCK_M query rows of one (batch, head) and streams the keys and values past them in
BLOCK_N blocks, keeping a running row maximum and row sum so that the full score matrix never exists.
Sequence lengths are not multiples of the blocks, so both the query rows and the last key block are
masked; the kernel also writes each row's log-sum-exp, which a backward pass would need.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from .matmul import unit_strides
from .spec import KernelArgs, SuiteKernel

_HEAD_DIM = 64
_BLOCK_M, _BLOCK_N = 64, 32


@triton.jit
def flash_attention_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    lse_ptr,
    n_heads,
    seq_q,
    seq_k,
    sm_scale,
    stride_qz,
    stride_qh,
    stride_qs,
    stride_qd,
    stride_kz,
    stride_kh,
    stride_ks,
    stride_kd,
    stride_vz,
    stride_vh,
    stride_vs,
    stride_vd,
    stride_oz,
    stride_oh,
    stride_os,
    stride_od,
    stride_lz,
    stride_lh,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    start_m = tl.program_id(0)
    zh = tl.program_id(1)
    # int64 head offsets: Z·H·S·D overflows int32 long before a GPU runs out of memory
    z = (zh // n_heads).to(tl.int64)
    h = (zh % n_heads).to(tl.int64)
    q_base = q_ptr + z * stride_qz + h * stride_qh
    k_base = k_ptr + z * stride_kz + h * stride_kh
    v_base = v_ptr + z * stride_vz + h * stride_vh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_q
    q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)

    # Scores are kept in base 2 (scaled by log2 e) so that each exponential is one exp2.
    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)

    if CAUSAL:
        # keys past this block's last query row are masked for every row: skip their blocks
        kv_end = tl.minimum(seq_k, (start_m + 1) * BLOCK_M)
    else:
        kv_end = seq_k
    for start_n in range(0, kv_end, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < seq_k
        kt = tl.load(k_base + offs_d[:, None] * stride_kd + cols[None, :] * stride_ks, mask=col_ok[None, :], other=0.0)
        s = tl.dot(q, kt) * qk_scale
        keep = col_ok[None, :]
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None])
        # Key 0 is kept for every row in the first block, so m_new is finite from then on and
        # exp2(-inf - m_new) below is a clean 0, never NaN.
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + cols[:, None] * stride_vs + offs_d[None, :] * stride_vd, mask=col_ok[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new

    out = acc / l_i[:, None]
    o_ptrs = o_ptr + z * stride_oz + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # back from base 2 to natural log
    tl.store(lse_ptr + z * stride_lz + h * stride_lh + offs_m, lse, mask=row_ok)


def _attention_args(batch: int, heads: int, seq_q: int, seq_k: int) -> Callable[[torch.Generator], KernelArgs]:
    def make(gen: torch.Generator) -> KernelArgs:
        q = torch.randn(batch, heads, seq_q, _HEAD_DIM, generator=gen).half()
        k = torch.randn(batch, heads, seq_k, _HEAD_DIM, generator=gen).half()
        v = torch.randn(batch, heads, seq_k, _HEAD_DIM, generator=gen).half()
        o = torch.empty(batch, heads, seq_q, _HEAD_DIM, dtype=torch.float16)
        lse = torch.empty(batch, heads, seq_q, dtype=torch.float32)
        args: KernelArgs = {
            "q_ptr": q, "k_ptr": k, "v_ptr": v, "o_ptr": o, "lse_ptr": lse,
            "n_heads": heads, "seq_q": seq_q, "seq_k": seq_k, "sm_scale": 1.0 / math.sqrt(_HEAD_DIM),
        }
        for prefix, t in (("q", q), ("k", k), ("v", v), ("o", o)):
            args.update(zip((f"stride_{prefix}{d}" for d in "zhsd"), t.stride(), strict=True))
        args["stride_lz"], args["stride_lh"] = lse.stride(0), lse.stride(1)
        return args

    return make


def _attention_ref(causal: bool) -> Callable[[Mapping[str, Any]], dict[str, torch.Tensor]]:
    def ref(a: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        q, k, v = (a[n].float() for n in ("q_ptr", "k_ptr", "v_ptr"))
        s = (q @ k.transpose(-1, -2)) * a["sm_scale"]
        if causal:
            rows = torch.arange(q.shape[-2])[:, None]
            cols = torch.arange(k.shape[-2])[None, :]
            s = s.masked_fill(cols > rows, float("-inf"))
        out = torch.softmax(s, dim=-1) @ v
        return {"o_ptr": out.to(a["o_ptr"].dtype), "lse_ptr": torch.logsumexp(s, dim=-1)}

    return ref


_UNIT = ("stride_qd", "stride_kd", "stride_vd", "stride_od")


def _attention(name: str, causal: bool, batch: int, heads: int, seq_q: int, seq_k: int, description: str) -> SuiteKernel:
    return SuiteKernel(
        name=name,
        fn=flash_attention_fwd_kernel,
        make_args=unit_strides(_attention_args(batch, heads, seq_q, seq_k), _UNIT),
        grid=lambda a: (triton.cdiv(a["seq_q"], _BLOCK_M), a["q_ptr"].shape[0] * a["n_heads"]),
        reference=_attention_ref(causal),
        outputs=("o_ptr", "lse_ptr"),
        constexprs={"HEAD_DIM": _HEAD_DIM, "BLOCK_M": _BLOCK_M, "BLOCK_N": _BLOCK_N, "CAUSAL": causal,
                    **dict.fromkeys(_UNIT, 1)},
        num_warps=4,
        num_stages=2,
        # o is fp16 (P is rounded to fp16 before P·V, as on tensor cores); lse is fp32 and far tighter
        atol=1e-2,
        rtol=1e-2,
        tags=("attention", "flash-attention", "online-softmax", "fp16", "head-dim-64", "scf.for", "masked-tail",
              *(("causal",) if causal else ("non-causal", "cross-attention"))),
        description=description,
    )


KERNELS = [
    _attention("flash_attention_fwd_causal", True, 2, 3, 100, 100,
               "causal softmax(Q·Kᵀ/√d)·V, fp16, head_dim 64, seq 100, online softmax over 32-key blocks, with LSE"),
    _attention("flash_attention_fwd", False, 2, 3, 77, 113,
               "non-causal softmax(Q·Kᵀ/√d)·V, fp16, head_dim 64, 77 queries × 113 keys, online softmax, with LSE"),
]
