"""The upstream MLIR dialects Triton modules use (`arith`, `math`, `scf`, `cf`, `ub`), taken from xDSL.

Where xDSL's textual form differs from MLIR's for what Triton prints, the op is redefined here with
MLIR's exact format; everything else is xDSL's own definition.
"""

from __future__ import annotations

from typing import ClassVar, Self

from xdsl.dialects import arith, builtin, cf, math, scf, ub
from xdsl.dialects.arith import FastMathFlagsAttr
from xdsl.dialects.builtin import IndexType, IntegerAttr, IntegerType, TensorType
from xdsl.ir import Attribute, Dialect
from xdsl.irdl import (
    AnyAttr,
    IRDLOperation,
    ParsePropInAttrDict,
    VarConstraint,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

BUILTIN = builtin.Builtin

MATH = math.Math
CF = cf.Cf
UB = ub.UB


# ---------------------------------------------------------------------------------------------------
# arith ops whose xDSL definitions only take scalars where MLIR (and Triton) use tensors too
# ---------------------------------------------------------------------------------------------------
def _i1_like(t: Attribute) -> Attribute:
    """`i1`, or a tensor of `i1` of `t`'s shape and encoding."""
    if isinstance(t, TensorType):
        return TensorType(IntegerType(1), t.get_shape(), t.encoding)
    return IntegerType(1)


class _Compare(IRDLOperation):
    """`arith.cmpi`/`arith.cmpf`: `predicate, %lhs, %rhs : type`; the result is i1 of the operands' shape."""

    MNEMONICS: ClassVar[dict[int, str]] = {}
    T: ClassVar = VarConstraint("T", AnyAttr())
    predicate = prop_def(IntegerAttr)
    lhs = operand_def(T)
    rhs = operand_def(T)
    result = result_def()
    traits = traits_def(Pure())

    def verify_(self) -> None:
        if self.result.type != _i1_like(self.lhs.type):
            raise VerifyException(f"{self.name}: result must be {_i1_like(self.lhs.type)}, got {self.result.type}")
        if self.predicate.value.data not in self.MNEMONICS:
            raise VerifyException(f"{self.name}: unknown predicate {self.predicate.value.data}")

    @classmethod
    def parse(cls, parser: Parser) -> Self:
        codes = {v: k for k, v in cls.MNEMONICS.items()}
        pos = parser.pos
        mnemonic = parser.parse_identifier()
        if mnemonic not in codes:
            parser.raise_error(f"{cls.name}: expected a predicate ({', '.join(codes)}), got `{mnemonic}`", pos)
        parser.parse_punctuation(",")
        lhs = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        rhs = parser.parse_unresolved_operand()
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        t = parser.parse_type()
        operands = parser.resolve_operands([lhs, rhs], [t, t], parser.pos)
        props: dict[str, Attribute] = {"predicate": IntegerAttr(codes[mnemonic], 64)}
        props |= {k: attrs.pop(k) for k in list(attrs) if k in cls.get_irdl_definition().properties}
        return cls.create(operands=operands, result_types=[_i1_like(t)], properties=props, attributes=attrs)

    def print(self, printer: Printer) -> None:
        printer.print_string(f" {self.MNEMONICS[self.predicate.value.data]}, ")
        printer.print_operand(self.lhs)
        printer.print_string(", ")
        printer.print_operand(self.rhs)
        rest = {k: v for k, v in (self.properties | self.attributes).items()
                if k != "predicate" and not (k == "fastmath" and v == FastMathFlagsAttr("none"))}
        printer.print_op_attributes(rest)
        printer.print_string(" : ")
        printer.print_attribute(self.lhs.type)


@irdl_op_definition
class CmpiOp(_Compare):
    name = "arith.cmpi"
    MNEMONICS: ClassVar[dict[int, str]] = dict(enumerate(arith.CMPI_COMPARISON_OPERATIONS))


@irdl_op_definition
class CmpfOp(_Compare):
    name = "arith.cmpf"
    MNEMONICS: ClassVar[dict[int, str]] = dict(enumerate(arith.CMPF_COMPARISON_OPERATIONS))
    fastmath = opt_prop_def(FastMathFlagsAttr)


@irdl_op_definition
class SelectOp(IRDLOperation):
    """`arith.select %c, %a, %b : T` (scalar `%c`) or `: type(c), T` (a tensor of `i1`)."""

    name = "arith.select"
    T: ClassVar = VarConstraint("T", AnyAttr())
    cond = operand_def()
    lhs = operand_def(T)
    rhs = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())

    def verify_(self) -> None:
        if self.cond.type != IntegerType(1) and self.cond.type != _i1_like(self.result.type):
            raise VerifyException(f"arith.select: condition must be i1 or {_i1_like(self.result.type)}")

    @classmethod
    def parse(cls, parser: Parser) -> SelectOp:
        names = [parser.parse_unresolved_operand()]
        for _ in range(2):
            parser.parse_punctuation(",")
            names.append(parser.parse_unresolved_operand())
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        first = parser.parse_type()
        if parser.parse_optional_punctuation(",") is not None:
            cond_type, t = first, parser.parse_type()
        else:
            cond_type, t = IntegerType(1), first
        operands = parser.resolve_operands(names, [cond_type, t, t], parser.pos)
        return cls.create(operands=operands, result_types=[t], attributes=attrs)

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_list(self.operands, printer.print_operand)
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        if isinstance(self.cond.type, TensorType):
            printer.print_attribute(self.cond.type)
            printer.print_string(", ")
        printer.print_attribute(self.result.type)


