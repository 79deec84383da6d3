"""The `ttng` dialect (TritonNvidiaGPU): Hopper warp-group MMA, its wait, and async-proxy fences."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import I32, BoolAttr, DenseArrayBase, IntegerAttr, IntegerType, TensorType
from xdsl.ir import Attribute, Dialect
from xdsl.irdl import (
    AttrSizedOperandSegments,
    BaseAttr,
    IRDLOperation,
    ParsePropInAttrDict,
    VarConstraint,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from .tt import PointerType, TensorDescType, shape_of
from .ttg import MemDescType


@irdl_op_definition
class WarpGroupDotOp(IRDLOperation):
    """`ttng.warp_group_dot %a, %b, %c[, %useC] {isAsync, ...} : A * B -> D` (`wgmma`)."""

    name = "ttng.warp_group_dot"
    a = operand_def()
    b = operand_def()
    T: ClassVar = VarConstraint("T", BaseAttr(TensorType))
    c = operand_def(T)
    useC = opt_operand_def(IntegerType(1))
    d = result_def(T)
    inputPrecision = opt_prop_def(Attribute)
    maxNumImpreciseAcc = opt_prop_def(IntegerAttr[I32])
    isAsync = opt_prop_def(BoolAttr)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$a `,` $b `,` $c (`,` $useC^)? attr-dict `:` type($a) `*` type($b) `->` type($d)"

    def verify_(self) -> None:
        a, b, d = shape_of(self.a.type), shape_of(self.b.type), shape_of(self.d.type)
        a = a if a is not None else getattr(self.a.type, "get_shape", lambda: None)()
        b = b if b is not None else getattr(self.b.type, "get_shape", lambda: None)()
        if a is None or b is None or d is None or a[-1] != b[-2] or d != (a[-2], b[-1]):
            raise VerifyException(f"ttng.warp_group_dot: shapes {a} x {b} -> {d} do not agree")
        if self.c.type != self.d.type:
            raise VerifyException("ttng.warp_group_dot: accumulator and result types differ")


@irdl_op_definition
class WarpGroupDotWaitOp(IRDLOperation):
    """`ttng.warp_group_dot_wait %values {pendings = N} : types`: wait until at most N wgmma groups are pending."""

    name = "ttng.warp_group_dot_wait"
    inputs = var_operand_def()
    outputs = var_result_def()
    pendings = prop_def(IntegerAttr[I32])

    @classmethod
    def parse(cls, parser: Parser) -> WarpGroupDotWaitOp:
        names = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_unresolved_operand)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        types = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_type)
        operands = parser.resolve_operands(names, types, parser.pos)
        props = {k: attrs.pop(k) for k in list(attrs) if k == "pendings"}
        return cls.create(operands=operands, result_types=types, properties=props, attributes=attrs)

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_list(self.inputs, printer.print_operand)
        printer.print_op_attributes(self.properties | self.attributes)
        printer.print_string(" : ")
        printer.print_list(self.inputs.types, printer.print_attribute)

    def verify_(self) -> None:
        if tuple(self.inputs.types) != tuple(self.outputs.types):
            raise VerifyException("ttng.warp_group_dot_wait: results must have the operands' types")


@irdl_op_definition
class FenceAsyncSharedOp(IRDLOperation):
    name = "ttng.fence_async_shared"
    bCluster = prop_def(BoolAttr)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "attr-dict"


# ---------------------------------------------------------------------------------------------------
# TMA descriptors and copies, mbarriers (Hopper)
# ---------------------------------------------------------------------------------------------------
@irdl_op_definition
class TensormapCreateOp(IRDLOperation):
    """`ttng.tensormap_create %desc_ptr, %global, [box], [global dims], [global strides], [element strides]`."""

    name = "ttng.tensormap_create"
    desc_ptr = operand_def(PointerType)
    global_address = operand_def(PointerType)
    box_dim = var_operand_def(IntegerType(32))
    global_dim = var_operand_def(IntegerType(32))
    global_stride = var_operand_def(IntegerType(64))
    element_stride = var_operand_def(IntegerType(32))
    elem_type = prop_def(IntegerAttr[I32])
    interleave_layout = prop_def(IntegerAttr[I32])
    swizzle_mode = prop_def(IntegerAttr[I32])
    fill_mode = prop_def(IntegerAttr[I32])
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    @classmethod
    def parse(cls, parser: Parser) -> TensormapCreateOp:
        desc = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        address = parser.parse_unresolved_operand()
        groups = []
        for _ in range(4):
            parser.parse_punctuation(",")
            groups.append(parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parser.parse_unresolved_operand))
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        fn = parser.parse_function_type()
        names = [desc, address, *(v for g in groups for v in g)]
        if len(fn.inputs.data) != len(names) or fn.outputs.data:
            parser.raise_error(f"ttng.tensormap_create: expected {len(names)} operand types and no result")
        operands = parser.resolve_operands(names, fn.inputs.data, parser.pos)
        props = {k: attrs.pop(k) for k in list(attrs) if k in cls.get_irdl_definition().properties}
        props["operandSegmentSizes"] = DenseArrayBase.from_list(IntegerType(32), [1, 1, *(len(g) for g in groups)])
        return cls.create(operands=operands, properties=props, attributes=attrs)

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.desc_ptr)
        printer.print_string(", ")
        printer.print_operand(self.global_address)
        for group in (self.box_dim, self.global_dim, self.global_stride, self.element_stride):
            printer.print_string(", [")
            printer.print_list(group, printer.print_operand)
            printer.print_string("]")
        printer.print_op_attributes({k: v for k, v in (self.properties | self.attributes).items()
                                     if k != "operandSegmentSizes"})
        printer.print_string(" : (")
        printer.print_list(self.operand_types, printer.print_attribute)
        printer.print_string(") -> ()")


@irdl_op_definition
class TensormapFenceproxyAcquireOp(IRDLOperation):
    name = "ttng.tensormap_fenceproxy_acquire"
    desc_ptr = operand_def(PointerType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$desc_ptr attr-dict `:` type($desc_ptr)"


@irdl_op_definition
class ReinterpretTensorDescOp(IRDLOperation):
    name = "ttng.reinterpret_tensor_descriptor"
    rawDesc = operand_def(PointerType)
    result = result_def(TensorDescType)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$rawDesc attr-dict `:` type($rawDesc) `to` type($result)"


@irdl_op_definition
class InitBarrierOp(IRDLOperation):
    name = "ttng.init_barrier"
    alloc = operand_def(MemDescType)
    count = prop_def(IntegerAttr[I32])
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$alloc `,` $count attr-dict `:` type($alloc)"


@irdl_op_definition
class InvalBarrierOp(IRDLOperation):
    name = "ttng.inval_barrier"
    alloc = operand_def(MemDescType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$alloc attr-dict `:` type($alloc)"


@irdl_op_definition
class BarrierExpectOp(IRDLOperation):
    name = "ttng.barrier_expect"
    alloc = operand_def(MemDescType)
    size = prop_def(IntegerAttr[I32])
    pred = operand_def(IntegerType(1))
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$alloc `,` $size attr-dict `,` $pred `:` type($alloc)"


@irdl_op_definition
class WaitBarrierOp(IRDLOperation):
    name = "ttng.wait_barrier"
    alloc = operand_def(MemDescType)
    phase = operand_def(IntegerType(32))
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$alloc `,` $phase attr-dict `:` type($alloc)"


@irdl_op_definition
class AsyncTMACopyGlobalToLocalOp(IRDLOperation):
    """`ttng.async_tma_copy_global_to_local %desc[%coords] %dst, %barrier, %pred : D, B -> M`."""

    name = "ttng.async_tma_copy_global_to_local"
    desc = operand_def(TensorDescType)
    coord = var_operand_def(IntegerType(32))
    result = operand_def(MemDescType)
    barrier = operand_def(MemDescType)
    pred = operand_def(IntegerType(1))
    cache = opt_prop_def(Attribute)
    evict = opt_prop_def(Attribute)
    isVolatile = opt_prop_def(BoolAttr)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = ("$desc `[` $coord `]` $result `,` $barrier `,` $pred attr-dict `:` type($desc) `,` "
                       "type($barrier) `->` type($result)")


@irdl_op_definition
class AsyncTMACopyLocalToGlobalOp(IRDLOperation):
    name = "ttng.async_tma_copy_local_to_global"
    desc = operand_def(TensorDescType)
    coord = var_operand_def(IntegerType(32))
    src = operand_def(MemDescType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$desc `[` $coord `]` $src attr-dict `:` type($desc) `,` type($src)"


@irdl_op_definition
class AsyncTMAStoreWaitOp(IRDLOperation):
    name = "ttng.async_tma_store_wait"
    pendings = prop_def(IntegerAttr[I32])
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "attr-dict"


TTNG = Dialect("ttng", [
    WarpGroupDotOp, WarpGroupDotWaitOp, FenceAsyncSharedOp, TensormapCreateOp, TensormapFenceproxyAcquireOp,
    ReinterpretTensorDescOp, InitBarrierOp, InvalBarrierOp, BarrierExpectOp, WaitBarrierOp,
    AsyncTMACopyGlobalToLocalOp, AsyncTMACopyLocalToGlobalOp, AsyncTMAStoreWaitOp,
], [])
