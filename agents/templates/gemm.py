"""GEMM + epilogue: the chain's linear or matmul computed by a Triton kernel instead of cuBLAS, with the
pointwise ops after it (bias, activations, scalings, residuals, clamps, with broadcasting) fused into its
store, so the product is written once and never read back.

    out[b] = epilogue(A[b] @ B[b] (+ bias))      A: (M, K), B: (K, N), b over the batch (1 for a plain GEMM)

- `nn.Linear` / `F.linear`: A is the input viewed as (M, K) (M the product of its leading dims), B the
  weight read transposed through its strides, the bias added in fp32 before the epilogue;
- `torch.matmul` / `torch.mm` / `torch.bmm` / `@`: batched when either operand has batch dims (equal
  batch dims of rank > 1 are flattened; a shared 2-D first operand has batch stride 0); a batched first
  operand times a 2-D second one is one GEMM over all its rows, as a linear is.
Operands are read through their strides (a transposed or otherwise strided input needs no copy).

A program computes one BLOCK_M x BLOCK_N tile with fp32 accumulation over K in BLOCK_K steps
(`num_stages` deep software pipelining); programs are ordered in groups of GROUP_M tile rows so that
the tiles running together share their A rows and B columns in L2. fp16/bf16 operands go to the tensor
cores as they are; fp32 operands under the `tf32` policy as TF32 (`input_precision="tf32"`: inputs rounded
to TF32, lower precision than fp32), under `strict` split into bf16 parts (`tensorcore.SPLIT_FP32`, six
tensor-core products: the error of an IEEE fp32 product, measured below cuBLAS fp32's; `tensorcore`'s docstring).

On a CPU tensor bf16 tiles are converted to fp32 before the dot (`UPCAST`: `tensorcore`'s docstring).
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
from kstrata.agents.templates.graph import Chain, GraphError, Node, describe
from kstrata.agents.templates.tensorcore import (
    ACC_PER_THREAD,
    MAX_BATCH,
    SMEM_BYTES,
    SPLIT_FP32,
    admits,
    dot_precision,
    dtype_bytes,
    epilogue_only,
    operand,
    ref,
    split_fp32,
    upcast,
)

NAME = "gemm"
SPACE: tuple[tuple[str, tuple[object, ...]], ...] = (
    ("BLOCK_M", (16, 32, 64, 128, 256)), ("BLOCK_N", (16, 32, 64, 128, 256)), ("BLOCK_K", (16, 32, 64, 128)),
    ("GROUP_M", (1, 4, 8, 16)), ("num_warps", (2, 4, 8)), ("num_stages", (2, 3, 4, 5)), ("SPLIT_AT", ("kernel", "host")))
#: Where fp32 operands are split into bf16 parts under strict (`SPLIT_AT`): "kernel" (Triton's bf16x6 on the
#: fp32 tiles: the B tile is split through shared memory every step) or "host" (`SPLIT_HELPER` writes each
#: operand's three parts once, (3, rows, cols) bf16, and the kernel takes the six products of bf16 tiles that
#: the pipeline loads as they are: 1.5x the operand bytes, no split in the loop). Other dtypes and policies,
#: and batched products, take "kernel" (nothing to split, or not split).
SPLIT_HELPER = '''
@triton.jit
def _split_bf16x3_kernel(x_ptr, out_ptr, R, C, sr, sc, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    c = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C).to(tl.int64)
    mask = (r[:, None] < R) & (c[None, :] < C)
    x = tl.load(x_ptr + r[:, None] * sr + c[None, :] * sc, mask=mask, other=0.0).to(tl.float32)
    hi = x.to(tl.bfloat16)
    r1 = x - hi.to(tl.float32)  # exact: hi is x rounded to 8 significant bits
    mid = r1.to(tl.bfloat16)
    lo = (r1 - mid.to(tl.float32)).to(tl.bfloat16)  # the last 8 bits: hi + mid + lo == x
    o = out_ptr + r[:, None] * C + c[None, :]
    tl.store(o, hi, mask=mask)
    tl.store(o + R * C, mid, mask=mask)
    tl.store(o + 2 * R * C, lo, mask=mask)


def _split_bf16x3(x):
    """x (rows, cols), any strides, as its three bf16 parts (3, rows, cols), contiguous."""
    out = torch.empty((3, *x.shape), device=x.device, dtype=torch.bfloat16)
    grid = (triton.cdiv(x.shape[0], 64), triton.cdiv(x.shape[1], 64))
    _split_bf16x3_kernel[grid](x, out, x.shape[0], x.shape[1], x.stride(0), x.stride(1), BLOCK_R=64, BLOCK_C=64)
    return out
'''
_LINEAR_FNS = ("F.linear",)
_MATMUL_FNS = ("torch.matmul", "torch.mm", "torch.bmm")


@dataclass(frozen=True)
class Gemm:
    """The product as the kernel computes it, and the forward lines that give its operands."""

    op: str  # "linear" | "matmul"
    batch: int
    m: int
    n: int
    k: int
    dtype: str  # of both operands
    a_lines: tuple[str, ...]  # forward lines binding `a` (a (M, K) or (B, M, K) view) ...
    b_lines: tuple[str, ...]  # ... and `b` ((K, N) or (B, K, N))
    a_batched: bool  # a has a batch stride (else every batch reads the same matrix)
    b_batched: bool
    bias: str | None  # forward expression of the (N,) bias, or None
    shapes: tuple[tuple[int, ...], ...]  # the operands' shapes (for the index type)


def gemm_of(chain: Chain) -> Gemm:
    """The chain's head read as a GEMM (GraphError: why it is not one this template computes)."""
    h = chain.head
    if h is None or h.op not in ("linear", "matmul"):
        raise GraphError("the graph has no linear or matmul" if h is None else
                         f"the graph's library op is {'an' if h.op[0] in 'aeiou' else 'a'} {h.op}, not a linear or matmul")
    fn = h.attrs.get("fn")
    if "module" in h.attrs:
        path = h.attrs["module"]
        x = operand(h.args[0], "linear's input")
        w = chain.graph.model.get_parameter(f"{path}.weight")
        weight = (f"self.{path}.weight", tuple(int(d) for d in w.shape), _dtype(w.dtype))
        b = getattr(chain.graph.model.get_submodule(path), "bias", None)
        return _linear(x, weight, None if b is None else (f"self.{path}.bias", tuple(b.shape), _dtype(b.dtype)))
    if fn in _LINEAR_FNS:
        if h.attrs["kwargs"]:
            raise GraphError(f"{h.name}: F.linear with keyword arguments {sorted(h.attrs['kwargs'])}")
        xn, wn = operand(h.args[0], "linear's input"), operand(h.args[1], "linear's weight")
        bn = None if len(h.args) < 3 or h.args[2] is None else operand(h.args[2], "linear's bias")
        return _linear(xn, (ref(wn), wn.shape, wn.dtype), None if bn is None else (ref(bn), bn.shape, bn.dtype))
    if fn in _MATMUL_FNS:
        if h.attrs["kwargs"]:
            raise GraphError(f"{h.name}: {fn} with keyword arguments {sorted(h.attrs['kwargs'])}")
        return _matmul(operand(h.args[0], "matmul's first operand"), operand(h.args[1], "matmul's second operand"))
    raise GraphError(f"{h.name}: {fn} is not a GEMM this template reads")


