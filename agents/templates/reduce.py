"""Reductions over one run of consecutive dims: sum, mean, amax, logsumexp (keepdim or not), with the pointwise
ops before (fused into the loads: `sigmoid(linear(x)).sum(1)` reads the GEMM's output once) and after.

The input is viewed as (A, R, B): R the reduced elements, A the dims before, B the dims after.
- B == 1 (trailing dims): a program reduces BLOCK_A rows, looping over R in BLOCK_R wide tiles (axis 1);
- B > 1: a program reduces a BLOCK_B wide strip of columns of one a, looping over R (axis 0): loads stay
  coalesced along B.
logsumexp keeps a running max and a rescaled sum (online), so it reads its input once.
"""

from __future__ import annotations

import math

from kstrata.agents.templates.base import Params, next_pow2
from kstrata.agents.templates.codegen import (
    ExprEmitter,
    Kernel,
    check_shapes,
    head_code,
    index_type,
    launch,
    leaf_kernel_args,
    root_load,
    tl_dtype,
)
from kstrata.agents.templates.graph import Chain, describe

NAME = "reduce"
OPS = ("sum", "mean", "amax", "logsumexp")


def _dims(chain: Chain) -> list[int]:
    assert chain.core is not None
    s = chain.core_shape
    dims = chain.core.attrs["dims"]
    return list(range(len(s))) if dims is None else sorted(d % len(s) for d in dims)


def geometry(chain: Chain) -> tuple[int, int, int]:
    s = chain.core_shape
    dims = _dims(chain)
    return math.prod(s[:dims[0]]), math.prod(s[dims[0]:dims[-1] + 1]), math.prod(s[dims[-1] + 1:])


def applies(chain: Chain, policy: str = "strict") -> str | None:
    core = chain.core
    if core is None or core.op not in OPS:
        return "the graph has no sum/mean/amax/logsumexp"
    dims = _dims(chain) if chain.core_shape else []
    if not dims:
        return f"{core.op} of a scalar"
    if dims != list(range(dims[0], dims[-1] + 1)):
        return f"{core.op} over dims {dims}, not one run of consecutive dims"
    return None