_REPLACED: dict[str, type[IRDLOperation]] = {CmpiOp.name: CmpiOp, CmpfOp.name: CmpfOp, SelectOp.name: SelectOp}


# ---------------------------------------------------------------------------------------------------
# arith casts: xDSL restricts several to scalars; Triton casts tensors elementwise
# ---------------------------------------------------------------------------------------------------
class _Cast(IRDLOperation):
    """`%y = arith.<cast> %x : type(x) to type(y)`, on scalars or on tensors of one shape."""

    input = operand_def()
    result = result_def()
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input) `to` type($result)"

    def verify_(self) -> None:
        src, dst = self.input.type, self.result.type
        if isinstance(src, TensorType) != isinstance(dst, TensorType) or (
                isinstance(src, TensorType) and isinstance(dst, TensorType)
                and (src.get_shape() != dst.get_shape() or src.encoding != dst.encoding)):
            raise VerifyException(f"{self.name}: {src} and {dst} differ in shape or encoding")


def _cast(op_name: str) -> type[IRDLOperation]:
    cls = type(op_name.split(".")[1].title().replace("_", "") + "Op", (_Cast,), {"name": op_name, "__module__": __name__})
    return irdl_op_definition(cls)


_CASTS = {name: _cast(name) for name in (
    "arith.extsi", "arith.extui", "arith.trunci", "arith.extf", "arith.truncf", "arith.sitofp", "arith.uitofp",
    "arith.fptosi", "arith.fptoui", "arith.index_cast", "arith.bitcast")}


class ForOp(scf.ForOp):
    """`scf.for` (xDSL's definition), printed as MLIR prints it: two spaces before the induction variable's type."""

    def print(self, printer: Printer) -> None:
        indvar, *iter_args = self.body.block.args
        printer.print_string(" ")
        printer.print_ssa_value(indvar)
        printer.print_string(" = ")
        printer.print_ssa_value(self.lb)
        printer.print_string(" to ")
        printer.print_ssa_value(self.ub)
        printer.print_string(" step ")
        printer.print_ssa_value(self.step)
        if iter_args:
            printer.print_string(" iter_args(")
            for i, (arg, init) in enumerate(zip(iter_args, self.iter_args, strict=True)):
                if i:
                    printer.print_string(", ")
                printer.print_ssa_value(arg)
                printer.print_string(" = ")
                printer.print_ssa_value(init)
            printer.print_string(") -> (")
            printer.print_list((arg.type for arg in iter_args), printer.print_attribute)
            printer.print_string(")")
        if not isinstance(indvar.type, IndexType):
            printer.print_string("  : ")
            printer.print_attribute(indvar.type)
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=False, print_empty_block=False,
                             print_block_terminators=bool(self.iter_args))
        printer.print_op_attributes(self.attributes)


_REPLACED |= _CASTS
ARITH = Dialect("arith", [_REPLACED.get(op.name, op) for op in arith.Arith.operations], list(arith.Arith.attributes))
SCF = Dialect("scf", [ForOp if op.name == "scf.for" else op for op in scf.Scf.operations], list(scf.Scf.attributes))
