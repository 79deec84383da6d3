"""GEMM + GroupNorm / LayerNorm over the product's features: a linear or 2-D matmul, pointwise ops on the
product, then a GroupNorm of the (M, N) product (groups of G = N / groups consecutive features of a row) or a
LayerNorm over its last dim, its affine, then pointwise ops, in one Triton kernel:

    out = epilogue(norm(prologue(A @ B (+ bias))))      A: (M, K), B: (K, N), groups of G columns of a row

A group is G consecutive columns of one row, so a BLOCK_M x BLOCK_N product tile whose BLOCK_N is a multiple
of G holds whole groups: the kernel computes the tile (`gemm`'s main loop, fp32 accumulation; fp32 operands
split into bf16 parts under strict, `tensorcore`'s docstring), applies the prologue in registers, takes each
group's exact two-pass statistics from registers (the tile viewed as BLOCK_M x BLOCK_N/G x G: the mean, then
the centered variance, as `norm`'s fused strategy), normalizes, applies the affine and the epilogue, and
stores the output once. The product is never written or read back: against cuBLAS then `norm` (the product
written and read once more, 1 GB on gap task 06's 32768 x 4096 output), the kernel's traffic is its operands
and the output. LayerNorm over the last dim is the one-group case (G = N, at most `MAX_GROUP` columns).

Does not apply (the reason is reported): a batched product, a norm over other dims, G not a power of two or
above `MAX_GROUP` (one tile must hold a group: the accumulator's registers bound BLOCK_N), a prologue that
broadcasts the product.
"""

from __future__ import annotations

from typing import Any

from kstrata.agents.templates import gemm
from kstrata.agents.templates.base import Params, cdiv
from kstrata.agents.templates.codegen import (
    ExprEmitter,
    Kernel,
    check_shapes,
    index_type,
    launch,
    leaf_kernel_args,
    tl_dtype,
)
from kstrata.agents.templates.graph import Chain, GraphError, Node, describe
from kstrata.agents.templates.norm import norm_args
from kstrata.agents.templates.tensorcore import admits

NAME = "gemm_norm"
#: The widest group a tile holds (BLOCK_N is at most 256: `gemm`'s space).
MAX_GROUP = 256
#: `gemm`'s space, BLOCK_N from 32 (a group of G needs BLOCK_N >= G; `valid` checks it).
SPACE: tuple[tuple[str, tuple[object, ...]], ...] = tuple(
    (name, tuple(v for v in values if not (name == "BLOCK_N" and isinstance(v, int) and v < 32)))
    for name, values in gemm.SPACE)


def _geometry(chain: Chain) -> tuple[gemm.Gemm, int]:
    """The chain's product and its group size G (GraphError: why the template does not take it)."""
    g = gemm.gemm_of(chain)
    core = chain.core
    if core is None or core.op not in ("group_norm", "layer_norm"):
        raise GraphError("the graph has no GroupNorm or LayerNorm after the product")
    if g.batch != 1:
        raise GraphError(f"a batched product ({g.batch} batches) before the {core.op}")
    if chain.core_shape != chain.root.shape:
        raise GraphError(f"the prologue broadcasts the product {chain.root.shape} to {chain.core_shape}")
    if chain.out_shape != chain.core_shape:
        raise GraphError(f"the epilogue broadcasts the {core.op} {chain.core_shape} to {chain.out_shape}")
    s = chain.core_shape
    if core.op == "group_norm":
        if len(s) != 2:
            raise GraphError(f"GroupNorm of a {len(s)}-D product {s}: the template takes (rows, features)")
        if s[1] % core.attrs["num_groups"]:
            raise GraphError(f"GroupNorm of {core.attrs['num_groups']} groups on {s[1]} features")
        group = s[1] // core.attrs["num_groups"]
    else:
        ns = tuple(core.attrs["normalized_shape"])
        if ns != (s[-1],):
            raise GraphError(f"LayerNorm over {ns} of the product {s}: the template takes its last dim alone")
        group = s[-1]
    if group & (group - 1) or group > MAX_GROUP:
        raise GraphError(f"groups of {group} features: the template takes a power of two up to {MAX_GROUP}")
    for w in core.args[1:3]:
        if w is not None and not (isinstance(w, Node) and w.op in ("param", "input")):
            raise GraphError(f"a {core.op} weight or bias that is not a parameter or an input")
    return g, group


def applies(chain: Chain, policy: str = "strict") -> str | None:
    try:
        g, _ = _geometry(chain)
    except GraphError as e:
        return str(e)
    return admits(g.dtype, policy, NAME, "GEMM", split=True)


def space(chain: Chain) -> tuple[tuple[tuple[str, tuple[object, ...]], ...], tuple[tuple[str, object], ...]]:
    """`gemm`'s default tile, BLOCK_N at least the group."""
    _, group = _geometry(chain)
    d: dict[str, Any] = dict(gemm.space(chain)[1])
    d["BLOCK_N"] = max(d["BLOCK_N"], group, 32)
    return SPACE, tuple(d.items())