def _dtype(d: object) -> str:
    return str(d).removeprefix("torch.")


#: A tensor operand as the forward names it: (expression, shape, dtype).
Operand = tuple[str, tuple[int, ...], str]


def _linear(x: Node, weight: Operand, bias: Operand | None) -> Gemm:
    w_ref, w_shape, w_dtype = weight
    if len(w_shape) != 2 or len(x.shape) < 1 or x.shape[-1] != w_shape[1]:
        raise GraphError(f"linear of {x.shape} with a weight of {w_shape}")
    if x.dtype != w_dtype:
        raise GraphError(f"linear of a {x.dtype} input with a {w_dtype} weight")
    if bias is not None and (tuple(bias[1]) != (w_shape[0],) or bias[2] != x.dtype):
        raise GraphError(f"linear with a {bias[2]} bias of shape {tuple(bias[1])} for {w_shape[0]} {x.dtype} outputs")
    k, n = w_shape[1], w_shape[0]
    m = math.prod(x.shape[:-1])
    a = [f"a = {ref(x)}"] if len(x.shape) == 2 else [f"a = {ref(x)}.reshape({m}, {k})"]
    return Gemm("linear", 1, m, n, k, x.dtype, tuple(a), (f"b = {w_ref}.t()",), False, False,
                None if bias is None else bias[0], (x.shape, w_shape))


