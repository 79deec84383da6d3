"""Attention forward (`F.scaled_dot_product_attention`, optionally causal, any scale) as one Triton kernel in
the flash form, with the pointwise ops after it fused into its store:

    out[b] = epilogue(softmax(scale * Q[b] @ K[b]^T (+ causal mask)) @ V[b])    Q: (Sq, D), K: (Sk, D), V: (Sk, Dv)

A program computes BLOCK_M query rows of one (batch, head): it keeps the rows' running max, running sum
and fp32 output accumulator in registers while it walks the keys in BLOCK_N blocks (online softmax, in
base 2: the scale is folded with log2(e)), so the Sq x Sk score matrix is never written. A causal
program stops at its last row's diagonal (PyTorch's `is_causal` is the top-left aligned lower triangle:
query i sees keys j <= i). The probabilities go to the second product in the operands' dtype, as flash
kernels do. Batch dims are flattened (equal on the three operands: no broadcasting, no GQA); operands
are read through their strides. fp16/bf16 operands; fp32 only under the `tf32` policy (both products with
TF32 inputs), never under `strict`. No attention mask, no dropout.

On a CPU tensor bf16 tiles are converted to fp32 before the products (`UPCAST`: `tensorcore`'s docstring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kstrata.agents.templates.base import Params, cdiv, next_pow2
from kstrata.agents.templates.codegen import (
    ExprEmitter,
    Kernel,
    check_shapes,
    index_type,
    launch,
    leaf_kernel_args,
    tl_dtype,
)
from kstrata.agents.templates.graph import Chain, GraphError, Node, describe, sdpa_options
from kstrata.agents.templates.tensorcore import (
    ACC_PER_THREAD,
    MAX_BATCH,
    SMEM_BYTES,
    admits,
    dot_precision,
    dtype_bytes,
    epilogue_only,
    operand,
    ref,
    upcast,
)

NAME = "attention"
SPACE: tuple[tuple[str, tuple[object, ...]], ...] = (
    ("BLOCK_M", (16, 32, 64, 128)), ("BLOCK_N", (16, 32, 64, 128)), ("num_warps", (2, 4, 8)),
    ("num_stages", (1, 2, 3, 4)))


@dataclass(frozen=True)
class Attention:
    batch: int  # batch x heads, flattened
    sq: int
    sk: int
    d: int
    dv: int
    dtype: str
    causal: bool
    scale: float
    views: tuple[str, ...]  # forward lines binding q, k, v as (batch, S, D) views
    shapes: tuple[tuple[int, ...], ...]

    @property
    def block_d(self) -> int:
        return max(16, next_pow2(self.d))

    @property
    def block_dv(self) -> int:
        return max(16, next_pow2(self.dv))


def attention_of(chain: Chain) -> Attention:
    """The chain's head read as attention (GraphError: why this template does not compute it)."""
    h = chain.head
    if h is None or h.op != "attention":
        raise GraphError("the graph has no scaled_dot_product_attention")
    opts = sdpa_options(h)
    if opts["attn_mask"] is not None:
        raise GraphError("attention with an attn_mask (the template takes is_causal only)")
    if opts["enable_gqa"]:
        raise GraphError("attention with enable_gqa (grouped key/value heads)")
    q, k, v = (operand(h.args[i], f"attention's {w}") for i, w in enumerate(("query", "key", "value")))
    if len(q.shape) < 2 or len(k.shape) != len(q.shape) or len(v.shape) != len(q.shape):
        raise GraphError(f"attention of ranks {len(q.shape)}, {len(k.shape)}, {len(v.shape)}")
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise GraphError(f"attention with batch dims {q.shape[:-2]}, {k.shape[:-2]}, {v.shape[:-2]} that broadcast")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise GraphError(f"attention of {q.shape}, {k.shape}, {v.shape}: the shapes do not agree")
    if not (q.dtype == k.dtype == v.dtype):
        raise GraphError(f"attention of {q.dtype}, {k.dtype}, {v.dtype} operands")
    batch = math.prod(q.shape[:-2])
    if batch > MAX_BATCH:
        raise GraphError(f"attention over {batch} batches x heads (a grid axis takes {MAX_BATCH})")
    sq, d = q.shape[-2:]
    sk, dv = v.shape[-2:]
    scale = opts["scale"] if opts["scale"] is not None else 1.0 / math.sqrt(d)

    def view(node: Node, var: str) -> str:
        return f"{var} = {ref(node)}.reshape({batch}, {node.shape[-2]}, {node.shape[-1]})"

    return Attention(batch, sq, sk, d, dv, q.dtype, bool(opts["is_causal"]), float(scale),
                     (view(q, "q"), view(k, "k"), view(v, "v")), (q.shape, k.shape, v.shape))


def applies(chain: Chain, policy: str = "strict") -> str | None:
    try:
        a = attention_of(chain)
    except GraphError as e:
        return str(e)
    return epilogue_only(chain, "attention") or admits(a.dtype, policy, NAME, "attention")


def space(chain: Chain) -> tuple[tuple[tuple[str, tuple[object, ...]], ...], tuple[tuple[str, object], ...]]:
    a = attention_of(chain)
    warps = 8 if max(a.block_d, a.block_dv) >= 128 else 4
    return SPACE, (("BLOCK_M", 128), ("BLOCK_N", 64), ("num_warps", warps), ("num_stages", 3))


