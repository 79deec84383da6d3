"""GEMM + row reduction: a linear or 2-D matmul, pointwise ops on the product, then sum / mean / amax /
logsumexp over its last dim (the output features), then pointwise ops on the reduced rows — the product
is computed in Triton tile by tile and reduced in registers, so the (M, N) product is never written:

    out = epilogue(reduce_n(prologue(A @ B (+ bias))))      A: (M, K), B: (K, N), out: (M,) (or (M, 1))

A program owns BLOCK_M rows and walks every SPLIT-th BLOCK_N wide column tile of them (the product tile by
`gemm`'s main loop, fp32 accumulation), folding each tile into running row values (a sum; a max and a
NaN flag; logsumexp's running max and rescaled sum). With SPLIT = 1 it finishes the rows and stores
them through the epilogue; with SPLIT > 1 the SPLIT programs of a row block store their running values
(fp32 partials) and a second kernel combines them per row, so that M / BLOCK_M x SPLIT programs fill the
GPU when M alone gives too few. Precision as `gemm` (fp16/bf16; fp32 as TF32 under tf32, split under strict).
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
from kstrata.agents.templates.graph import Chain, GraphError, describe
from kstrata.agents.templates.reduce import OPS, PARTIALS, row_reduction
from kstrata.agents.templates.tensorcore import admits

NAME = "gemm_reduce"
#: `gemm`'s space with SPLIT (column groups per row block) for GROUP_M (a program walks all its columns)
SPACE: tuple[tuple[str, tuple[object, ...]], ...] = tuple(
    ("SPLIT", (1, 2, 4, 8, 16, 32, 64)) if name == "GROUP_M" else (name, values) for name, values in gemm.SPACE)
#: Programs a default schedule aims at (a few waves of an H200's 132 SMs).
TARGET_PROGRAMS = 264


def _reduced(chain: Chain) -> gemm.Gemm:
    """The chain's product, when its core reduces the product's last dim (GraphError: why not)."""
    g = gemm.gemm_of(chain)
    core = chain.core
    if core is None or core.op not in OPS:
        raise GraphError("the graph has no sum/mean/amax/logsumexp after the product")
    if g.batch != 1:
        raise GraphError(f"a batched product ({g.batch} batches) before the {core.op}")
    rank = len(chain.root.shape)
    dims = core.attrs["dims"]
    if dims is None or sorted(d % rank for d in dims) != [rank - 1]:
        raise GraphError(f"{core.op} over dims {dims} of the product, not its last dim alone")
    if chain.core_shape != chain.root.shape:
        raise GraphError(f"the prologue broadcasts the product {chain.root.shape} to {chain.core_shape}")
    if chain.out_shape != core.shape:
        raise GraphError(f"the epilogue broadcasts the {core.op} {core.shape} to {chain.out_shape}")
    return g


def applies(chain: Chain, policy: str = "strict") -> str | None:
    try:
        g = _reduced(chain)
    except GraphError as e:
        return str(e)
    return admits(g.dtype, policy, NAME, "GEMM", split=True)


def space(chain: Chain) -> tuple[tuple[tuple[str, tuple[object, ...]], ...], tuple[tuple[str, object], ...]]:
    """`gemm`'s tiles, and the smallest SPLIT giving TARGET_PROGRAMS programs (at most one per column tile)."""
    g = _reduced(chain)
    _, gdefault = gemm.space(chain)
    d: dict[str, Any] = {k: v for k, v in gdefault if k != "GROUP_M"}
    blocks_m, tiles_n = cdiv(g.m, d["BLOCK_M"]), cdiv(g.n, d["BLOCK_N"])
    split = 1
    while split < 64 and blocks_m * split < TARGET_PROGRAMS and 2 * split <= tiles_n:
        split *= 2
    return SPACE, (*d.items(), ("SPLIT", split))


def valid(chain: Chain, p: Params) -> bool:
    """`gemm`'s rules for the tiles; every split gets at least one column tile."""
    g = _reduced(chain)
    return bool(gemm.valid(chain, {**p, "GROUP_M": 1}) and p["SPLIT"] <= cdiv(g.n, p["BLOCK_N"]))


def hints(chain: Chain) -> list[Params]:
    return gemm.hints(chain)


def description(chain: Chain, policy: str = "strict") -> str:
    g = _reduced(chain)
    assert chain.core is not None
    bias = " + bias" if g.bias else ""
    return (f"{g.op} {g.m}x{g.n}x{g.k} (MxNxK) {g.dtype}{bias}, prologue {describe(chain.prologue)}, "
            f"{chain.core.op} over its {g.n} columns, epilogue {describe(chain.epilogue)}: one Triton kernel "
            f"(fp32 accumulation{gemm.fp32_inputs(g.dtype, policy)}; SPLIT column groups combined "
            "by a second kernel)")