def _matmul(x: Node, y: Node) -> Gemm:
    if len(x.shape) < 2 or len(y.shape) < 2:
        raise GraphError(f"matmul of {x.shape} and {y.shape}: a vector operand (matrix-vector product)")
    if x.dtype != y.dtype:
        raise GraphError(f"matmul of {x.dtype} and {y.dtype} operands")
    (m, k), (k2, n) = x.shape[-2:], y.shape[-2:]
    if k != k2:
        raise GraphError(f"matmul of {x.shape} and {y.shape}: inner dims differ")
    bx, by = x.shape[:-2], y.shape[:-2]
    if bx and by and bx != by:
        raise GraphError(f"matmul with batch dims {bx} and {by} that broadcast")
    if bx and not by:
        # (..., M, K) @ (K, N) is one GEMM over all the rows, (B*M, K) @ (K, N): its result is the (..., M, N) output
        rows = math.prod(x.shape[:-1])
        return Gemm("matmul", 1, rows, n, k, x.dtype, (f"a = {ref(x)}.reshape({rows}, {k})",), (f"b = {ref(y)}",),
                    False, False, None, (x.shape, y.shape))
    batch = math.prod(bx or by)
    if batch > MAX_BATCH:
        raise GraphError(f"matmul over {batch} batches (a grid axis takes {MAX_BATCH})")

    def view(node: Node, var: str, rows: int, cols: int) -> tuple[str, ...]:
        if len(node.shape) <= 3:
            return (f"{var} = {ref(node)}",)
        return (f"{var} = {ref(node)}.reshape({math.prod(node.shape[:-2])}, {rows}, {cols})",)

    return Gemm("matmul", batch, m, n, k, x.dtype, view(x, "a", m, k), view(y, "b", k, n), bool(bx), bool(by), None,
                (x.shape, y.shape))


def applies(chain: Chain, policy: str = "strict") -> str | None:
    try:
        g = gemm_of(chain)
    except GraphError as e:
        return str(e)
    return epilogue_only(chain, "product") or admits(g.dtype, policy, NAME, "GEMM", split=True)


def space(chain: Chain) -> tuple[tuple[tuple[str, tuple[object, ...]], ...], tuple[tuple[str, object], ...]]:
    """128x128 tiles (64 deep for 16-bit operands, 32 for fp32), cut to the dims' powers of two, with the
    largest GROUP_M that orders them differently from a smaller one."""
    g = gemm_of(chain)
    bm, bn = min(128, max(16, next_pow2(g.m))), min(128, max(16, next_pow2(g.n)))
    bk = min(64 if dtype_bytes(g.dtype) == 2 else 32, max(16, next_pow2(g.k)))
    tiles_m = cdiv(g.m, bm)
    group = 8 if tiles_m > 4 else (4 if tiles_m > 1 else 1)
    return SPACE, (("BLOCK_M", bm), ("BLOCK_N", bn), ("BLOCK_K", bk), ("GROUP_M", group), ("num_warps", 4),
                   ("num_stages", 4 if dtype_bytes(g.dtype) == 2 else 3), ("SPLIT_AT", "kernel"))


