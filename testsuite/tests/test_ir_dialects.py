"""The Triton dialects on small modules: exact printing, verifiers, and errors a user can act on."""

from __future__ import annotations

import pytest
from xdsl.dialects.builtin import Float16Type, Float32Type

from kstrata.ir.dialects import defined_op_names
from kstrata.ir.dialects.tt import DotOp, LoadOp, PointerType
from kstrata.ir.dialects.ttg import BlockedEncodingAttr, MemDescType, SliceEncodingAttr
from kstrata.ir.triton_ir import IRParseError, format_float, parse_triton, print_triton

TTGIR = """\
#blocked = #ttg.blocked<{sizePerThread = [4], threadsPerWarp = [32], warpsPerCTA = [4], order = [0]}>
#shared = #ttg.swizzled_shared<{vec = 8, perPhase = 2, maxPhase = 4, order = [1, 0]}>
#smem = #ttg.shared_memory
#loc = loc("k.py":3:0)
module attributes {"ttg.num-ctas" = 1 : i32, "ttg.num-warps" = 4 : i32, ttg.target = "cuda:90", "ttg.threads-per-warp" = 32 : i32} {
  tt.func public @k(%x_ptr: !tt.ptr<f32> {tt.divisibility = 16 : i32} loc("x_ptr"(#loc)), %n: i32 loc("n"(#loc))) attributes {noinline = false} {
    %cst = arith.constant dense<0xFF800000> : tensor<512xf32, #blocked> loc(#loc1)
    %c = arith.constant dense<4.6566126E-10> : tensor<512xf32, #blocked> loc(#loc1)
    %0 = tt.get_program_id x : i32 loc(#loc2)
    %offs = tt.make_range {end = 512 : i32, start = 0 : i32} : tensor<512xi32, #blocked> loc(#loc2)
    %m = tt.splat %n : i32 -> tensor<512xi32, #blocked> loc(#loc2)
    %mask = arith.cmpi slt, %offs, %m : tensor<512xi32, #blocked> loc(#loc2)
    %p = tt.splat %x_ptr : !tt.ptr<f32> -> tensor<512x!tt.ptr<f32>, #blocked> loc(#loc2)
    %p_0 = tt.addptr %p, %offs : tensor<512x!tt.ptr<f32>, #blocked>, tensor<512xi32, #blocked> loc(#loc2)
    %x = tt.load %p_0, %mask, %cst : tensor<512x!tt.ptr<f32>, #blocked> loc(#loc2)
    %y = arith.select %mask, %x, %c : tensor<512xi1, #blocked>, tensor<512xf32, #blocked> loc(#loc2)
    %s = "tt.reduce"(%y) <{axis = 0 : i32}> ({
    ^bb0(%a: f32 loc(unknown), %b: f32 loc(unknown)):
      %t = arith.addf %a, %b : f32 loc(#loc2)
      tt.reduce.return %t : f32 loc(#loc2)
    }) : (tensor<512xf32, #blocked>) -> f32 loc(#loc2)
    %buf = ttg.local_alloc : () -> !ttg.memdesc<2x512xf32, #shared, #smem, mutable> loc(#loc2)
    ttg.local_dealloc %buf : !ttg.memdesc<2x512xf32, #shared, #smem, mutable> loc(#loc2)
    tt.store %p_0, %y, %mask : tensor<512x!tt.ptr<f32>, #blocked> loc(#loc2)
    tt.return loc(#loc2)
  } loc(#loc)
} loc(#loc)
#loc1 = loc(unknown)
#loc2 = loc("k.py":5:12)
"""


def test_small_module_prints_back_exactly() -> None:
    module = parse_triton(TTGIR, "k.ttgir")
    assert print_triton(module) == TTGIR
    assert module.level == "ttgir"


def test_typed_ops_types_and_encodings() -> None:
    module = parse_triton(TTGIR)
    ops = {op.name: op for op in module.ops()}
    load = ops["tt.load"]
    assert isinstance(load, LoadOp) and load.mask is not None and load.other is not None
    ptr_type = load.ptr.type
    assert isinstance(ptr_type.element_type, PointerType)  # type: ignore[attr-defined]
    assert isinstance(ptr_type.encoding, BlockedEncodingAttr)  # type: ignore[attr-defined]
    assert isinstance(load.result.type.element_type, Float32Type)  # type: ignore[attr-defined]
    alloc_type = ops["ttg.local_alloc"].results[0].type
    assert isinstance(alloc_type, MemDescType) and alloc_type.get_shape() == (2, 512) and alloc_type.mutable.data == 1


def test_locations_can_be_dropped() -> None:
    text = print_triton(parse_triton(TTGIR), locations=False)
    assert "loc(" not in text and "#loc" not in text
    again = parse_triton(text)
    assert print_triton(again) == text


