"""Pointwise chains: any chain of elementwise ops (activations, scalings, clamps, residuals, with broadcasting of
parameters and other inputs) in one Triton kernel, after at most one library op (convolution, linear,
matmul) that PyTorch computes. Eager runs one kernel per op, each reading and writing the whole tensor."""

from __future__ import annotations

import math

from kstrata.agents.templates.base import Params
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
    uses_root,
)
from kstrata.agents.templates.graph import Chain, describe

NAME = "pointwise"
SPACE = (("BLOCK", (512, 1024, 2048, 4096)), ("num_warps", (4, 8)))
DEFAULT = (("BLOCK", 1024), ("num_warps", 4))


def applies(chain: Chain, policy: str = "strict") -> str | None:
    """None when the template covers the chain, else why not."""
    if chain.core is not None:
        return f"the graph has a {chain.core.op}, not only pointwise ops"
    if chain.head is not None and chain.epilogue == chain.prologue:
        return "nothing to fuse after the library op"
    return None


def description(chain: Chain, policy: str = "strict") -> str:
    head = f"{chain.head.op} (PyTorch) then " if chain.head else ""
    return f"{head}one fused Triton kernel for {describe(chain.epilogue)}"


def kernel(chain: Chain, params: Params, policy: str) -> Kernel:
    space = chain.out_shape
    n = math.prod(space)
    it = index_type(space, chain.root.shape)
    em = ExprEmitter()
    body = [f"    idx = tl.program_id(0).to({it}) * BLOCK + tl.arange(0, BLOCK).to({it})", f"    mask = idx < {n}"]
    if uses_root(chain.epilogue):
        body.append("    " + root_load(chain, space, "idx", "mask"))
    res = em.emit(chain.epilogue, "x", "idx", space, "mask")
    body += ["    " + line for line in em.lines]
    body.append(f"    tl.store(out_ptr + idx, ({res} + tl.zeros([BLOCK], tl.float32)).to({tl_dtype(chain.out_dtype)}), mask=mask)")
    names, values = leaf_kernel_args(chain)
    src = ["", "@triton.jit", f"def _pointwise_kernel(h_ptr, out_ptr, {''.join(a + ', ' for a in names)}BLOCK: tl.constexpr):",
           *body]
    fwd = check_shapes(chain) + head_code(chain)
    fwd.append(f"out = torch.empty({space!r}, device=h.device, dtype=torch.{chain.out_dtype})")
    grid = f"(triton.cdiv({n}, {params['BLOCK']}),)"
    fwd.append(launch("_pointwise_kernel", grid, ["h", "out", *values], params))
    fwd.append("return out")
    return Kernel(NAME, policy, description(chain), params, ["\n".join(src)], fwd)