def valid(chain: Chain, p: Params) -> bool:
    """Blocks no larger than their dim's power of two (more only computes padding), a GROUP_M that orders the
    tiles differently from the next smaller one (not once both cover every tile row), the pipelined tiles within shared memory, the accumulator within registers."""
    g = gemm_of(chain)
    bm, bn, bk = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"]
    if bm > max(16, next_pow2(g.m)) or bn > max(16, next_pow2(g.n)) or bk > max(16, next_pow2(g.k)):
        return False
    groups = dict(SPACE)["GROUP_M"]
    below = [v for v in groups if isinstance(v, int) and v < p["GROUP_M"]]
    if below and max(below) >= cdiv(g.m, bm):  # orders the tiles as a smaller GROUP_M already does
        return False
    host = p.get("SPLIT_AT") == "host"
    if host and (g.dtype != "float32" or g.batch != 1):
        return False  # nothing to split (16-bit operands), or a batched product (split in the kernel)
    tile_bytes = 3 * 2 * (bm * bk + bk * bn) if host else (bm * bk + bk * bn) * dtype_bytes(g.dtype)
    if p["num_stages"] * tile_bytes > SMEM_BYTES:
        return False
    # pre-split: a step's products go to a tile of their own before the accumulator (`tile_product`)
    return bool(bm * bn * (2 if host else 1) <= ACC_PER_THREAD * 32 * p["num_warps"])


def meta(params: Params) -> Params:
    """The launch's keyword arguments: the schedule without `SPLIT_AT` (the forward's choice, not the kernel's)."""
    return {k: v for k, v in params.items() if k != "SPLIT_AT"}


