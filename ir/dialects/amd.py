"""AMD's TTGIR dialects: `amdg` (TritonAMDGPU: buffer ops, in-thread transpose) and the `rocdl` ops Triton emits."""

from __future__ import annotations

from xdsl.dialects.builtin import I16, I32, IntegerAttr, IntegerType, TensorType
from xdsl.ir import Attribute, Dialect
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.parser import Parser, UnresolvedOperand
from xdsl.printer import Printer
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from .tt import (
    CacheModifierAttr,
    MemSemanticAttr,
    MemSyncScopeAttr,
    PointerType,
    RMWOpAttr,
    element_type,
    shape_of,
    with_element,
)


def _parse_buffer_address(parser: Parser) -> tuple[UnresolvedOperand, UnresolvedOperand, list[UnresolvedOperand]]:
    """`%ptr[%offsets](, %mask(, %other)?)?`."""
    ptr = parser.parse_unresolved_operand()
    parser.parse_punctuation("[")
    offsets = parser.parse_unresolved_operand()
    parser.parse_punctuation("]")
    rest: list[UnresolvedOperand] = []
    while parser.parse_optional_punctuation(",") is not None:
        rest.append(parser.parse_unresolved_operand())
    return ptr, offsets, rest


def _parse_buffer_tail(parser: Parser, op: type[IRDLOperation]) -> tuple[dict[str, Attribute], dict[str, Attribute]]:
    props: dict[str, Attribute] = {}
    if parser.parse_optional_keyword("cacheModifier") is not None:
        parser.parse_punctuation("=")
        props["cache"] = CacheModifierAttr(CacheModifierAttr.parse_parameter(parser))
    attrs = parser.parse_optional_attr_dict()
    for k in list(attrs):
        if k in op.get_irdl_definition().properties:
            props[k] = attrs.pop(k)
    return props, attrs


def _print_buffer_address(printer: Printer, op: IRDLOperation, ptr: str, offsets: str, rest: tuple[str, ...]) -> None:
    printer.print_operand(getattr(op, ptr))
    printer.print_string("[")
    printer.print_operand(getattr(op, offsets))
    printer.print_string("]")
    for name in rest:
        value = getattr(op, name)
        if value is not None:
            printer.print_string(", ")
            printer.print_operand(value)
    cache = op.properties.get("cache")
    if isinstance(cache, CacheModifierAttr) and cache.data.value != "none":
        printer.print_string(f" cacheModifier = {cache.data.value}")
    rest_attrs = {k: v for k, v in (op.properties | op.attributes).items()
                  if k not in ("cache", "operandSegmentSizes", "atomic_rmw_op", "sem", "scope")}
    printer.print_op_attributes(rest_attrs)


def _segments(sizes: list[int]) -> Attribute:
    from xdsl.dialects.builtin import DenseArrayBase

    return DenseArrayBase.from_list(IntegerType(32), sizes)


def _verify_buffer(op: IRDLOperation, ptr: Attribute, offsets: Attribute, data: Attribute) -> None:
    if not isinstance(ptr, PointerType) or ptr.pointee_type != element_type(data):
        raise VerifyException(f"{op.name}: the base must be a scalar pointer to the data's element type")
    if shape_of(offsets) != shape_of(data) or element_type(offsets) != IntegerType(32):
        raise VerifyException(f"{op.name}: offsets must be i32 with the data's shape")


@irdl_op_definition
class BufferLoadOp(IRDLOperation):
    """`amdg.buffer_load %ptr[%offsets][, %mask[, %other]] [cacheModifier = c] {attrs} : type(result)`."""

    name = "amdg.buffer_load"
    ptr = operand_def(PointerType)
    offsets = operand_def(TensorType)
    mask = opt_operand_def()
    other = opt_operand_def()
    result = result_def(TensorType)
    cache = opt_prop_def(CacheModifierAttr)
    stride = opt_operand_def()
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def verify_(self) -> None:
        _verify_buffer(self, self.ptr.type, self.offsets.type, self.result.type)

    @classmethod
    def parse(cls, parser: Parser) -> BufferLoadOp:
        ptr, offsets, rest = _parse_buffer_address(parser)
        props, attrs = _parse_buffer_tail(parser, cls)
        parser.parse_punctuation(":")
        rtype = parser.parse_type()
        types = [PointerType(element_type(rtype)), with_element(rtype, IntegerType(32)),
                 with_element(rtype, IntegerType(1)), rtype][: 2 + len(rest)]
        resolved = parser.resolve_operands([ptr, offsets, *rest], types, parser.pos)
        props["operandSegmentSizes"] = _segments([1, 1, int(len(rest) > 0), int(len(rest) > 1), 0])
        return cls.create(operands=resolved, result_types=[rtype], properties=props, attributes=attrs)

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        _print_buffer_address(printer, self, "ptr", "offsets", ("mask", "other"))
        printer.print_string(" : ")
        printer.print_attribute(self.result.type)