def test_encodings_print_in_triton_field_order() -> None:
    slice_text = "#ttg.slice<{dim = 1, parent = #ttg.blocked<{sizePerThread = [1, 1], threadsPerWarp = [32, 1], warpsPerCTA = [2, 2], order = [0, 1]}>}>"
    text = TTGIR.replace("tensor<512xi32, #blocked> loc(#loc2)\n    %m", "tensor<512xi32, #blocked> loc(#loc2)\n    %m")
    module = parse_triton(text)
    assert any(isinstance(getattr(r.type, "encoding", None), BlockedEncodingAttr) for op in module.ops() for r in op.results)
    from xdsl.parser import Parser

    from kstrata.ir.dialects import triton_context

    attr = Parser(triton_context(), slice_text).parse_attribute()
    assert isinstance(attr, SliceEncodingAttr)
    assert str(attr) == slice_text


@pytest.mark.parametrize(("value", "bits", "expected"), [
    (0.0, 32, "0.000000e+00"), (1.0, 32, "1.000000e+00"), (float("-inf"), 32, "0xFF800000"),
    (float("-inf"), 16, "0xFC00"), (4.6566126e-10, 32, "4.6566126E-10"), (0.0883883461, 32, "0.0883883461"),
    (1.44269502, 32, "1.44269502"), (1e-5, 32, "9.99999974E-6"), (0.1, 32, "1.000000e-01"),
    (0.044715, 32, "4.471500e-02"), (1234567.0, 32, "0x4996B438"),
])
def test_floats_print_as_mlir_does(value: float, bits: int, expected: str) -> None:
    import struct

    if bits == 32:
        value = struct.unpack("<f", struct.pack("<f", value))[0]
    assert format_float(value, Float32Type() if bits == 32 else Float16Type()) == expected


def test_dot_verifier_rejects_mismatched_shapes() -> None:
    bad = """module {
  tt.func @f(%a: tensor<16x32xf16>, %b: tensor<16x16xf16>, %c: tensor<16x16xf32>) {
    %d = tt.dot %a, %b, %c : tensor<16x32xf16> * tensor<16x16xf16> -> tensor<16x16xf32>
    tt.return
  }
}
"""
    with pytest.raises(IRParseError) as info:
        parse_triton(bad, "bad.ttir")
    err = info.value
    assert err.op == "tt.dot" and (err.line, err.column) == (3, 5)
    assert str(err).startswith("bad.ttir:3:5: `tt.dot` does not verify")
    assert DotOp.name in defined_op_names()


def test_unknown_op_names_file_line_column() -> None:
    with pytest.raises(IRParseError) as info:
        parse_triton("module {\n  tt.func @f() {\n    %0 = tt.frobnicate : i32\n    tt.return\n  }\n}\n", "x.ttir")
    assert str(info.value).startswith("x.ttir:3:10: ") and "tt.frobnicate" in str(info.value)


def test_malformed_input_says_what_was_expected() -> None:
    with pytest.raises(IRParseError) as info:
        parse_triton("module {\n  tt.func @f(%a: i32) {\n    %0 = tt.splat %a : i32 tensor<4xi32>\n    tt.return\n  }\n}\n",
                     "y.ttir")
    message = str(info.value)
    assert message.startswith("y.ttir:3:") and "tt.splat" in message and "->" in message


def test_splat_verifier_checks_element_type() -> None:
    with pytest.raises(IRParseError, match=r"tt\.splat: result must be a tensor of i32"):
        parse_triton("module {\n  tt.func @f(%a: i32) {\n    %0 = tt.splat %a : i32 -> tensor<4xf32>\n    tt.return\n  }\n}\n")


def test_unknown_encoding_field_is_an_error() -> None:
    text = TTGIR.replace("sizePerThread = [4]", "sizePerThreed = [4]")
    with pytest.raises(IRParseError, match="expected one of the fields sizePerThread"):
        parse_triton(text, "z.ttgir")


def test_a_rewritten_module_prints_text_triton_accepts() -> None:
    from xdsl.dialects import arith
    from xdsl.rewriter import Rewriter

    from kstrata.ir.ir_roundtrip import triton_parse_error
    from kstrata.ir.target import Target

    module = parse_triton(TTGIR, "k.ttgir")
    add = next(op for op in module.ops() if op.name == "arith.addf")
    assert isinstance(add, arith.AddfOp)
    mul = arith.MulfOp(add.lhs, add.rhs)
    Rewriter.replace_op(add, mul)
    text = print_triton(module)
    assert "arith.mulf %a, %b : f32 loc(#loc1)" in text and "arith.addf" not in text  # #loc1 is loc(unknown)
    assert "%1 = arith.mulf" in text and "tt.reduce.return %1 : f32" in text  # fresh: %0 is the program id
    assert triton_parse_error(text, "ttgir", Target.parse("cuda:90")) is None
