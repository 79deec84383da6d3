"""Attention forward (`F.scaled_dot_product_attention`, optionally causal, any scale, grouped-query, masked) as one
Triton kernel in the flash form, with the pointwise ops after it fused into its store:

    out[b, h] = epilogue(softmax(scale * Q[b, h] @ K[b, h // gk]^T + mask[b, h]) @ V[b, h // gv])
    Q: (Sq, D), K: (Sk, D), V: (Sk, Dv)

A program computes BLOCK_M query rows of one (batch, head): it keeps the rows' running max, running sum
and fp32 output accumulator in registers while it walks the keys in BLOCK_N blocks (online softmax, in
base 2: the scale is folded with log2(e)), so the Sq x Sk score matrix is never written. A causal
program stops at its last row's diagonal (PyTorch's `is_causal` is the top-left aligned lower triangle:
query i sees keys j <= i). The probabilities go to the second product in the operands' dtype, as flash
kernels do. Operands are read through their strides as (outer batch, heads, S, D) views: dim -3 is the
heads, the dims before it are flattened (equal on the three operands: no broadcasting of batch dims).

Grouped-query attention (fewer key/value heads than query heads, H_q a multiple of H_kv): query head h reads
key/value head h // (H_q / H_kv) in place, whether the model says `enable_gqa=True` or widens K/V itself with
`repeat_interleave(g, dim=-3)` or `x[:, :, None].expand(...).reshape(...)` (`graph.repeat_heads`): the
template reads the un-repeated tensor, the widened copy is never made.

`attn_mask`: boolean (True keeps a key, as PyTorch defines it) or additive float (added to the scaled scores),
of any shape that broadcasts to (batch, heads, Sq, Sk) -- (Sq, Sk), (B, 1, Sq, Sk), (H, Sq, Sk), ... --,
read through the strides of its broadcast view (0 along broadcast dims: never expanded in memory). A row
whose every key is masked gets 0, as PyTorch 2.13's SDPA gives on the CPU (in every dtype, boolean or all
-inf additive; `_safe_softmax` in its math path), not the 0/0 = NaN of a plain softmax: its running max stays
-inf, so the exponents subtract 0 instead and its sum 0 divides as 1. `is_causal` with a mask never reaches
the template: PyTorch refuses the pair on the meta device the graph is traced on (its CPU kernel alone takes
it). A mask is admitted for queries of rank <= 4 only (the kernel indexes it by batch and head).

fp16/bf16 operands; fp32 only under the `tf32` policy (both products with TF32 inputs), never under `strict`.
No dropout: `dropout_p > 0` draws a fresh random mask on every call (in eval mode too, the functional form
has no training flag), so no output could be checked against the Model; the trace refuses it for every template.

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
    outer: int  # the batch dims before the heads, flattened
    heads: int  # query heads (dim -3; 1 for a rank-2 query)
    kv_groups: tuple[int, int]  # query heads per key head, per value head (grouped-query attention: > 1)
    sq: int
    sk: int
    d: int
    dv: int
    dtype: str
    causal: bool
    scale: float
    mask: str | None  # "bool" (True keeps a key), "additive" (added to the scaled scores) or None
    mask_bytes: int  # bytes of one mask element (0 without a mask)
    views: tuple[str, ...]  # forward lines binding q, k, v (and am, the mask) as (outer, heads, S, D) views
    shapes: tuple[tuple[int, ...], ...]

    @property
    def batch(self) -> int:
        return self.outer * self.heads

    @property
    def block_d(self) -> int:
        return max(16, next_pow2(self.d))

    @property
    def block_dv(self) -> int:
        return max(16, next_pow2(self.dv))


def _heads(shape: tuple[int, ...]) -> tuple[int, int]:
    """(outer, heads) of an operand: dim -3 is the heads (as `enable_gqa` reads it), the dims before it the outer batch."""
    return (math.prod(shape[:-3]), shape[-3]) if len(shape) >= 3 else (1, 1)


def _widened(node: object, what: str) -> tuple[Node, int]:
    """A key or value operand and how many times each of its heads is repeated before the attention reads it
    (`repeat_interleave` or `expand`+`reshape` along the heads: read in place, the repeat is not computed)."""
    if isinstance(node, Node) and node.op == "repeat_heads":
        return operand(node.args[0], f"attention's {what}"), int(node.attrs["groups"])
    return operand(node, f"attention's {what}"), 1


def _mask_kind(opts: dict[str, object], q: Node, sq: int, sk: int) -> tuple[Node | None, str | None]:
    m = opts["attn_mask"]
    if m is None:
        return None, None
    node = operand(m, "attention's attn_mask")
    target = (*q.shape[:-2], sq, sk)
    if len(q.shape) > 4:
        raise GraphError(f"attention with an attn_mask over a rank-{len(q.shape)} query (the template takes "
                         "(batch, heads, L, S) masks, at most two batch dims)")
    if node.dtype not in ("bool", "float16", "bfloat16", "float32"):
        raise GraphError(f"attention with a {node.dtype} attn_mask (the template takes bool or float masks)")
    s = node.shape
    if len(s) > len(target) or any(a not in (1, b) for a, b in zip(s[::-1], target[::-1], strict=False)):
        raise GraphError(f"attention with an attn_mask of shape {s} that does not broadcast to {target}")
    return node, "bool" if node.dtype == "bool" else "additive"


def attention_of(chain: Chain) -> Attention:
    """The chain's head read as attention (GraphError: why this template does not compute it)."""
    h = chain.head
    if h is None or h.op != "attention":
        raise GraphError("the graph has no scaled_dot_product_attention")
    opts = sdpa_options(h)
    q = operand(h.args[0], "attention's query")
    (k, rk), (v, rv) = _widened(h.args[1], "key"), _widened(h.args[2], "value")
    if len(q.shape) < 2 or len(k.shape) != len(q.shape) or len(v.shape) != len(q.shape):
        raise GraphError(f"attention of ranks {len(q.shape)}, {len(k.shape)}, {len(v.shape)}")
    (outer, hq), (_, hk), (_, hv) = _heads(q.shape), _heads(k.shape), _heads(v.shape)
    if not (q.shape[:-3] == k.shape[:-3] == v.shape[:-3]) or \
            (not opts["enable_gqa"] and not (hq == hk * rk == hv * rv)):
        raise GraphError(f"attention with batch dims {q.shape[:-2]}, {k.shape[:-2]}, {v.shape[:-2]} that broadcast"
                         + (" (widened heads included)" if rk * rv > 1 else ""))
    if hq % hk or hq % hv or (hq // hk) % rk or (hq // hv) % rv:
        raise GraphError(f"grouped-query attention of {hq} query heads over {hk}x{rk} key and {hv}x{rv} value heads")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise GraphError(f"attention of {q.shape}, {k.shape}, {v.shape}: the shapes do not agree")
    if not (q.dtype == k.dtype == v.dtype):
        raise GraphError(f"attention of {q.dtype}, {k.dtype}, {v.dtype} operands")
    batch = outer * hq
    if batch > MAX_BATCH:
        raise GraphError(f"attention over {batch} batches x heads (a grid axis takes {MAX_BATCH})")
    sq, d = q.shape[-2:]
    sk, dv = v.shape[-2:]
    mask, kind = _mask_kind(opts, q, sq, sk)
    scale = opts["scale"] if opts["scale"] is not None else 1.0 / math.sqrt(d)

    def view(node: Node, var: str, heads: int) -> str:
        return f"{var} = {ref(node)}.reshape({outer}, {heads}, {node.shape[-2]}, {node.shape[-1]})"

    views = [view(q, "q", hq), view(k, "k", hk), view(v, "v", hv)]
    shapes = [q.shape, k.shape, v.shape]
    if mask is not None:  # broadcast dims get stride 0: the mask is read where it lies, never expanded in memory
        views.append(f"am = {ref(mask)}.expand({(*q.shape[:-2], sq, sk)!r}).reshape({outer}, {hq}, {sq}, {sk})")
        shapes.append(mask.shape)
    mbytes = 0 if mask is None else 1 if mask.dtype == "bool" else dtype_bytes(mask.dtype)
    return Attention(outer, hq, (hq // hk, hq // hv), sq, sk, d, dv, q.dtype, bool(opts["is_causal"]), float(scale),
                     kind, mbytes, tuple(views), tuple(shapes))


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
    """Blocks no larger than their dim's power of two, the Q tile and pipelined K/V (and mask) tiles within shared
    memory, the scores (and the mask's tile) and the output accumulator within registers."""
    a = attention_of(chain)
    bm, bn = p["BLOCK_M"], p["BLOCK_N"]
    if bm > max(16, next_pow2(a.sq)) or bn > max(16, next_pow2(a.sk)):
        return False
    smem = (bm * a.block_d + p["num_stages"] * bn * (a.block_d + a.block_dv)) * dtype_bytes(a.dtype)
    # the mask's tile is pipelined beside K and V: Triton 3.6 for cuda:90 gives it num_stages - 1 buffers (fp32 GQA
    # 128x32 tiles, 8 warps, 4 stages: 196608 bytes without a mask, 245760 with an fp32 one, past a block's 227 KiB)
    smem += (p["num_stages"] - 1) * bm * bn * a.mask_bytes
    if smem > SMEM_BYTES:
        return False
    scores = bn * (2 if a.mask else 1)  # a mask's tile lies beside the scores
    return bool(bm * (scores + a.block_dv) <= ACC_PER_THREAD * 32 * p["num_warps"])


def hints(chain: Chain) -> list[Params]:
    return [{"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
            {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
            {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 4, "num_stages": 4}]


def description(chain: Chain, policy: str = "strict") -> str:
    a = attention_of(chain)
    causal = "causal " if a.causal else ""
    gk, gv = a.kv_groups
    gqa = (f", {gk} query heads per key/value head read in place" if gk == gv else
           f", {gk}/{gv} query heads per key/value head read in place") if gk * gv > 1 else ""
    mask = {None: "", "bool": ", boolean attn_mask", "additive": ", additive attn_mask"}[a.mask]
    return (f"{causal}attention over {a.batch} batch x heads, {a.sq} queries x {a.sk} keys, head dims {a.d}/{a.dv}, "
            f"{a.dtype}, scale {a.scale:.6g}{gqa}{mask}, flash forward in Triton (online softmax, fp32 accumulation"
            f"{', TF32 inputs' if a.dtype == 'float32' else ''}), epilogue {describe(chain.epilogue)} fused into its store")


def _mask(terms: list[str], extra: str, other: str = "0.0") -> str:
    """A load's `mask=..., other=0.0` from its conditions (`extra`: ' & (...)' terms), or nothing."""
    conds = " & ".join(terms) + extra if terms else extra.removeprefix(" & ")
    return f", mask={conds}, other={other}" if conds else ""


def _head_offset(ptr: str, strides: str, groups: int) -> str:
    """The base pointer of this program's (batch, head) in an operand of `groups` query heads per head."""
    sb, sh = strides.split()
    head = "hh" if groups == 1 else f"(hh // {groups})"
    return f"{ptr} + b * {sb} + {head} * {sh}"


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
    gk, gv = a.kv_groups
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
    scores = ""
    if a.mask is not None:
        # the mask tile of this block's rows and keys, through the mask's strides (0 along broadcast dims)
        mt = _mask(([f"(rm[:, None] < {a.sq})"] if a.sq % bm else []) + ([f"(rn[None, :] < {a.sk})"] if ktail else []),
                   "", "0")
        scores += f"        mt = tl.load(am_base + rm[:, None] * smm + rn[None, :] * smn{mt})\n"
        if a.mask == "bool":
            keep.append("(mt != 0)")
        else:  # added to the scaled scores: in base 2 it is scaled by log2(e) too
            scores += "        s = s + mt.to(tl.float32) * 1.4426950408889634\n"
    if keep:
        scores += f"        s = tl.where({' & '.join(keep)}, s, float('-inf'))\n"
    # a mask may leave a row no key (PyTorch's CPU SDPA then gives 0, not NaN): its running max stays -inf, so the
    # exponents subtract 0 instead (exp2(-inf) = 0, not NaN) and the row's sum 0 divides as 1 (its output is 0)
    if a.mask is not None:
        scores += "        m_new = tl.maximum(m_i, tl.max(s, 1))\n        m_use = tl.where(m_new == float('-inf'), 0.0, m_new)\n"
        m_use, l_div = "m_use", "tl.where(l_i == 0.0, 1.0, l_i)"
    else:
        scores += "        m_new = tl.maximum(m_i, tl.max(s, 1))\n"
        m_use, l_div = "m_new", "l_i"
    em = ExprEmitter("e")
    em.lines.append(f"x = acc / {l_div}[:, None]")
    res = em.emit(chain.epilogue, "x", "idx", chain.out_shape, "mask")
    epi = "\n".join("    " + line for line in em.lines)
    msig = "am_ptr, " if a.mask else ""
    mstr = "smb, smh, smm, smn, " if a.mask else ""
    mbase = f"    am_base = {_head_offset('am_ptr', 'smb smh', 1)}\n" if a.mask else ""
    src = f'''
@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, {msig}out_ptr, {lsig}sqb, sqh, sqm, sqd, skb, skh, skn, skd,
                      svb, svh, svn, svd, {mstr}BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to({it})
    # (batch, query head); grouped-query attention: query head hh reads key/value head hh // groups in place
    b = bh // {a.heads}
    hh = bh % {a.heads}
    q_base = {_head_offset('q_ptr', 'sqb sqh', 1)}
    k_base = {_head_offset('k_ptr', 'skb skh', gk)}
    v_base = {_head_offset('v_ptr', 'svb svh', gv)}
{mbase}    rm = pid_m.to({it}) * BLOCK_M + tl.arange(0, BLOCK_M).to({it})
    rd = tl.arange(0, {bd}).to({it})
    rdv = tl.arange(0, {bdv}).to({it})
    q = tl.load(q_base + rm[:, None] * sqm + rd[None, :] * sqd, mask=(rm[:, None] < {a.sq}){dmask}, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float('-inf'), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, {bdv}], tl.float32)
    qk_scale = {a.scale * 1.4426950408889634!r}
    for start in range(0, {hi}, BLOCK_N):
        rn = start + tl.arange(0, BLOCK_N).to({it})
        kt = tl.load(k_base + rn[None, :] * skn + rd[:, None] * skd{kmask})
        vt = tl.load(v_base + rn[:, None] * svn + rdv[None, :] * svd{vmask})
        if UPCAST:
            kt = kt.to(tl.float32)
            vt = vt.to(tl.float32)
        s = tl.dot(q, kt{prec}) * qk_scale
{scores}        alpha = tl.exp2(m_i - {m_use})
        p = tl.exp2(s - {m_use}[:, None])
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
    tensors = ["q", "k", "v", *(["am"] if a.mask else [])]
    strides = [", ".join(f"{t}.stride({i})" for i in range(4)) for t in tensors]
    args = [*tensors[:3], *tensors[3:], "out", *leaf_vals, *strides, upcast("q", a.dtype)]
    fwd.append(launch("_attention_kernel", f"({cdiv(a.sq, bm)}, {a.batch})", args, params))
    fwd.append("return out")
    return Kernel(NAME, policy, description(chain), params, [src], fwd)