@irdl_op_definition
class BufferStoreOp(IRDLOperation):
    """`amdg.buffer_store %value, %ptr[%offsets][, %mask] [cacheModifier = c] {attrs} : type(value)`."""

    name = "amdg.buffer_store"
    value = operand_def(TensorType)
    ptr = operand_def(PointerType)
    offsets = operand_def(TensorType)
    mask = opt_operand_def()
    cache = opt_prop_def(CacheModifierAttr)
    stride = opt_operand_def()
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def verify_(self) -> None:
        _verify_buffer(self, self.ptr.type, self.offsets.type, self.value.type)

    @classmethod
    def parse(cls, parser: Parser) -> BufferStoreOp:
        value = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        ptr, offsets, rest = _parse_buffer_address(parser)
        props, attrs = _parse_buffer_tail(parser, cls)
        parser.parse_punctuation(":")
        vtype = parser.parse_type()
        types = [vtype, PointerType(element_type(vtype)), with_element(vtype, IntegerType(32)),
                 with_element(vtype, IntegerType(1))][: 3 + len(rest)]
        resolved = parser.resolve_operands([value, ptr, offsets, *rest], types, parser.pos)
        props["operandSegmentSizes"] = _segments([1, 1, 1, int(len(rest) > 0), 0])
        return cls.create(operands=resolved, properties=props, attributes=attrs)

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.value)
        printer.print_string(", ")
        _print_buffer_address(printer, self, "ptr", "offsets", ("mask",))
        printer.print_string(" : ")
        printer.print_attribute(self.value.type)


@irdl_op_definition
class BufferAtomicRMWOp(IRDLOperation):
    """`amdg.buffer_atomic_rmw op, sem, scope, %value, %ptr[%offsets][, %mask] {attrs} : type(result)`."""

    name = "amdg.buffer_atomic_rmw"
    atomic_rmw_op = prop_def(RMWOpAttr)
    sem = prop_def(MemSemanticAttr)
    scope = prop_def(MemSyncScopeAttr)
    value = operand_def(TensorType)
    ptr = operand_def(PointerType)
    offsets = operand_def(TensorType)
    mask = opt_operand_def()
    stride = opt_operand_def()
    result = result_def(TensorType)
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def verify_(self) -> None:
        _verify_buffer(self, self.ptr.type, self.offsets.type, self.value.type)

    @classmethod
    def parse(cls, parser: Parser) -> BufferAtomicRMWOp:
        rmw = RMWOpAttr(RMWOpAttr.parse_parameter(parser))
        parser.parse_punctuation(",")
        sem = MemSemanticAttr(MemSemanticAttr.parse_parameter(parser))
        parser.parse_punctuation(",")
        scope = MemSyncScopeAttr(MemSyncScopeAttr.parse_parameter(parser))
        parser.parse_punctuation(",")
        value = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        ptr, offsets, rest = _parse_buffer_address(parser)
        props, attrs = _parse_buffer_tail(parser, cls)
        props |= {"atomic_rmw_op": rmw, "sem": sem, "scope": scope}
        parser.parse_punctuation(":")
        rtype = parser.parse_type()
        types = [rtype, PointerType(element_type(rtype)), with_element(rtype, IntegerType(32)),
                 with_element(rtype, IntegerType(1))][: 3 + len(rest)]
        resolved = parser.resolve_operands([value, ptr, offsets, *rest], types, parser.pos)
        props["operandSegmentSizes"] = _segments([1, 1, 1, int(len(rest) > 0), 0])
        return cls.create(operands=resolved, result_types=[rtype], properties=props, attributes=attrs)

    def print(self, printer: Printer) -> None:
        printer.print_string(f" {self.atomic_rmw_op.data.value}, {self.sem.data.value}, {self.scope.data.value}, ")
        printer.print_operand(self.value)
        printer.print_string(", ")
        _print_buffer_address(printer, self, "ptr", "offsets", ("mask",))
        printer.print_string(" : ")
        printer.print_attribute(self.result.type)


@irdl_op_definition
class InThreadTransposeOp(IRDLOperation):
    name = "amdg.in_thread_transpose"
    src = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$src attr-dict `:` type($src) `->` type($result)"


AMDG = Dialect("amdg", [BufferLoadOp, BufferStoreOp, BufferAtomicRMWOp, InThreadTransposeOp], [])


@irdl_op_definition
class SetPrioOp(IRDLOperation):
    """`rocdl.s.setprio N`: the wave's instruction-issue priority (`s_setprio`)."""

    name = "rocdl.s.setprio"
    priority = prop_def(IntegerAttr[I16])
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$priority attr-dict"


@irdl_op_definition
class SchedBarrierOp(IRDLOperation):
    """`rocdl.sched.barrier MASK`: which instruction kinds the scheduler may move across this point."""

    name = "rocdl.sched.barrier"
    mask = prop_def(IntegerAttr[I32])
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$mask attr-dict"


@irdl_op_definition
class SBarrierOp(IRDLOperation):
    name = "rocdl.s.barrier"
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "attr-dict"


ROCDL = Dialect("rocdl", [SetPrioOp, SchedBarrierOp, SBarrierOp], [])