def valid(chain: Chain, p: Params) -> bool:
    """Blocks no larger than their dim's power of two, the Q tile and pipelined K/V tiles within shared memory,
    the scores and the output accumulator within registers."""
    a = attention_of(chain)
    bm, bn = p["BLOCK_M"], p["BLOCK_N"]
    if bm > max(16, next_pow2(a.sq)) or bn > max(16, next_pow2(a.sk)):
        return False
    smem = (bm * a.block_d + p["num_stages"] * bn * (a.block_d + a.block_dv)) * dtype_bytes(a.dtype)
    if smem > SMEM_BYTES:
        return False
    return bool(bm * (bn + a.block_dv) <= ACC_PER_THREAD * 32 * p["num_warps"])


def hints(chain: Chain) -> list[Params]:
    return [{"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
            {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
            {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 4, "num_stages": 4}]


def description(chain: Chain) -> str:
    a = attention_of(chain)
    causal = "causal " if a.causal else ""
    return (f"{causal}attention over {a.batch} batch x heads, {a.sq} queries x {a.sk} keys, head dims {a.d}/{a.dv}, "
            f"{a.dtype}, scale {a.scale:.6g}, flash forward in Triton (online softmax, fp32 accumulation"
            f"{', TF32 inputs' if a.dtype == 'float32' else ''}), epilogue {describe(chain.epilogue)} fused into its store")


def _mask(terms: list[str], extra: str) -> str:
    """A load's `mask=..., other=0.0` from its conditions (`extra`: ' & (...)' terms), or nothing."""
    conds = " & ".join(terms) + extra if terms else extra.removeprefix(" & ")
    return f", mask={conds}, other=0.0" if conds else ""


def kernel(chain: Chain, params: Params, policy: str) -> Kernel:
    a = attention_of(chain)
    why = admits(a.dtype, policy, NAME, "attention")
    if why is not None:
        raise GraphError(why)
    bm, bn = params["BLOCK_M"], params["BLOCK_N"]
    bd, bdv = a.block_d, a.block_dv
    it = index_type(chain.out_shape, *a.shapes)
    leaf_names, leaf_vals = leaf_kernel_args(chain)
    lsig = "".join(x + ", " for x in leaf_names)
    prec = dot_precision(a.dtype)
    dmask = f" & (rd[None, :] < {a.d})" if bd != a.d else ""
    dmask_t = f" & (rd[:, None] < {a.d})" if bd != a.d else ""
    dvmask = f" & (rdv[None, :] < {a.dv})" if bdv != a.dv else ""
    # keys past the last are masked only where the key blocks leave a tail (a causal loop's last block may
    # reach past its diagonal, but not past the keys)
    ktail = a.sk % bn != 0
    kmask = _mask([f"(rn[None, :] < {a.sk})"] if ktail else [], dmask_t)
    vmask = _mask([f"(rn[:, None] < {a.sk})"] if ktail else [], dvmask)
    hi = f"tl.minimum({a.sk}, (pid_m + 1) * BLOCK_M)" if a.causal else str(a.sk)
    keep = [f"(rn[None, :] < {a.sk})"] if ktail else []
    if a.causal:
        keep.append("(rn[None, :] <= rm[:, None])")
    masking = f"        s = tl.where({' & '.join(keep)}, s, float('-inf'))\n" if keep else ""
    em = ExprEmitter("e")
    em.lines.append("x = acc / l_i[:, None]")
    res = em.emit(chain.epilogue, "x", "idx", chain.out_shape, "mask")
    epi = "\n".join("    " + line for line in em.lines)
    src = f'''
@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, {lsig}sqb, sqm, sqd, skb, skn, skd, svb, svn, svd,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to({it})
    rm = pid_m.to({it}) * BLOCK_M + tl.arange(0, BLOCK_M).to({it})
    rd = tl.arange(0, {bd}).to({it})
    rdv = tl.arange(0, {bdv}).to({it})
    q = tl.load(q_ptr + bh * sqb + rm[:, None] * sqm + rd[None, :] * sqd, mask=(rm[:, None] < {a.sq}){dmask}, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float('-inf'), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, {bdv}], tl.float32)
    qk_scale = {a.scale * 1.4426950408889634!r}
    for start in range(0, {hi}, BLOCK_N):
        rn = start + tl.arange(0, BLOCK_N).to({it})
        kt = tl.load(k_ptr + bh * skb + rn[None, :] * skn + rd[:, None] * skd{kmask})
        vt = tl.load(v_ptr + bh * svb + rn[:, None] * svn + rdv[None, :] * svd{vmask})
        if UPCAST:
            kt = kt.to(tl.float32)
            vt = vt.to(tl.float32)
        s = tl.dot(q, kt{prec}) * qk_scale
{masking}        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt{prec})
        m_i = m_new
    mask = (rm[:, None] < {a.sq}) & (rdv[None, :] < {a.dv})
    idx = bh * {a.sq * a.dv} + rm[:, None] * {a.dv} + rdv[None, :]
{epi}
    tl.store(out_ptr + idx, {res}.to({tl_dtype(chain.out_dtype)}), mask=mask)
'''
    fwd = check_shapes(chain) + list(a.views)
    fwd.append(f"out = torch.empty({chain.out_shape!r}, device=q.device, dtype=torch.{chain.out_dtype})")
    strides = ["q.stride(0), q.stride(1), q.stride(2)", "k.stride(0), k.stride(1), k.stride(2)",
               "v.stride(0), v.stride(1), v.stride(2)"]
    args = ["q", "k", "v", "out", *leaf_vals, *strides, upcast("q", a.dtype)]
    fwd.append(launch("_attention_kernel", f"({cdiv(a.sq, bm)}, {a.batch})", args, params))
    fwd.append("return out")
    return Kernel(NAME, policy, description(chain), params, [src], fwd)