def hints(chain: Chain) -> list[Params]:
    """Tiles of the shapes cuBLAS-class kernels use on Hopper: a wide 128x256 tile for large products, and
    smaller tiles with deeper pipelines for small ones."""
    common = [{"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
              {"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
              {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 4},
              {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 4}]
    g = gemm_of(chain)
    if g.dtype != "float32":
        return common
    # fp32 split into bf16 parts: in the kernel, 128x128x64 8 warps won gap task 06 on the H200 (2026-12-04,
    # template-probe-2026-12-04-split2: 4035 us, against 4411 at 128x128x32 and 8119 at 128x256x32); pre-split
    # on the host (-split4: 128x128x32 8 warps 4 stages 2984 us, 3 stages 3055, 128x128x64 2 stages 3218, 128x256x32
    # 5680: its step tile and accumulator take 256 registers a thread), the six bf16 tiles a stage bound the
    # pipeline's depth
    split = [{"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3, "SPLIT_AT": "kernel"},
             {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 8, "num_stages": 4, "SPLIT_AT": "host"},
             {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 2, "SPLIT_AT": "host"}]
    return split + common


def fp32_inputs(dtype: str, policy: str) -> str:
    """How the description names fp32 operands' products under `policy`."""
    if dtype != "float32":
        return ""
    return ", TF32 inputs" if policy == "tf32" else f", fp32 operands split into bf16 parts ({SPLIT_FP32})"


def description(chain: Chain, policy: str = "strict") -> str:
    g = gemm_of(chain)
    dims = f"{g.batch}x{g.m}x{g.n}x{g.k}" if g.batch > 1 else f"{g.m}x{g.n}x{g.k}"
    bias = " + bias" if g.bias else ""
    return (f"{g.op} {dims} (BxMxNxK) {g.dtype} in Triton (fp32 accumulation{fp32_inputs(g.dtype, policy)})"
            f"{bias}, epilogue {describe(chain.epilogue)} fused into its store")


def host_split(g: Gemm, params: Params, policy: str) -> bool:
    """Whether the operands are split into bf16 parts before the kernel (`SPLIT_AT` "host", where it applies)."""
    return params.get("SPLIT_AT") == "host" and split_fp32(g.dtype, policy) and g.batch == 1


def operands(g: Gemm, params: Params, policy: str) -> tuple[list[str], list[str], list[str]]:
    """(forward lines binding `a` and `b`, the launch's stride and UPCAST arguments, extra kernel sources)."""
    lines = [*g.a_lines, *g.b_lines]
    if host_split(g, params, policy):
        return ([*lines, "a = _split_bf16x3(a)", "b = _split_bf16x3(b)"],
                ["0, a.stride(1), a.stride(2)", "0, b.stride(1), b.stride(2)", "UPCAST=a.device.type == 'cpu'"],
                [SPLIT_HELPER])
    return lines, [*stride_args(g), upcast("a", g.dtype, policy)], []


def program_order(m: int, n: int, bm: int, bn: int, it: str) -> str:
    """Kernel lines (indented once) giving the program's tile rows `rm` and columns `rn`: the tiles in groups of
    GROUP_M tile rows, column by column within a group (L2 reuse of the A rows and B columns they share)."""
    return f'''    pid = tl.program_id(0)
    tiles_m = {cdiv(m, bm)}
    in_group = GROUP_M * {cdiv(n, bn)}
    first_m = (pid // in_group) * GROUP_M
    group_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_m
    pid_n = (pid % in_group) // group_m
    rm = pid_m.to({it}) * BLOCK_M + tl.arange(0, BLOCK_M).to({it})
    rn = pid_n.to({it}) * BLOCK_N + tl.arange(0, BLOCK_N).to({it})'''


def tile_product(g: Gemm, bm: int, bn: int, bk: int, it: str, policy: str, host: bool = False) -> list[str]:
    """Kernel lines computing `acc`, the fp32 BLOCK_M x BLOCK_N product tile at rows `rm`, columns `rn` of
    batch `bat` (defined before them), from `a_ptr`/`b_ptr` and their strides (`host`: the operands' bf16
    parts, (3, M, K) and (3, K, N), and their six products a step, the smallest first, added to `acc`).

    A K tail: the last step's loads are masked; M and N tails wrap around (rows and columns that are loaded
    but never stored), so the loads along M and N need no mask."""
    m, n, k = g.m, g.n, g.k
    k_mask = k % bk != 0
    a_mask = f", mask=rk[None, :] < {k} - kk, other=0.0" if k_mask else ""
    b_mask = f", mask=rk[:, None] < {k} - kk, other=0.0" if k_mask else ""
    prec = dot_precision(g.dtype, policy)
    head = [f"rk = tl.arange(0, BLOCK_K).to({it})",
            f"ra = {'rm' if m % bm == 0 else f'rm % {m}'}",
            f"rb = {'rn' if n % bn == 0 else f'rn % {n}'}",
            "a_ptrs = a_ptr + bat * stride_ab + ra[:, None] * stride_am + rk[None, :] * stride_ak",
            "b_ptrs = b_ptr + bat * stride_bb + rk[:, None] * stride_bk + rb[None, :] * stride_bn",
            "acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)",
            f"for kk in range(0, {k}, BLOCK_K):"]
    if host:
        loads = [f"    a{j} = tl.load(a_ptrs + {j * m * k}{a_mask})" for j in range(3)]
        loads += [f"    b{j} = tl.load(b_ptrs + {j * k * n}{b_mask})" for j in range(3)]
        # orders 2, then 1, then 0: the smallest first, into a tile of this step's products that an fp32 add puts
        # into `acc`. Chained into `acc` itself the six products of every step (the tensor cores' accumulation
        # does not round to nearest) drifted: H200, 2026-12-04, split-dot-probe-2026-12-04-b, 32768x4096x1024:
        # chained 6.8e-6 relative L2 against float64, a step tile 1.2e-7 (cuBLAS fp32 5.7e-7), 2999 us either way
        pairs = ((2, 0), (1, 1), (0, 2), (1, 0), (0, 1), (0, 0))
        up = [f"a{j} = a{j}.to(tl.float32)" for j in range(3)] + [f"b{j} = b{j}.to(tl.float32)" for j in range(3)]
        return [*head, *loads,
                "    if UPCAST:",  # the interpreter multiplies bf16 tiles as integers (`tensorcore`'s docstring)
                *["        " + line for line in up],
                f"    t = tl.dot(a{pairs[0][0]}, b{pairs[0][1]})",
                *[f"    t = tl.dot(a{i}, b{j}, t)" for i, j in pairs[1:]],
                "    acc += t",
                "    a_ptrs += BLOCK_K * stride_ak",
                "    b_ptrs += BLOCK_K * stride_bk"]
    return [*head,
            f"    a = tl.load(a_ptrs{a_mask})",
            f"    b = tl.load(b_ptrs{b_mask})",
            "    if UPCAST:",
            "        a = a.to(tl.float32)",
            "        b = b.to(tl.float32)",
            "        acc = tl.dot(a, b, acc)",
            "    else:",
            f"        acc = tl.dot(a, b, acc{prec})",
            "    a_ptrs += BLOCK_K * stride_ak",
            "    b_ptrs += BLOCK_K * stride_bk"]


def bias_term(g: Gemm) -> str:
    """What adds the linear's bias (a `bias_ptr` kernel argument) to `acc`, in fp32."""
    return f" + tl.load(bias_ptr + rn, mask=rn < {g.n}, other=0.0).to(tl.float32)[None, :]" if g.bias else ""


def stride_args(g: Gemm) -> list[str]:
    """The forward's stride arguments (batch, rows, columns of `a`, then of `b`; batch stride 0 when shared)."""
    return ["a.stride(0), a.stride(1), a.stride(2)" if g.a_batched else "0, a.stride(0), a.stride(1)",
            "b.stride(0), b.stride(1), b.stride(2)" if g.b_batched else "0, b.stride(0), b.stride(1)"]


def kernel(chain: Chain, params: Params, policy: str) -> Kernel:
    g = gemm_of(chain)
    why = admits(g.dtype, policy, NAME, "GEMM", split=True)
    if why is not None:
        raise GraphError(why)
    m, n = g.m, g.n
    bm, bn, bk = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"]
    space_ = chain.out_shape
    it = index_type(space_, *g.shapes)
    leaf_names, leaf_vals = leaf_kernel_args(chain)
    lsig = "".join(x + ", " for x in leaf_names)
    bias_sig = "bias_ptr, " if g.bias else ""
    em = ExprEmitter("e")
    em.lines.append(f"x = acc{bias_term(g)}")
    res = em.emit(chain.epilogue, "x", "idx", space_, "mask")
    epi = "\n".join("    " + line for line in em.lines)
    host = host_split(g, params, policy)
    tile = "\n".join("    " + line for line in tile_product(g, bm, bn, bk, it, policy, host))
    src = f'''
@triton.jit
def _gemm_kernel(a_ptr, b_ptr, out_ptr, {bias_sig}{lsig}stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 UPCAST: tl.constexpr):
    bat = tl.program_id(1).to({it})
{program_order(m, n, bm, bn, it)}
{tile}
    mask = (rm[:, None] < {m}) & (rn[None, :] < {n})
    idx = bat * {m * n} + rm[:, None] * {n} + rn[None, :]
{epi}
    tl.store(out_ptr + idx, {res}.to({tl_dtype(chain.out_dtype)}), mask=mask)
'''
    lines, tail, helpers = operands(g, params, policy)
    fwd = check_shapes(chain) + lines
    fwd.append(f"out = torch.empty({space_!r}, device=a.device, dtype=torch.{chain.out_dtype})")
    args = ["a", "b", "out", *([g.bias] if g.bias else []), *leaf_vals, *tail]
    grid = f"({cdiv(m, bm) * cdiv(n, bn)}, {g.batch})"
    fwd.append(launch("_gemm_kernel", grid, args, meta(params)))
    fwd.append("return out")
    return Kernel(NAME, policy, description(chain, policy), params, [*helpers, src], fwd)
