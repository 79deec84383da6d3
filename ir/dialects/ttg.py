"""The `ttg` dialect (TritonGPU, TTGIR): layout encodings, shared-memory descriptors and their ops.

Encodings are `StructAttr`s declared field by field in the order Triton prints them
(`TritonGPUAttrDefs.td`); `!ttg.memdesc<shape x T, #encoding, #memory space[, mutable][, alloc shape]>`
and `!ttg.async.token` are types. Ops follow `TritonGPUOps.td`.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    I32,
    ArrayAttr,
    IntAttr,
    IntegerAttr,
    IntegerType,
    NoneAttr,
    TensorType,
)
from xdsl.ir import Attribute, Dialect, ParametrizedAttribute, TypeAttribute
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from ._struct import Field, StructAttr, int_list
from .tt import (
    CacheModifierAttr,
    EvictionPolicyAttr,
    PointerType,
    check_same_shape,
    element_type,
    pointee_of,
    shape_of,
    with_element,
)

_CTA = (Field("CTAsPerCGA", "ints", True), Field("CTASplitNum", "ints", True), Field("CTAOrder", "ints", True))


# ---------------------------------------------------------------------------------------------------
# Distributed (register) encodings
# ---------------------------------------------------------------------------------------------------
@irdl_attr_definition
class BlockedEncodingAttr(StructAttr):
    name = "ttg.blocked"
    FIELDS = (Field("sizePerThread", "ints"), Field("threadsPerWarp", "ints"), Field("warpsPerCTA", "ints"),
              Field("order", "ints"), *_CTA)
    sizePerThread: Attribute
    threadsPerWarp: Attribute
    warpsPerCTA: Attribute
    order: Attribute
    CTAsPerCGA: Attribute
    CTASplitNum: Attribute
    CTAOrder: Attribute

    def verify(self) -> None:
        super().verify()
        ranks = {len(int_list(self.sizePerThread)), len(int_list(self.threadsPerWarp)),
                 len(int_list(self.warpsPerCTA)), len(int_list(self.order))}
        if len(ranks) != 1:
            raise VerifyException("#ttg.blocked: sizePerThread, threadsPerWarp, warpsPerCTA and order differ in rank")
        if sorted(int_list(self.order)) != list(range(len(int_list(self.order)))):
            raise VerifyException("#ttg.blocked: order must be a permutation of the dimensions")


@irdl_attr_definition
class SliceEncodingAttr(StructAttr):
    name = "ttg.slice"
    FIELDS = (Field("dim", "int"), Field("parent", "attr"))
    dim: Attribute
    parent: Attribute


@irdl_attr_definition
class DotOperandEncodingAttr(StructAttr):
    name = "ttg.dot_op"
    FIELDS = (Field("opIdx", "int"), Field("parent", "attr"), Field("kWidth", "int", True))
    opIdx: Attribute
    parent: Attribute
    kWidth: Attribute

    def verify(self) -> None:
        super().verify()
        if isinstance(self.opIdx, IntAttr) and self.opIdx.data not in (0, 1):
            raise VerifyException("#ttg.dot_op: opIdx must be 0 or 1")


@irdl_attr_definition
class NvidiaMmaEncodingAttr(StructAttr):
    name = "ttg.nvidia_mma"
    FIELDS = (Field("versionMajor", "int"), Field("versionMinor", "int"), Field("warpsPerCTA", "ints"), *_CTA,
              Field("instrShape", "ints"))
    versionMajor: Attribute
    versionMinor: Attribute
    warpsPerCTA: Attribute
    CTAsPerCGA: Attribute
    CTASplitNum: Attribute
    CTAOrder: Attribute
    instrShape: Attribute


@irdl_attr_definition
class AMDMfmaEncodingAttr(StructAttr):
    name = "ttg.amd_mfma"
    FIELDS = (Field("version", "int"), Field("warpsPerCTA", "ints"), Field("instrShape", "ints"),
              Field("isTransposed", "bool"), *_CTA, Field("tilesPerWarp", "ints", True),
              Field("elementBitWidth", "int", True))
    version: Attribute
    warpsPerCTA: Attribute
    instrShape: Attribute
    isTransposed: Attribute
    CTAsPerCGA: Attribute
    CTASplitNum: Attribute
    CTAOrder: Attribute
    tilesPerWarp: Attribute
    elementBitWidth: Attribute


@irdl_attr_definition
class AMDWmmaEncodingAttr(StructAttr):
    name = "ttg.amd_wmma"
    FIELDS = (Field("version", "int"), Field("isTranspose", "bool"), Field("warpsPerCTA", "ints"), *_CTA,
              Field("instrShape", "ints", True))
    version: Attribute
    isTranspose: Attribute
    warpsPerCTA: Attribute
    CTAsPerCGA: Attribute
    CTASplitNum: Attribute
    CTAOrder: Attribute
    instrShape: Attribute


@irdl_attr_definition
class LinearEncodingAttr(StructAttr):
    name = "ttg.linear"
    FIELDS = (Field("register", "intss"), Field("lane", "intss"), Field("warp", "intss"), Field("block", "intss"))
    register: Attribute
    lane: Attribute
    warp: Attribute
    block: Attribute


# ---------------------------------------------------------------------------------------------------
# Shared-memory encodings and memory spaces
# ---------------------------------------------------------------------------------------------------
@irdl_attr_definition
class NVMMASharedEncodingAttr(StructAttr):
    name = "ttg.nvmma_shared"
    FIELDS = (Field("swizzlingByteWidth", "int"), Field("transposed", "bool"), Field("elementBitWidth", "int"),
              Field("fp4Padded", "bool", True), *_CTA)
    swizzlingByteWidth: Attribute
    transposed: Attribute
    elementBitWidth: Attribute
    fp4Padded: Attribute
    CTAsPerCGA: Attribute
    CTASplitNum: Attribute
    CTAOrder: Attribute


@irdl_attr_definition
class SwizzledSharedEncodingAttr(StructAttr):
    name = "ttg.swizzled_shared"
    FIELDS = (Field("vec", "int"), Field("perPhase", "int"), Field("maxPhase", "int"), Field("order", "ints"), *_CTA)
    vec: Attribute
    perPhase: Attribute
    maxPhase: Attribute
    order: Attribute
    CTAsPerCGA: Attribute
    CTASplitNum: Attribute
    CTAOrder: Attribute


@irdl_attr_definition
class AMDRotatingSharedEncodingAttr(StructAttr):
    name = "ttg.amd_rotating_shared"
    FIELDS = (Field("vec", "int"), Field("perPhase", "int"), Field("maxPhase", "int"), Field("order", "ints"), *_CTA)
    vec: Attribute
    perPhase: Attribute
    maxPhase: Attribute
    order: Attribute
    CTAsPerCGA: Attribute
    CTASplitNum: Attribute
    CTAOrder: Attribute


@irdl_attr_definition
class SharedMemorySpaceAttr(ParametrizedAttribute):
    """`#ttg.shared_memory`: the memory space of shared-memory descriptors."""

    name = "ttg.shared_memory"


# ---------------------------------------------------------------------------------------------------
# Types
# ---------------------------------------------------------------------------------------------------
@irdl_attr_definition
class MemDescType(ParametrizedAttribute, TypeAttribute):
    """`!ttg.memdesc<64x32xf16, #shared, #smem[, mutable][, 3x64x32]>`: a view of (shared) memory."""

    name = "ttg.memdesc"

    shape: ArrayAttr[IntAttr]
    element_type: Attribute
    encoding: Attribute
    memory_space: Attribute
    mutable: IntAttr
    alloc_shape: Attribute  # ArrayAttr[IntAttr], or NoneAttr when it equals `shape`

    def get_shape(self) -> tuple[int, ...]:
        return tuple(d.data for d in self.shape.data)

    @classmethod
    def parse_body(cls, parser: AttrParser) -> Sequence[Attribute]:
        """The part inside `<...>`; `ttg.async_copy_global_to_local` prints it without `!ttg.memdesc`."""
        with parser.in_angle_brackets():
            dims, elt = parser.parse_ranked_shape()
            parser.parse_punctuation(",")
            encoding = parser.parse_attribute()
            parser.parse_punctuation(",")
            space = parser.parse_attribute()
            mutable = 0
            alloc: Attribute = NoneAttr()
            while parser.parse_optional_punctuation(",") is not None:
                if parser.parse_optional_keyword("mutable") is not None:
                    mutable = 1
                else:
                    alloc = ArrayAttr(IntAttr(d) for d in parser.parse_dimension_list())
        return (ArrayAttr(IntAttr(d) for d in dims), elt, encoding, space, IntAttr(mutable), alloc)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        return cls.parse_body(parser)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("<")
        for d in self.get_shape():
            printer.print_string(f"{d}x")
        printer.print_attribute(self.element_type)
        printer.print_string(", ")
        printer.print_attribute(self.encoding)
        printer.print_string(", ")
        printer.print_attribute(self.memory_space)
        if self.mutable.data:
            printer.print_string(", mutable")
        if isinstance(self.alloc_shape, ArrayAttr):
            printer.print_string(", " + "x".join(str(v) for v in int_list(self.alloc_shape)))
        printer.print_string(">")


@irdl_attr_definition
class AsyncTokenType(ParametrizedAttribute, TypeAttribute):
    """`!ttg.async.token`: orders asynchronous copies and their waits."""

    name = "ttg.async.token"


def _memdesc(t: Attribute, what: str) -> MemDescType:
    if not isinstance(t, MemDescType):
        raise VerifyException(f"{what} must be a !ttg.memdesc, got {t}")
    return t


# ---------------------------------------------------------------------------------------------------
# Ops
# ---------------------------------------------------------------------------------------------------
@irdl_op_definition
class ConvertLayoutOp(IRDLOperation):
    name = "ttg.convert_layout"
    src = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$src attr-dict `:` type($src) `->` type($result)"

    def verify_(self) -> None:
        if shape_of(self.src.type) != shape_of(self.result.type) or \
                element_type(self.src.type) != element_type(self.result.type):
            raise VerifyException("ttg.convert_layout: source and result differ in shape or element type")


@irdl_op_definition
class LocalAllocOp(IRDLOperation):
    name = "ttg.local_alloc"
    src = opt_operand_def(TensorType)
    result = result_def(MemDescType)
    alignment = opt_prop_def(IntegerAttr[I32])
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "($src^)? attr-dict `:` functional-type(operands, results)"

    def verify_(self) -> None:
        res = _memdesc(self.result.type, "ttg.local_alloc result")
        if self.src is not None and (shape_of(self.src.type) != res.get_shape()
                                     or element_type(self.src.type) != res.element_type):
            raise VerifyException("ttg.local_alloc: source and descriptor differ in shape or element type")


@irdl_op_definition
class LocalLoadOp(IRDLOperation):
    name = "ttg.local_load"
    src = operand_def(MemDescType)
    token = opt_operand_def(AsyncTokenType)
    result = result_def(TensorType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$src (`token` $token^)? attr-dict `:` type($src) `->` type($result)"

    def verify_(self) -> None:
        src = _memdesc(self.src.type, "ttg.local_load source")
        if src.element_type != element_type(self.result.type) or src.get_shape()[-len(shape_of(self.result.type) or ()):] \
                != shape_of(self.result.type):
            raise VerifyException("ttg.local_load: descriptor and result differ in shape or element type")


@irdl_op_definition
class LocalStoreOp(IRDLOperation):
    name = "ttg.local_store"
    src = operand_def(TensorType)
    dst = operand_def(MemDescType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$src `,` $dst attr-dict `:` type($src) `->` type($dst)"

    def verify_(self) -> None:
        dst = _memdesc(self.dst.type, "ttg.local_store destination")
        if not dst.mutable.data:
            raise VerifyException("ttg.local_store: the destination descriptor is not mutable")


@irdl_op_definition
class LocalDeallocOp(IRDLOperation):
    name = "ttg.local_dealloc"
    src = operand_def(MemDescType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$src attr-dict `:` type($src)"


@irdl_op_definition
class MemDescIndexOp(IRDLOperation):
    name = "ttg.memdesc_index"
    src = operand_def(MemDescType)
    index = operand_def(IntegerType(32))
    result = result_def(MemDescType)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$src `[` $index `]` attr-dict `:` type($src) `->` type($result)"

    def verify_(self) -> None:
        src = _memdesc(self.src.type, "ttg.memdesc_index source")
        res = _memdesc(self.result.type, "ttg.memdesc_index result")
        if src.get_shape()[1:] != res.get_shape() or src.element_type != res.element_type:
            raise VerifyException("ttg.memdesc_index: the result must drop the leading dimension of the source")


@irdl_op_definition
class MemDescTransOp(IRDLOperation):
    name = "ttg.memdesc_trans"
    src = operand_def(MemDescType)
    result = result_def(MemDescType)
    order = prop_def(Attribute)
    traits = traits_def(Pure())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$src attr-dict `:` type($src) `->` type($result)"


@irdl_op_definition
class AsyncCopyGlobalToLocalOp(IRDLOperation):
    """`ttg.async_copy_global_to_local %src, %dst [mask %m] [other %o] ... : type(src) -> <memdesc body>`."""

    name = "ttg.async_copy_global_to_local"
    src = operand_def()
    dst = operand_def(MemDescType)
    mask = opt_operand_def()
    other = opt_operand_def()
    token = result_def(AsyncTokenType)
    cache = opt_prop_def(CacheModifierAttr)
    evict = opt_prop_def(EvictionPolicyAttr)
    isVolatile = opt_prop_def(Attribute)
    contiguity = opt_prop_def(IntegerAttr[I32])
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def verify_(self) -> None:
        dst = _memdesc(self.dst.type, "ttg.async_copy_global_to_local destination")
        if pointee_of(self.src.type) != dst.element_type or shape_of(self.src.type) != dst.get_shape():
            raise VerifyException("ttg.async_copy_global_to_local: source pointers and destination disagree")

    @classmethod
    def parse(cls, parser: Parser) -> AsyncCopyGlobalToLocalOp:
        src = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        dst = parser.parse_unresolved_operand()
        mask = parser.parse_unresolved_operand() if parser.parse_optional_keyword("mask") is not None else None
        other = parser.parse_unresolved_operand() if parser.parse_optional_keyword("other") is not None else None
        props: dict[str, Attribute] = {}
        while True:
            if parser.parse_optional_keyword("cacheModifier") is not None:
                parser.parse_punctuation("=")
                props["cache"] = CacheModifierAttr(CacheModifierAttr.parse_parameter(parser))
            elif parser.parse_optional_keyword("evictionPolicy") is not None:
                parser.parse_punctuation("=")
                props["evict"] = EvictionPolicyAttr(EvictionPolicyAttr.parse_parameter(parser))
            else:
                break
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        src_type = parser.parse_type()
        parser.parse_punctuation("->")
        dst_type = MemDescType.new(MemDescType.parse_body(parser))
        if not isinstance(element_type(src_type), PointerType):
            parser.raise_error(f"ttg.async_copy_global_to_local: expected a tensor of pointers, got {src_type}")
        names = [src, dst] + [v for v in (mask, other) if v is not None]
        types: list[Attribute] = [src_type, dst_type]
        if mask is not None:
            types.append(with_element(src_type, IntegerType(1)))
        if other is not None:
            types.append(with_element(src_type, pointee_of(src_type)))
        resolved = parser.resolve_operands(names, types, parser.pos)
        for k in list(attrs):
            if k in cls.get_irdl_definition().properties:
                props[k] = attrs.pop(k)
        props["operandSegmentSizes"] = _segments([1, 1, int(mask is not None), int(other is not None)])
        return cls.create(operands=resolved, result_types=[AsyncTokenType()], properties=props, attributes=attrs)

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.src)
        printer.print_string(", ")
        printer.print_operand(self.dst)
        if self.mask is not None:
            printer.print_string(" mask ")
            printer.print_operand(self.mask)
        if self.other is not None:
            printer.print_string(" other ")
            printer.print_operand(self.other)
        for key, word in (("cache", "cacheModifier"), ("evict", "evictionPolicy")):
            val = self.properties.get(key)
            if isinstance(val, CacheModifierAttr | EvictionPolicyAttr) and val.data.value not in ("none", "evict_normal"):
                printer.print_string(f" {word} = {val.data.value}")
        rest = {k: v for k, v in (self.properties | self.attributes).items()
                if k not in ("cache", "evict", "operandSegmentSizes")}
        printer.print_op_attributes(rest)
        printer.print_string(" : ")
        printer.print_attribute(self.src.type)
        printer.print_string(" -> ")
        _memdesc(self.dst.type, "destination").print_parameters(printer)


def _segments(sizes: list[int]) -> Attribute:
    from xdsl.dialects.builtin import DenseArrayBase

    return DenseArrayBase.from_list(IntegerType(32), sizes)


@irdl_op_definition
class AsyncCommitGroupOp(IRDLOperation):
    name = "ttg.async_commit_group"
    inputTokens = var_operand_def(AsyncTokenType)
    asyncToken = result_def(AsyncTokenType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "(`tokens` $inputTokens^)? attr-dict"


@irdl_op_definition
class AsyncWaitOp(IRDLOperation):
    name = "ttg.async_wait"
    asyncToken = var_operand_def(AsyncTokenType)
    num = prop_def(IntegerAttr[I32])
    retToken = result_def(AsyncTokenType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "($asyncToken^)? attr-dict"


@irdl_op_definition
class GlobalScratchAllocOp(IRDLOperation):
    """`ttg.global_scratch_alloc {nbytes, alignment} : !tt.ptr<i8>`: per-program global scratch (e.g. TMA descriptors)."""

    name = "ttg.global_scratch_alloc"
    nbytes = prop_def(IntegerAttr[I32])
    alignment = prop_def(IntegerAttr[I32])
    result = result_def(PointerType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "attr-dict `:` type($result)"


TTG = Dialect(
    "ttg",
    [
        ConvertLayoutOp, LocalAllocOp, LocalLoadOp, LocalStoreOp, LocalDeallocOp, MemDescIndexOp, MemDescTransOp,
        AsyncCopyGlobalToLocalOp, AsyncCommitGroupOp, AsyncWaitOp, GlobalScratchAllocOp,
    ],
    [
        BlockedEncodingAttr, SliceEncodingAttr, DotOperandEncodingAttr, NvidiaMmaEncodingAttr, AMDMfmaEncodingAttr,
        AMDWmmaEncodingAttr, LinearEncodingAttr, NVMMASharedEncodingAttr, SwizzledSharedEncodingAttr,
        AMDRotatingSharedEncodingAttr, SharedMemorySpaceAttr, MemDescType, AsyncTokenType,
    ],
)

__all__ = ["TTG", "check_same_shape"]
