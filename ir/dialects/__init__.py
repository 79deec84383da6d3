"""xDSL dialects for Triton 3.6's TTIR and TTGIR: `tt`, `ttg`, `ttng`, `amdg`, `rocdl`, with xDSL's `arith`, `math`, `scf`, `cf`, `ub`,
and the `gpu.barrier` / `llvm.intr.assume` ops Triton leaves in TTGIR.

`triton_context()` returns an xDSL context in which every op, type and attribute that Triton emits for
`cuda:*` and `hip:*` is registered; `kstrata.ir.triton_ir` parses and prints modules in that context.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.ir import Dialect

from .amd import AMDG, ROCDL
from .core import ARITH, BUILTIN, CF, MATH, SCF, UB
from .gpu_llvm import GPU, LLVM
from .tt import TT
from .ttg import TTG
from .ttng import TTNG

#: Every dialect a Triton module may use, by name.
TRITON_DIALECTS: tuple[Dialect, ...] = (BUILTIN, TT, TTG, TTNG, AMDG, ROCDL, ARITH, MATH, SCF, CF, UB, GPU, LLVM)


def triton_context() -> Context:
    """A fresh xDSL context with the Triton dialects (and the builtin one) registered."""
    ctx = Context()
    for dialect in TRITON_DIALECTS:
        ctx.load_dialect(dialect)
    return ctx


def defined_op_names() -> list[str]:
    """Every op name the dialects define, sorted."""
    return sorted(op.name for d in TRITON_DIALECTS for op in d.operations)


__all__ = ["TRITON_DIALECTS", "defined_op_names", "triton_context"]
