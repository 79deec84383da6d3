"""The few `gpu` and `llvm` ops Triton leaves in TTGIR: `gpu.barrier` (a CTA-wide barrier, e.g. between
the two phases of a split reduction) and `llvm.intr.assume` (Inductor's alignment and range hints)."""

from __future__ import annotations

from xdsl.dialects.builtin import IntegerType
from xdsl.ir import Dialect
from xdsl.irdl import IRDLOperation, ParsePropInAttrDict, irdl_op_definition, operand_def


@irdl_op_definition
class BarrierOp(IRDLOperation):
    """`gpu.barrier`: every thread of the CTA waits here."""

    name = "gpu.barrier"
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "attr-dict"


@irdl_op_definition
class AssumeOp(IRDLOperation):
    """`llvm.intr.assume %cond : i1`: the optimizer may take `%cond` to be true."""

    name = "llvm.intr.assume"
    cond = operand_def(IntegerType(1))
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$cond attr-dict `:` type($cond)"


GPU = Dialect("gpu", [BarrierOp], [])
LLVM = Dialect("llvm", [AssumeOp], [])