def valid(chain: Chain, p: Params) -> bool:
    """`gemm`'s rules, and a tile that holds whole groups."""
    _, group = _geometry(chain)
    return bool(p["BLOCK_N"] % group == 0 and gemm.valid(chain, p))


def hints(chain: Chain) -> list[Params]:
    _, group = _geometry(chain)
    return [h for h in gemm.hints(chain) if h["BLOCK_N"] % group == 0] + \
        [{"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 8, "num_stages": 3},
         {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 4}]


def description(chain: Chain, policy: str = "strict") -> str:
    g, group = _geometry(chain)
    core = chain.core
    assert core is not None
    bias = " + bias" if g.bias else ""
    what = (f"group_norm ({core.attrs['num_groups']} groups of {group})" if core.op == "group_norm"
            else f"layer_norm over {group}")
    return (f"{g.op} {g.m}x{g.n}x{g.k} (MxNxK) {g.dtype}{bias} (fp32 accumulation{gemm.fp32_inputs(g.dtype, policy)}), "
            f"prologue {describe(chain.prologue)}, {what} from the tile's registers, epilogue "
            f"{describe(chain.epilogue)}: one Triton kernel, the product never stored")


def kernel(chain: Chain, params: Params, policy: str) -> Kernel:
    g, group = _geometry(chain)
    why = admits(g.dtype, policy, NAME, "GEMM", split=True)
    if why is not None:
        raise GraphError(why)
    core = chain.core
    assert core is not None
    m, n = g.m, g.n
    bm, bn, bk = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"]
    if bn % group:
        raise GraphError(f"BLOCK_N {bn} does not hold whole groups of {group}")
    eps = float(core.attrs["eps"])
    it = index_type(chain.out_shape, *g.shapes)
    out_t = tl_dtype(chain.out_dtype)
    leaf_names, leaf_vals = leaf_kernel_args(chain)
    lsig = "".join(x + ", " for x in leaf_names)
    bias_sig = "bias_ptr, " if g.bias else ""
    _, norm_vals = norm_args(chain, absent="out")  # an absent weight or bias: the output, never read
    em = ExprEmitter("p", along=(1, "rb[None, :]"))  # per-feature operands: one load per column (rb wraps the tail)
    em.lines += [f"x = acc{gemm.bias_term(g)}", f"mask = (rm[:, None] < {m}) & (rn[None, :] < {n})",
                 f"idx = rm[:, None] * {n} + rn[None, :]"]
    v = em.emit(chain.prologue, "x", "idx", chain.core_shape, "mask")
    per = bn // group
    em.lines += [f"v = tl.reshape({v}, [BLOCK_M, {per}, {group}])",
                 f"mean = tl.sum(v, axis=2) / {group}",
                 "dv = v - mean[:, :, None]",
                 f"var = tl.sum(dv * dv, axis=2) / {group}",
                 f"rstd = 1.0 / tl.sqrt_rn(var + {eps!r})",
                 "y = tl.reshape(dv * rstd[:, :, None], [BLOCK_M, BLOCK_N])"]
    if core.args[1] is not None:
        em.lines.append(f"y = y * tl.load(nw_ptr + rn, mask=rn < {n}, other=0.0).to(tl.float32)[None, :]")
    if core.args[2] is not None:
        em.lines.append(f"y = y + tl.load(nb_ptr + rn, mask=rn < {n}, other=0.0).to(tl.float32)[None, :]")
    res = em.emit(chain.epilogue, "y", "idx", chain.out_shape, "mask")
    em.lines.append(f"tl.store(out_ptr + idx, {res}.to({out_t}), mask=mask)")
    epi = "\n".join("    " + line for line in em.lines)
    tile = "\n".join("    " + line for line in gemm.tile_product(g, bm, bn, bk, it, policy, gemm.host_split(g, params, policy)))
    src = f'''
@triton.jit
def _gemm_norm_kernel(a_ptr, b_ptr, out_ptr, nw_ptr, nb_ptr, {bias_sig}{lsig}stride_ab, stride_am, stride_ak, stride_bb,
                      stride_bk, stride_bn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, UPCAST: tl.constexpr):
    bat = 0
{gemm.program_order(m, n, bm, bn, it)}
{tile}
{epi}
'''
    lines, tail, helpers = gemm.operands(g, params, policy)
    fwd = check_shapes(chain) + lines
    fwd.append(f"out = torch.empty({chain.out_shape!r}, device=a.device, dtype=torch.{chain.out_dtype})")
    args = ["a", "b", "out", *norm_vals, *([g.bias] if g.bias else []), *leaf_vals, *tail]
    fwd.append(launch("_gemm_norm_kernel", f"({cdiv(m, bm) * cdiv(n, bn)},)", args, gemm.meta(params)))
    fwd.append("return out")
    return Kernel(NAME, policy, description(chain, policy), params, [*helpers, src], fwd)