def space(chain: Chain) -> tuple[tuple[tuple[str, tuple[object, ...]], ...], tuple[tuple[str, object], ...]]:
    _, r, b = geometry(chain)
    sp = (("BLOCK_R", (16, 32, 64, 128, 256, 512, 1024, 2048)), ("BLOCK_O", (1, 2, 4, 8, 16, 32, 64, 128, 256)),
          ("num_warps", (2, 4, 8)))
    if b == 1:
        br = max(16, min(2048, next_pow2(r)))
        return sp, (("BLOCK_R", br), ("BLOCK_O", max(1, min(64, 2048 // br))), ("num_warps", 4))
    bo = min(256, next_pow2(b))
    return sp, (("BLOCK_R", max(16, min(64, 4096 // bo))), ("BLOCK_O", bo), ("num_warps", 4))


def valid(chain: Chain, p: Params) -> bool:
    return bool(64 <= p["BLOCK_R"] * p["BLOCK_O"] <= 16384)


def description(chain: Chain, policy: str = "strict") -> str:
    assert chain.core is not None
    a, r, b = geometry(chain)
    head = f"{chain.head.op} (PyTorch), then " if chain.head else ""
    return (f"{head}{chain.core.op} over {r} elements ({a} x [{r}] x {b}; prologue {describe(chain.prologue)}, "
            f"epilogue {describe(chain.epilogue)}) in Triton")


#: The running values each reduction keeps (a split reduction stores them as its partials).
PARTIALS = {"sum": ("acc",), "mean": ("acc",), "amax": ("acc", "anynan"), "logsumexp": ("mx", "sm")}


def row_reduction(op: str, v: str, m: str, ax: int, r: int, block: str, p: str = "") -> tuple[list[str], list[str], list[str]]:
    """(lines starting the running values, lines folding in the masked tile `v` along axis `ax`, lines giving
    `res`) of `op` over `r` elements, for `block` outputs; `p` prefixes the running values' names."""
    other = "[:, None]" if ax == 1 else "[None, :]"
    if op in ("sum", "mean"):
        return ([f"{p}acc = tl.zeros([{block}], tl.float32)"],
                [f"{p}acc = {p}acc + tl.sum(tl.where({m}, {v}, 0.0), axis={ax})"],
                [f"res = {p}acc" if op == "sum" else f"res = {p}acc / {r}"])
    if op == "amax":
        # tl.max drops NaN (maxnum); PyTorch's amax returns NaN when the reduced elements hold one
        return ([f"{p}acc = tl.full([{block}], float('-inf'), tl.float32)", f"{p}anynan = tl.zeros([{block}], tl.float32)"],
                [f"v = tl.where({m}, {v}, float('-inf'))", f"{p}acc = tl.maximum({p}acc, tl.max(v, axis={ax}))",
                 f"{p}anynan = tl.maximum({p}anynan, tl.max(tl.where(v != v, 1.0, 0.0), axis={ax}))"],
                [f"res = tl.where({p}anynan > 0, float('nan'), {p}acc)"])
    # logsumexp, online: a running max and a sum rescaled to it
    return ([f"{p}mx = tl.full([{block}], float('-inf'), tl.float32)", f"{p}sm = tl.zeros([{block}], tl.float32)"],
            [f"v = tl.where({m}, {v}, float('-inf'))", f"nm = tl.maximum({p}mx, tl.max(v, axis={ax}))",
             "safe = tl.where(nm == float('-inf'), 0.0, nm)",
             f"{p}sm = {p}sm * tl.exp({p}mx - safe) + tl.sum(tl.exp(v - safe{other}), axis={ax})", f"{p}mx = nm"],
            [f"res = tl.where({p}mx == float('-inf'), {p}mx, {p}mx + tl.log({p}sm))"])


def kernel(chain: Chain, params: Params, policy: str) -> Kernel:
    core = chain.core
    assert core is not None
    op = core.op
    a, r, b = geometry(chain)
    s = chain.core_shape
    it = index_type(s, chain.root.shape)
    out_t = tl_dtype(chain.out_dtype)
    leaf_names, leaf_vals = leaf_kernel_args(chain)
    lsig = "".join(x + ", " for x in leaf_names)
    trailing = b == 1
    ax = 1 if trailing else 0
    em = ExprEmitter()
    if trailing:
        em.lines += ["rr = start + tl.arange(0, BLOCK_R).to(ITYPE)[None, :]", f"m = omask[:, None] & (rr < {r})",
                     f"idx = o[:, None] * {r} + rr"]
    else:
        em.lines += ["rr = start + tl.arange(0, BLOCK_R).to(ITYPE)[:, None]", f"m = omask[None, :] & (rr < {r})",
                     f"idx = a_i * {r * b} + rr * {b} + o[None, :]"]
    em.lines.append(root_load(chain, s, "idx", "m"))
    v = em.emit(chain.prologue, "x", "idx", s, "m")
    inits, update, fin = row_reduction(op, v, "m", ax, r, "BLOCK_O")
    em.lines += update
    init = "\n    ".join(inits)
    body = "\n".join("        " + line.replace("ITYPE", it) for line in em.lines)
    out = ExprEmitter("o")
    out.lines += fin
    oidx = "o" if trailing else f"a_i * {b} + o"
    out.lines.append(f"oidx = {oidx}")
    res = out.emit(chain.epilogue, "res", "oidx", chain.out_shape, "omask")
    out.lines.append(f"tl.store(out_ptr + oidx, {res}.to({out_t}), mask=omask)")
    out_body = "\n".join("    " + line for line in out.lines)
    if trailing:
        head_lines = f"""    o = tl.program_id(0).to({it}) * BLOCK_O + tl.arange(0, BLOCK_O).to({it})
    omask = o < {a}"""
        grid = f"(triton.cdiv({a}, {params['BLOCK_O']}),)"
    else:
        head_lines = f"""    a_i = tl.program_id(0).to({it})
    o = tl.program_id(1).to({it}) * BLOCK_O + tl.arange(0, BLOCK_O).to({it})
    omask = o < {b}"""
        grid = f"({a}, triton.cdiv({b}, {params['BLOCK_O']}))"
    src = f'''
@triton.jit
def _reduce_kernel(h_ptr, out_ptr, {lsig}BLOCK_R: tl.constexpr, BLOCK_O: tl.constexpr):
{head_lines}
    {init}
    for start in range(0, {r}, BLOCK_R):
{body}
{out_body}
'''
    fwd = check_shapes(chain) + head_code(chain)
    fwd.append(f"out = torch.empty({chain.out_shape!r}, device=h.device, dtype=torch.{chain.out_dtype})")
    fwd.append(launch("_reduce_kernel", grid, ["h", "out", *leaf_vals], params))
    fwd.append("return out")
    return Kernel(NAME, policy, description(chain), params, [src], fwd)