def kernel(chain: Chain, params: Params, policy: str) -> Kernel:
    g = _reduced(chain)
    why = admits(g.dtype, policy, NAME, "GEMM", split=True)
    if why is not None:
        raise GraphError(why)
    core = chain.core
    assert core is not None
    op = core.op
    m, n = g.m, g.n
    bm, bn, bk, split = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"], params["SPLIT"]
    it = index_type(chain.root.shape, *g.shapes)
    out_t = tl_dtype(chain.out_dtype)
    leaf_names, leaf_vals = leaf_kernel_args(chain)
    lsig = "".join(x + ", " for x in leaf_names)
    bias_sig = "bias_ptr, " if g.bias else ""
    pro = ExprEmitter("p")
    pro.lines += [f"x = acc{gemm.bias_term(g)}", f"mask = (rm[:, None] < {m}) & (rn[None, :] < {n})",
                  f"idx = rm[:, None] * {n} + rn[None, :]"]
    v = pro.emit(chain.prologue, "x", "idx", chain.root.shape, "mask")
    inits, update, fin = row_reduction(op, v, "mask", 1, n, "BLOCK_M", "r_")
    loop = [*gemm.tile_product(g, bm, bn, bk, it, policy, gemm.host_split(g, params, policy)), *pro.lines, *update]
    parts = [f"r_{x}" for x in PARTIALS[op]]
    out = ExprEmitter("o")
    out.lines += [*fin, "oidx = rm", f"omask = rm < {m}"]
    res = out.emit(chain.epilogue, "res", "oidx", chain.out_shape, "omask")
    out.lines.append(f"tl.store(out_ptr + oidx, {res}.to({out_t}), mask=omask)")
    if split == 1:
        tail = out.lines
    else:
        tail = [f"tl.store(part_ptr + ({j} * {split} + split) * {m} + rm, {x}, mask=rm < {m})"
                for j, x in enumerate(parts)]
    body = "\n".join("        " + line for line in loop)
    src = [f'''
@triton.jit
def _gemm_reduce_kernel(a_ptr, b_ptr, out_ptr, part_ptr, {bias_sig}{lsig}stride_ab, stride_am, stride_ak, stride_bb,
                        stride_bk, stride_bn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        SPLIT: tl.constexpr, UPCAST: tl.constexpr):
    rm = tl.program_id(0).to({it}) * BLOCK_M + tl.arange(0, BLOCK_M).to({it})
    split = tl.program_id(1)
    bat = 0
''' + "\n".join("    " + line for line in inits) + f'''
    for nt in range(split, {cdiv(n, bn)}, SPLIT):
        rn = nt * BLOCK_N + tl.arange(0, BLOCK_N).to({it})
{body}
''' + "\n".join("    " + line for line in tail) + "\n"]
    if split > 1:
        src.append(_combine_kernel(op, parts, split, m, out.lines, lsig))
    lines, tail, helpers = gemm.operands(g, params, policy)
    fwd = check_shapes(chain) + lines
    fwd.append(f"out = torch.empty({chain.out_shape!r}, device=a.device, dtype=torch.{chain.out_dtype})")
    fwd.append(f"part = torch.empty(({len(parts)}, {split}, {m}), device=a.device, dtype=torch.float32)"
               if split > 1 else "part = out  # unused: one program per row block finishes its rows")
    args = ["a", "b", "out", "part", *([g.bias] if g.bias else []), *leaf_vals, *tail]
    fwd.append(launch("_gemm_reduce_kernel", f"({cdiv(m, bm)}, {split})", args, gemm.meta(params)))
    if split > 1:
        fwd.append(launch("_gemm_reduce_combine", f"(triton.cdiv({m}, 64),)", ["part", "out", *leaf_vals],
                          {"BLOCK": 64, "num_warps": 4}))
    fwd.append("return out")
    return Kernel(NAME, policy, description(chain, policy), params, [*helpers, *src], fwd)


def _combine_kernel(op: str, parts: list[str], split: int, m: int, finish: list[str], lsig: str) -> str:
    """The kernel combining SPLIT partials per row, then finishing the rows as the main kernel's `finish`
    lines do (its running values are named `r_*`, its rows `rm`)."""
    loads = [f"{x}_s = tl.load(part_ptr + ({j} * {split} + s[None, :]) * {m} + rm[:, None], mask=ok, other={o})"
             for j, (x, o) in enumerate(zip(parts, _identity(op), strict=True))]
    if op in ("sum", "mean"):
        comb = ["r_acc = tl.sum(r_acc_s, axis=1)"]
    elif op == "amax":
        comb = ["r_acc = tl.max(r_acc_s, axis=1)", "r_anynan = tl.max(r_anynan_s, axis=1)"]
    else:
        comb = ["r_mx = tl.max(r_mx_s, axis=1)", "safe = tl.where(r_mx == float('-inf'), 0.0, r_mx)",
                "r_sm = tl.sum(r_sm_s * tl.exp(r_mx_s - safe[:, None]), axis=1)"]
    lines = [*loads, *comb, *finish]
    body = "\n".join("    " + line for line in lines)
    return f'''
@triton.jit
def _gemm_reduce_combine(part_ptr, out_ptr, {lsig}BLOCK: tl.constexpr):
    rm = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    s = tl.arange(0, {split})
    ok = (rm[:, None] < {m}) & (s[None, :] < {split})
{body}
'''


def _identity(op: str) -> tuple[str, ...]:
    """What a masked-off partial reads as (it never reaches a stored row)."""
    return {"sum": ("0.0",), "mean": ("0.0",), "amax": ("float('-inf')", "0.0"),
            "logsumexp": ("float('-inf')", "0.0")}[op]
