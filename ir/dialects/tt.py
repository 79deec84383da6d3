"""The `tt` dialect (Triton's target-independent IR, TTIR), as Triton 3.6 defines and prints it.

Types: `!tt.ptr<T[, addrspace]>`. Enum attributes: program-id axis, atomic op, memory semantics and
scope, cache modifier, eviction policy, dot input precision, rounding mode. Ops follow the assembly
formats of `TritonOps.td`; those whose result type is implied by an operand type (`tt.load`) or that
Triton prints in generic form (`tt.reduce`, `tt.scan`) are written out here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import (
    I32,
    ArrayAttr,
    BoolAttr,
    DenseArrayBase,
    DictionaryAttr,
    FunctionType,
    IntAttr,
    IntegerAttr,
    IntegerType,
    NoneAttr,
    StringAttr,
    SymbolRefAttr,
    TensorType,
    UnitAttr,
)
from xdsl.dialects.utils import EnumAttribute
from xdsl.dialects.utils.format import parse_func_op_like
from xdsl.ir import Attribute, Dialect, ParametrizedAttribute, SpacedOpaqueSyntaxAttribute, TypeAttribute
from xdsl.irdl import (
    AnyAttr,
    AttrSizedOperandSegments,
    BaseAttr,
    IRDLOperation,
    ParsePropInAttrDict,
    VarConstraint,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import (
    HasParent,
    IsolatedFromAbove,
    IsTerminator,
    Pure,
    SymbolOpInterface,
)
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum


# ---------------------------------------------------------------------------------------------------
# Types
# ---------------------------------------------------------------------------------------------------
@irdl_attr_definition
class PointerType(ParametrizedAttribute, TypeAttribute):
    """`!tt.ptr<pointee[, address space]>`; address space 1 (global) is left out when printed."""

    name = "tt.ptr"

    pointee_type: Attribute
    address_space: IntAttr

    def __init__(self, pointee_type: Attribute, address_space: int = 1) -> None:
        super().__init__(pointee_type, IntAttr(address_space))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            pointee = parser.parse_type()
            space = 1
            if parser.parse_optional_punctuation(",") is not None:
                space = parser.parse_integer(allow_boolean=False)
        return (pointee, IntAttr(space))

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("<")
        printer.print_attribute(self.pointee_type)
        if self.address_space.data != 1:
            printer.print_string(f", {self.address_space.data}")
        printer.print_string(">")


@irdl_attr_definition
class TensorDescType(ParametrizedAttribute, TypeAttribute):
    """`!tt.tensordesc<tensor<64x64xf16[, #shared]>>`: a TMA tensor descriptor for blocks of that type."""

    name = "tt.tensordesc"

    block_type: TensorType[Attribute]

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            block = parser.parse_type()
        if not isinstance(block, TensorType):
            parser.raise_error(f"!tt.tensordesc: expected a tensor type, got {block}")
        return (block,)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("<")
        printer.print_attribute(self.block_type)
        printer.print_string(">")


def element_type(t: Attribute) -> Attribute:
    """The element type of a tensor, else the type itself."""
    return t.element_type if isinstance(t, TensorType) else t


def shape_of(t: Attribute) -> tuple[int, ...] | None:
    """The shape of a tensor type, `None` for a scalar."""
    return t.get_shape() if isinstance(t, TensorType) else None


def encoding_of(t: Attribute) -> Attribute | None:
    if isinstance(t, TensorType) and not isinstance(t.encoding, NoneAttr):
        return t.encoding
    return None


def pointee_of(t: Attribute) -> Attribute:
    """What a pointer (or tensor of pointers) points to; raises `VerifyException` for a non-pointer."""
    elt = element_type(t)
    if not isinstance(elt, PointerType):
        raise VerifyException(f"expected a pointer or a tensor of pointers, got {t}")
    return elt.pointee_type


def with_element(t: Attribute, elt: Attribute) -> Attribute:
    """`t` with its element type replaced (a tensor keeps its shape and encoding)."""
    if isinstance(t, TensorType):
        return TensorType(elt, t.get_shape(), t.encoding)
    return elt


def check_same_shape(op: IRDLOperation, *types: Attribute) -> None:
    """Operands and results that Triton requires to have the same shape (and encoding)."""
    shapes = {(shape_of(t), encoding_of(t)) for t in types}
    if len(shapes) > 1:
        raise VerifyException(f"{op.name}: operands and results must have the same shape and encoding, got "
                              + ", ".join(str(t) for t in types))


# ---------------------------------------------------------------------------------------------------
# Enum attributes
# ---------------------------------------------------------------------------------------------------
class ProgramIDDim(StrEnum):
    X = "x"
    Y = "y"
    Z = "z"


class RMWOp(StrEnum):
    AND = "and"
    OR = "or"
    XOR = "xor"
    ADD = "add"
    FADD = "fadd"
    MAX = "max"
    MIN = "min"
    UMAX = "umax"
    UMIN = "umin"
    XCHG = "exch"


class MemSemantic(StrEnum):
    RELAXED = "relaxed"
    ACQUIRE = "acquire"
    RELEASE = "release"
    ACQ_REL = "acq_rel"


class MemSyncScope(StrEnum):
    GPU = "gpu"
    CTA = "cta"
    SYSTEM = "sys"


class CacheModifier(StrEnum):
    NONE = "none"
    CA = "ca"
    CG = "cg"
    WB = "wb"
    CS = "cs"
    WT = "wt"
    CV = "cv"


class EvictionPolicy(StrEnum):
    NORMAL = "evict_normal"
    EVICT_FIRST = "evict_first"
    EVICT_LAST = "evict_last"


class InputPrecision(StrEnum):
    TF32 = "tf32"
    TF32x3 = "tf32x3"
    IEEE = "ieee"
    BF16x3 = "bf16x3"
    BF16x6 = "bf16x6"


class RoundingMode(StrEnum):
    RTZ = "rtz"
    RTNE = "rtne"


class PaddingOption(StrEnum):
    ZERO = "zero"
    NAN = "nan"


@irdl_attr_definition
class ProgramIDDimAttr(EnumAttribute[ProgramIDDim], SpacedOpaqueSyntaxAttribute):
    name = "tt.proc_id"


@irdl_attr_definition
class RMWOpAttr(EnumAttribute[RMWOp], SpacedOpaqueSyntaxAttribute):
    name = "tt.rmw_op"


@irdl_attr_definition
class MemSemanticAttr(EnumAttribute[MemSemantic], SpacedOpaqueSyntaxAttribute):
    name = "tt.mem_semantic"


@irdl_attr_definition
class MemSyncScopeAttr(EnumAttribute[MemSyncScope], SpacedOpaqueSyntaxAttribute):
    name = "tt.mem_sync_scope"


@irdl_attr_definition
class CacheModifierAttr(EnumAttribute[CacheModifier], SpacedOpaqueSyntaxAttribute):
    name = "tt.cache_modifier"


@irdl_attr_definition
class EvictionPolicyAttr(EnumAttribute[EvictionPolicy], SpacedOpaqueSyntaxAttribute):
    name = "tt.eviction_policy"


@irdl_attr_definition
class InputPrecisionAttr(EnumAttribute[InputPrecision], SpacedOpaqueSyntaxAttribute):
    name = "tt.input_precision"


@irdl_attr_definition
class RoundingModeAttr(EnumAttribute[RoundingMode], SpacedOpaqueSyntaxAttribute):
    name = "tt.rounding_mode"


@irdl_attr_definition
class PaddingOptionAttr(EnumAttribute[PaddingOption], SpacedOpaqueSyntaxAttribute):
    name = "tt.padding_option"


# ---------------------------------------------------------------------------------------------------
# Functions
# ---------------------------------------------------------------------------------------------------
@irdl_op_definition
class FuncOp(IRDLOperation):
    """`tt.func [public|private] @name(%arg: T {attrs} loc(..), ...) -> R attributes {...} { ... }`."""

    name = "tt.func"

    body = region_def()
    sym_name = prop_def(StringAttr)
    function_type = prop_def(FunctionType)
    sym_visibility = opt_prop_def(StringAttr)
    arg_attrs = opt_prop_def(ArrayAttr[DictionaryAttr])
    res_attrs = opt_prop_def(ArrayAttr[DictionaryAttr])

    traits = traits_def(IsolatedFromAbove(), SymbolOpInterface())

    def verify_(self) -> None:
        if self.body.blocks:
            block = self.body.blocks.first
            assert block is not None
            if tuple(block.arg_types) != self.function_type.inputs.data:
                raise VerifyException(f"tt.func @{self.sym_name.data}: entry block arguments differ from the signature")

    @classmethod
    def parse(cls, parser: Parser) -> FuncOp:
        visibility = parser.parse_optional_visibility_keyword()
        name, inputs, outputs, region, extra, arg_attrs, res_attrs = parse_func_op_like(
            parser, reserved_attr_names=("sym_name", "function_type", "sym_visibility", "arg_attrs", "res_attrs"))
        props: dict[str, Attribute | None] = {
            "sym_name": StringAttr(name), "function_type": FunctionType.from_lists(inputs, outputs),
            "sym_visibility": visibility, "arg_attrs": arg_attrs, "res_attrs": res_attrs,
        }
        op = cls.create(properties={k: v for k, v in props.items() if v is not None}, regions=[region])
        if extra is not None:
            op.attributes |= extra.data
        return op

    def print(self, printer: Printer) -> None:
        if self.sym_visibility is not None:
            printer.print_string(f" {self.sym_visibility.data}")
        printer.print_string(" ")
        printer.print_symbol_name(self.sym_name.data)
        block = self.body.blocks.first
        arg_attrs = self.arg_attrs.data if self.arg_attrs is not None else ()
        printer.print_string("(")
        for i, t in enumerate(self.function_type.inputs.data):
            if i:
                printer.print_string(", ")
            if block is not None:
                printer.print_ssa_value(block.args[i])
                printer.print_string(": ")
            printer.print_attribute(t)
            if i < len(arg_attrs) and arg_attrs[i].data:
                printer.print_string(" ")
                printer.print_attr_dict(arg_attrs[i].data)
            if block is not None:
                print_arg_location = getattr(printer, "print_arg_location", None)
                if print_arg_location is not None:
                    print_arg_location(block.args[i])
        printer.print_string(")")
        outputs = self.function_type.outputs.data
        if outputs:
            printer.print_string(" -> ")
            if len(outputs) == 1:
                printer.print_attribute(outputs[0])
            else:
                printer.print_string("(")
                printer.print_list(outputs, printer.print_attribute)
                printer.print_string(")")
        printer.print_op_attributes(self.attributes, print_keyword=True)
        if block is not None:
            printer.print_string(" ")
            printer.print_region(self.body, print_entry_block_args=False, print_empty_block=False)


@irdl_op_definition
class ReturnOp(IRDLOperation):
    name = "tt.return"
    srcs = var_operand_def()
    traits = traits_def(IsTerminator(), HasParent(FuncOp), Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "attr-dict ($srcs^ `:` type($srcs))?"


@irdl_op_definition
class CallOp(IRDLOperation):
    name = "tt.call"
    callee = prop_def(SymbolRefAttr)
    operands_ = var_operand_def()
    results_ = var_result_def()
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$callee `(` $operands_ `)` attr-dict `:` functional-type($operands_, $results_)"


# ---------------------------------------------------------------------------------------------------
# Shape and layout manipulation
# ---------------------------------------------------------------------------------------------------
class _UnaryTo(IRDLOperation):
    """Ops printed `%src attr-dict : type(src) -> type(result)`."""

    src = operand_def()
    result = result_def()
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$src attr-dict `:` type($src) `->` type($result)"
    traits = traits_def(Pure())


@irdl_op_definition
class SplatOp(_UnaryTo):
    name = "tt.splat"

    def verify_(self) -> None:
        if not isinstance(self.result.type, TensorType) or self.result.type.element_type != self.src.type:
            raise VerifyException(f"tt.splat: result must be a tensor of {self.src.type}, got {self.result.type}")


@irdl_op_definition
class BroadcastOp(_UnaryTo):
    name = "tt.broadcast"

    def verify_(self) -> None:
        src, res = shape_of(self.src.type), shape_of(self.result.type)
        if src is None or res is None or len(src) != len(res):
            raise VerifyException("tt.broadcast: source and result must be tensors of the same rank")
        if any(s != r and s != 1 for s, r in zip(src, res, strict=True)):
            raise VerifyException(f"tt.broadcast: cannot broadcast {list(src)} to {list(res)}")
        if element_type(self.src.type) != element_type(self.result.type):
            raise VerifyException("tt.broadcast: element types differ")


@irdl_op_definition
class ExpandDimsOp(_UnaryTo):
    name = "tt.expand_dims"
    axis = prop_def(IntegerAttr[I32])

    def verify_(self) -> None:
        src, res = shape_of(self.src.type), shape_of(self.result.type)
        axis = self.axis.value.data
        if src is None or res is None or list(res) != [*src[:axis], 1, *src[axis:]]:
            raise VerifyException(f"tt.expand_dims: result shape must insert 1 at axis {axis}")


@irdl_op_definition
class ReshapeOp(IRDLOperation):
    name = "tt.reshape"
    src = operand_def()
    result = result_def()
    allow_reorder = opt_prop_def(UnitAttr)
    efficient_layout = opt_prop_def(UnitAttr)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = ("$src (`allow_reorder` $allow_reorder^)? (`efficient_layout` $efficient_layout^)? "
                       "attr-dict `:` type($src) `->` type($result)")


@irdl_op_definition
class TransOp(_UnaryTo):
    name = "tt.trans"
    order = prop_def(DenseArrayBase)


@irdl_op_definition
class BitcastOp(_UnaryTo):
    name = "tt.bitcast"


@irdl_op_definition
class IntToPtrOp(_UnaryTo):
    name = "tt.int_to_ptr"


@irdl_op_definition
class PtrToIntOp(_UnaryTo):
    name = "tt.ptr_to_int"


@irdl_op_definition
class FpToFpOp(IRDLOperation):
    name = "tt.fp_to_fp"
    src = operand_def()
    result = result_def()
    rounding = opt_prop_def(RoundingModeAttr)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$src attr-dict (`,` `rounding` `=` $rounding^)? `:` type($src) `->` type($result)"


@irdl_op_definition
class CatOp(IRDLOperation):
    name = "tt.cat"
    T: ClassVar = VarConstraint("T", AnyAttr())
    lhs = operand_def(T)
    rhs = operand_def(T)
    result = result_def()
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$lhs `,` $rhs attr-dict `:` type($lhs) `->` type($result)"


@irdl_op_definition
class JoinOp(IRDLOperation):
    name = "tt.join"
    T: ClassVar = VarConstraint("T", AnyAttr())
    lhs = operand_def(T)
    rhs = operand_def(T)
    result = result_def()
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$lhs `,` $rhs attr-dict `:` type($lhs) `->` type($result)"


@irdl_op_definition
class SplitOp(IRDLOperation):
    name = "tt.split"
    T: ClassVar = VarConstraint("T", AnyAttr())
    src = operand_def()
    out_lhs = result_def(T)
    out_rhs = result_def(T)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$src attr-dict `:` type($src) `->` type($out_lhs)"


@irdl_op_definition
class MakeRangeOp(IRDLOperation):
    name = "tt.make_range"
    start = prop_def(IntegerAttr[I32])
    end = prop_def(IntegerAttr[I32])
    result = result_def()
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "attr-dict `:` type($result)"

    def verify_(self) -> None:
        shape = shape_of(self.result.type)
        n = self.end.value.data - self.start.value.data
        if shape is None or len(shape) != 1 or shape[0] != n:
            raise VerifyException(f"tt.make_range: result must be a 1-d tensor of {n} elements, got {self.result.type}")
        if element_type(self.result.type) != IntegerType(32):
            raise VerifyException("tt.make_range: result elements must be i32")


# ---------------------------------------------------------------------------------------------------
# Program ids and pointer arithmetic
# ---------------------------------------------------------------------------------------------------
@irdl_op_definition
class GetProgramIdOp(IRDLOperation):
    name = "tt.get_program_id"
    axis = prop_def(ProgramIDDimAttr)
    result = result_def(IntegerType(32))
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$axis attr-dict `:` type($result)"


@irdl_op_definition
class GetNumProgramsOp(IRDLOperation):
    name = "tt.get_num_programs"
    axis = prop_def(ProgramIDDimAttr)
    result = result_def(IntegerType(32))
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$axis attr-dict `:` type($result)"


@irdl_op_definition
class AddPtrOp(IRDLOperation):
    name = "tt.addptr"
    T: ClassVar = VarConstraint("T", AnyAttr())
    ptr = operand_def(T)
    offset = operand_def()
    result = result_def(T)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$ptr `,` $offset attr-dict `:` type($result) `,` type($offset)"

    def verify_(self) -> None:
        pointee_of(self.ptr.type)
        if self.ptr.type != self.result.type:
            raise VerifyException("tt.addptr: result type must equal the pointer type")
        check_same_shape(self, self.ptr.type, self.offset.type)


@irdl_op_definition
class AdvanceOp(IRDLOperation):
    name = "tt.advance"
    T: ClassVar = VarConstraint("T", AnyAttr())
    ptr = operand_def(T)
    offsets = var_operand_def(IntegerType(32))
    result = result_def(T)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$ptr `,` `[` $offsets `]` attr-dict `:` type($result)"


@irdl_op_definition
class MulhiUIOp(IRDLOperation):
    name = "tt.mulhiui"
    T: ClassVar = VarConstraint("T", AnyAttr())
    x = operand_def(T)
    y = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$x `,` $y attr-dict `:` type($x)"


@irdl_op_definition
class PreciseSqrtOp(IRDLOperation):
    name = "tt.precise_sqrt"
    T: ClassVar = VarConstraint("T", AnyAttr())
    x = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$x attr-dict `:` type($x)"


@irdl_op_definition
class PreciseDivFOp(IRDLOperation):
    name = "tt.precise_divf"
    T: ClassVar = VarConstraint("T", AnyAttr())
    x = operand_def(T)
    y = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$x `,` $y attr-dict `:` type($x)"


@irdl_op_definition
class ClampFOp(IRDLOperation):
    name = "tt.clampf"
    T: ClassVar = VarConstraint("T", AnyAttr())
    x = operand_def(T)
    min = operand_def(T)
    max = operand_def(T)
    propagateNan = prop_def(Attribute)
    result = result_def(T)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$x `,` $min `,` $max `,` `propagateNan` `=` $propagateNan attr-dict `:` type($result)"


# ---------------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------------
def _parse_cache_evict(parser: Parser) -> dict[str, Attribute]:
    props: dict[str, Attribute] = {}
    while True:
        if parser.parse_optional_keyword("cacheModifier") is not None:
            parser.parse_punctuation("=")
            props["cache"] = CacheModifierAttr(CacheModifierAttr.parse_parameter(parser))
        elif parser.parse_optional_keyword("evictionPolicy") is not None:
            parser.parse_punctuation("=")
            props["evict"] = EvictionPolicyAttr(EvictionPolicyAttr.parse_parameter(parser))
        else:
            return props


def _print_cache_evict(printer: Printer, op: IRDLOperation) -> None:
    cache = op.properties.get("cache")
    if isinstance(cache, CacheModifierAttr) and cache.data != CacheModifier.NONE:
        printer.print_string(f" cacheModifier = {cache.data.value}")
    evict = op.properties.get("evict")
    if isinstance(evict, EvictionPolicyAttr) and evict.data != EvictionPolicy.NORMAL:
        printer.print_string(f" evictionPolicy = {evict.data.value}")


def _print_trailing_attrs(printer: Printer, op: IRDLOperation, printed: Sequence[str]) -> None:
    attrs = {k: v for k, v in (op.properties | op.attributes).items() if k not in printed}
    printer.print_op_attributes(attrs)


@irdl_op_definition
class LoadOp(IRDLOperation):
    """`tt.load %ptr[, %mask[, %other]] [cacheModifier = c] [evictionPolicy = e] {attrs} : type(ptr)`."""

    name = "tt.load"
    ptr = operand_def()
    mask = opt_operand_def()
    other = opt_operand_def()
    result = result_def()
    boundaryCheck = opt_prop_def(DenseArrayBase)
    padding = opt_prop_def(Attribute)
    cache = opt_prop_def(CacheModifierAttr)
    evict = opt_prop_def(EvictionPolicyAttr)
    isVolatile = opt_prop_def(BoolAttr)
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def verify_(self) -> None:
        pointee = pointee_of(self.ptr.type)
        if isinstance(pointee, TensorType):  # a block pointer
            expected: Attribute = pointee
        else:
            expected = with_element(self.ptr.type, pointee)
        if self.result.type != expected:
            raise VerifyException(f"tt.load: result type must be {expected}, got {self.result.type}")
        for v in (self.mask, self.other):
            if v is not None:
                check_same_shape(self, self.ptr.type, v.type)

    @classmethod
    def parse(cls, parser: Parser) -> LoadOp:
        operands = [parser.parse_unresolved_operand()]
        while parser.parse_optional_punctuation(",") is not None:
            operands.append(parser.parse_unresolved_operand())
        props = _parse_cache_evict(parser)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        ptr_type = parser.parse_type()
        pointee = pointee_of(ptr_type) if isinstance(element_type(ptr_type), PointerType) else \
            parser.raise_error(f"tt.load: expected a pointer type, got {ptr_type}")
        result_type = pointee if isinstance(pointee, TensorType) else with_element(ptr_type, pointee)
        types = [ptr_type, with_element(ptr_type, IntegerType(1)), result_type][: len(operands)]
        resolved = parser.resolve_operands(operands, types, parser.pos)
        for k in list(attrs):
            if k in cls.get_irdl_definition().properties:
                props[k] = attrs.pop(k)
        sizes = [1, int(len(resolved) > 1), int(len(resolved) > 2)]
        props["operandSegmentSizes"] = DenseArrayBase.from_list(IntegerType(32), sizes)
        op = cls.create(operands=resolved, result_types=[result_type], properties=props, attributes=attrs)
        return op

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_list(self.operands, printer.print_operand)
        _print_cache_evict(printer, self)
        _print_trailing_attrs(printer, self, ("cache", "evict", "operandSegmentSizes"))
        printer.print_string(" : ")
        printer.print_attribute(self.ptr.type)


@irdl_op_definition
class StoreOp(IRDLOperation):
    """`tt.store %ptr, %value[, %mask] [cacheModifier = c] [evictionPolicy = e] {attrs} : type(ptr)`."""

    name = "tt.store"
    ptr = operand_def()
    value = operand_def()
    mask = opt_operand_def()
    boundaryCheck = opt_prop_def(DenseArrayBase)
    cache = opt_prop_def(CacheModifierAttr)
    evict = opt_prop_def(EvictionPolicyAttr)

    def verify_(self) -> None:
        pointee = pointee_of(self.ptr.type)
        expected = pointee if isinstance(pointee, TensorType) else with_element(self.ptr.type, pointee)
        if self.value.type != expected:
            raise VerifyException(f"tt.store: value type must be {expected}, got {self.value.type}")

    @classmethod
    def parse(cls, parser: Parser) -> StoreOp:
        operands = [parser.parse_unresolved_operand()]
        while parser.parse_optional_punctuation(",") is not None:
            operands.append(parser.parse_unresolved_operand())
        if len(operands) not in (2, 3):
            parser.raise_error("tt.store: expected `%ptr, %value[, %mask]`")
        props = _parse_cache_evict(parser)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        ptr_type = parser.parse_type()
        if not isinstance(element_type(ptr_type), PointerType):
            parser.raise_error(f"tt.store: expected a pointer type, got {ptr_type}")
        pointee = pointee_of(ptr_type)
        value_type = pointee if isinstance(pointee, TensorType) else with_element(ptr_type, pointee)
        types = [ptr_type, value_type, with_element(ptr_type, IntegerType(1))][: len(operands)]
        resolved = parser.resolve_operands(operands, types, parser.pos)
        for k in list(attrs):
            if k in cls.get_irdl_definition().properties:
                props[k] = attrs.pop(k)
        return cls.create(operands=resolved, properties=props, attributes=attrs)

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_list(self.operands, printer.print_operand)
        _print_cache_evict(printer, self)
        _print_trailing_attrs(printer, self, ("cache", "evict"))
        printer.print_string(" : ")
        printer.print_attribute(self.ptr.type)


@irdl_op_definition
class MakeTensorDescOp(IRDLOperation):
    """`tt.make_tensor_descriptor %base, [%shape...], [%strides...] : <T>, <tensor<...>>` (types unqualified)."""

    name = "tt.make_tensor_descriptor"
    base = operand_def(PointerType)
    shape = var_operand_def(IntegerType(32))
    strides = var_operand_def(IntegerType(64))
    result = result_def(TensorDescType)
    padding = opt_prop_def(Attribute)
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def verify_(self) -> None:
        block = self.result.type.block_type if isinstance(self.result.type, TensorDescType) else None
        if block is None or len(self.shape) != len(block.get_shape()) or len(self.strides) != len(self.shape):
            raise VerifyException("tt.make_tensor_descriptor: shape, strides and block rank differ")

    @classmethod
    def parse(cls, parser: Parser) -> MakeTensorDescOp:
        base = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        shape = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parser.parse_unresolved_operand)
        parser.parse_punctuation(",")
        strides = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parser.parse_unresolved_operand)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        base_type = PointerType.new(PointerType.parse_parameters(parser))
        parser.parse_punctuation(",")
        desc_type = TensorDescType.new(TensorDescType.parse_parameters(parser))
        operands = parser.resolve_operands(
            [base, *shape, *strides],
            [base_type, *[IntegerType(32)] * len(shape), *[IntegerType(64)] * len(strides)], parser.pos)
        props = {k: attrs.pop(k) for k in list(attrs) if k == "padding"}
        props["operandSegmentSizes"] = DenseArrayBase.from_list(IntegerType(32), [1, len(shape), len(strides)])
        return cls.create(operands=operands, result_types=[desc_type], properties=props, attributes=attrs)

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.base)
        for group in (self.shape, self.strides):
            printer.print_string(", [")
            printer.print_list(group, printer.print_operand)
            printer.print_string("]")
        printer.print_op_attributes({k: v for k, v in (self.properties | self.attributes).items()
                                     if k != "operandSegmentSizes"})
        printer.print_string(" : ")
        assert isinstance(self.base.type, PointerType) and isinstance(self.result.type, TensorDescType)
        self.base.type.print_parameters(printer)
        printer.print_string(", ")
        self.result.type.print_parameters(printer)


@irdl_op_definition
class DescriptorLoadOp(IRDLOperation):
    name = "tt.descriptor_load"
    desc = operand_def(TensorDescType)
    indices = var_operand_def(IntegerType(32))
    result = result_def(TensorType)
    cache = opt_prop_def(CacheModifierAttr)
    evict = opt_prop_def(EvictionPolicyAttr)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$desc `[` $indices `]` attr-dict `:` type($desc) `->` type($result)"


@irdl_op_definition
class DescriptorStoreOp(IRDLOperation):
    name = "tt.descriptor_store"
    desc = operand_def(TensorDescType)
    indices = var_operand_def(IntegerType(32))
    src = operand_def(TensorType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$desc `[` $indices `]` `,` $src attr-dict `:` type($desc) `,` type($src)"


@irdl_op_definition
class AtomicRMWOp(IRDLOperation):
    name = "tt.atomic_rmw"
    atomic_rmw_op = prop_def(RMWOpAttr)
    sem = prop_def(MemSemanticAttr)
    scope = prop_def(MemSyncScopeAttr)
    ptr = operand_def()
    val = operand_def()
    mask = opt_operand_def()
    result = result_def()
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = ("$atomic_rmw_op `,` $sem `,` $scope `,` $ptr `,` $val (`,` $mask^)? attr-dict `:` "
                       "functional-type(operands, $result)")

    def verify_(self) -> None:
        if with_element(self.ptr.type, pointee_of(self.ptr.type)) != self.val.type:
            raise VerifyException("tt.atomic_rmw: value type must match the pointee type")


@irdl_op_definition
class AtomicCASOp(IRDLOperation):
    name = "tt.atomic_cas"
    sem = prop_def(MemSemanticAttr)
    scope = prop_def(MemSyncScopeAttr)
    ptr = operand_def()
    cmp = operand_def()
    val = operand_def()
    result = result_def()
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$sem `,` $scope `,` $ptr `,` $cmp `,` $val attr-dict `:` functional-type(operands, $result)"


# ---------------------------------------------------------------------------------------------------
# Compute
# ---------------------------------------------------------------------------------------------------
@irdl_op_definition
class DotOp(IRDLOperation):
    name = "tt.dot"
    a = operand_def(TensorType)
    b = operand_def(TensorType)
    T: ClassVar = VarConstraint("T", BaseAttr(TensorType))
    c = operand_def(T)
    d = result_def(T)
    inputPrecision = opt_prop_def(InputPrecisionAttr)
    maxNumImpreciseAcc = opt_prop_def(IntegerAttr[I32])
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = ("$a `,` $b `,` $c (`,` `inputPrecision` `=` $inputPrecision^)? attr-dict `:` "
                       "type($a) `*` type($b) `->` type($d)")

    def verify_(self) -> None:
        a, b, c, d = (shape_of(v.type) or () for v in (self.a, self.b, self.c, self.d))
        if len(a) < 2 or len(a) != len(b) or a[-1] != b[-2] or c != d or d[-2:] != (a[-2], b[-1]):
            raise VerifyException(f"tt.dot: shapes {list(a)} x {list(b)} -> {list(d)} (acc {list(c)}) do not agree")
        if self.c.type != self.d.type:
            raise VerifyException("tt.dot: accumulator and result types differ")


class _CombineRegionOp(IRDLOperation):
    """`tt.reduce` / `tt.scan`: Triton prints them in generic form, with the combiner as a region."""

    srcs = var_operand_def(TensorType)
    results_ = var_result_def()
    combine_op = region_def("single_block")
    axis = prop_def(IntegerAttr[I32])

    def verify_(self) -> None:
        axis = self.axis.value.data
        for v in self.srcs:
            shape = shape_of(v.type) or ()
            if not 0 <= axis < len(shape):
                raise VerifyException(f"{self.name}: axis {axis} out of range for {v.type}")
        block = self.combine_op.blocks.first
        if block is None or len(block.args) != 2 * len(self.srcs):
            raise VerifyException(f"{self.name}: the combiner takes two arguments per operand")


@irdl_op_definition
class ReduceOp(_CombineRegionOp):
    name = "tt.reduce"


@irdl_op_definition
class ReduceReturnOp(IRDLOperation):
    name = "tt.reduce.return"
    result_ = var_operand_def()
    traits = traits_def(IsTerminator(), HasParent(ReduceOp), Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$result_ attr-dict `:` type($result_)"


@irdl_op_definition
class ScanOp(_CombineRegionOp):
    name = "tt.scan"
    reverse = prop_def(BoolAttr)


@irdl_op_definition
class ScanReturnOp(IRDLOperation):
    name = "tt.scan.return"
    result_ = var_operand_def()
    traits = traits_def(IsTerminator(), HasParent(ScanOp), Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$result_ attr-dict `:` type($result_)"


@irdl_op_definition
class HistogramOp(IRDLOperation):
    name = "tt.histogram"
    src = operand_def()
    result = result_def()
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$src attr-dict `:` type($src) `->` type($result)"


@irdl_op_definition
class ExternElementwiseOp(IRDLOperation):
    name = "tt.extern_elementwise"
    srcs = var_operand_def()
    result = result_def()
    libname = prop_def(StringAttr)
    libpath = prop_def(StringAttr)
    symbol = prop_def(StringAttr)
    pure = prop_def(BoolAttr)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "operands attr-dict `:` functional-type(operands, $result)"


@irdl_op_definition
class ElementwiseInlineAsmOp(IRDLOperation):
    name = "tt.elementwise_inline_asm"
    asm_string = prop_def(StringAttr)
    constraints = prop_def(StringAttr)
    pure = prop_def(BoolAttr)
    packed_element = prop_def(IntegerAttr[I32])
    args = var_operand_def()
    results_ = var_result_def()
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$asm_string attr-dict ($args^ `:` type($args))? `->` type($results_)"


@irdl_op_definition
class AssertOp(IRDLOperation):
    name = "tt.assert"
    condition = operand_def()
    message = prop_def(StringAttr)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$condition `,` $message attr-dict `:` type($condition)"


@irdl_op_definition
class PrintOp(IRDLOperation):
    name = "tt.print"
    prefix = prop_def(StringAttr)
    hex = prop_def(BoolAttr)
    args = var_operand_def()
    isSigned = prop_def(DenseArrayBase)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$prefix attr-dict (`:` $args^ `:` type($args))?"


TT = Dialect(
    "tt",
    [
        FuncOp, ReturnOp, CallOp, SplatOp, BroadcastOp, ExpandDimsOp, ReshapeOp, TransOp, BitcastOp, IntToPtrOp,
        PtrToIntOp, FpToFpOp, CatOp, JoinOp, SplitOp, MakeRangeOp, GetProgramIdOp, GetNumProgramsOp, AddPtrOp,
        AdvanceOp, MulhiUIOp, PreciseSqrtOp, PreciseDivFOp, ClampFOp, LoadOp, StoreOp,
        AtomicRMWOp, AtomicCASOp, MakeTensorDescOp, DescriptorLoadOp, DescriptorStoreOp, DotOp, ReduceOp, ReduceReturnOp, ScanOp, ScanReturnOp,
        HistogramOp, ExternElementwiseOp, ElementwiseInlineAsmOp, AssertOp, PrintOp,
    ],
    [
        PointerType, TensorDescType, ProgramIDDimAttr, RMWOpAttr, MemSemanticAttr, MemSyncScopeAttr, CacheModifierAttr,
        EvictionPolicyAttr, InputPrecisionAttr, RoundingModeAttr, PaddingOptionAttr,
    ],
)
