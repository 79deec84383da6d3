"""TTIR passes, written on the typed xDSL dialects (`kstrata.ir.dialects`): parse, rewrite ops, print.

Printing an unchanged module gives Triton's text back byte for byte (`kstrata ir roundtrip`), so the
only differences in the output are the ones a pass makes.
"""

from __future__ import annotations

from dataclasses import dataclass

from kstrata.ir.dialects.tt import (
    DotOp,
    EvictionPolicy,
    EvictionPolicyAttr,
    InputPrecision,
    InputPrecisionAttr,
    LoadOp,
)
from kstrata.ir.tolerance import Tolerance
from kstrata.ir.triton_ir import TritonModule, parse_triton, print_triton

from .base import KernelPass, PassContext, PassResult

#: What Triton 3.6 accepts for `tt.dot` on fp32 operands, per backend.
_PRECISIONS = {"cuda": ("tf32", "tf32x3", "ieee", "bf16x3", "bf16x6"), "hip": ("ieee", "tf32", "bf16x3", "bf16x6")}


def _module(ctx: PassContext) -> TritonModule:
    return parse_triton(ctx.text, ctx.bundle.origin)


def _element_type(value_type: object) -> str:
    element = getattr(value_type, "element_type", None)
    return str(element) if element is not None else ""


def _fp32_dots(module: TritonModule) -> list[DotOp]:
    return [op for op in module.ops() if isinstance(op, DotOp) and _element_type(op.a.type) == "f32"
            and _element_type(op.b.type) == "f32"]


def _precision(op: DotOp) -> str:
    attr = op.properties.get("inputPrecision")
    if attr is None:
        return "ieee"  # MLIR omits the default, IEEE
    assert isinstance(attr, InputPrecisionAttr)
    return str(attr.data)


@dataclass(frozen=True)
class DotPrecision(KernelPass):
    """Set the input precision of fp32 `tt.dot`s (`tf32`, `tf32x3`, `ieee`, `bf16x3`, `bf16x6`).

    `tf32x3` recovers close to fp32 accuracy from three TF32 tensor-core products (measured on the
    H200 for a 4096^3 GEMM: error 1.9e-7 against float64, better than cuBLAS fp32's 8.4e-7) at a
    fraction of the cost of `ieee` (FMA pipes); `tf32` is fastest and least accurate. Sound only up to
    its declared tolerance: the products round differently, so results are not bit-exact, and which way
    accuracy moves depends on the precision asked for. AMD (Triton 3.6) has no `tf32x3`.
    """

    name = "dot-precision"
    level = "ttir"
    tolerance = Tolerance(rtol=1e-2, atol=1e-1, why="dot products rounded at another input precision")
    precision: str = "tf32x3"

    def declared_tolerance(self) -> Tolerance:
        # A TF32 operand keeps 10 mantissa bits, so a dot's error is at most 2^-10 * sum|a_k*b_k|
        # (about 0.06 for unit-normal inputs and K = 100 in the worst case, sqrt(K) smaller typically);
        # the 3-pass splits keep about 2^-20 of it. Going back to ieee from tf32 moves results by
        # the TF32 error, so that direction declares the loose bound too. Larger K or larger inputs
        # need a looser tolerance than this declaration: verify then rejects, as it should.
        if self.precision in ("tf32x3", "bf16x3", "bf16x6"):
            return Tolerance(rtol=1e-4, atol=1e-4, why=f"dot products at {self.precision} instead of their precision")
        return Tolerance(rtol=1e-2, atol=1e-1, why=f"dot products at {self.precision} instead of their precision")

    def precondition(self, ctx: PassContext) -> str | None:
        allowed = _PRECISIONS[ctx.bundle.target.backend]
        if self.precision not in allowed:
            return f"{ctx.bundle.target} does not support input precision {self.precision} (allowed: {', '.join(allowed)})"
        dots = _fp32_dots(_module(ctx))
        if not dots:
            return "the kernel has no tt.dot on fp32 operands"
        if all(_precision(op) == self.precision for op in dots):
            return f"every fp32 tt.dot already uses {self.precision}"
        return None

    def apply(self, ctx: PassContext) -> PassResult:
        module = _module(ctx)
        changed = 0
        for op in _fp32_dots(module):
            if _precision(op) == self.precision:
                continue
            if self.precision == "ieee":
                op.properties.pop("inputPrecision", None)
            else:
                op.properties["inputPrecision"] = InputPrecisionAttr(InputPrecision(self.precision))
            changed += 1
        return PassResult(print_triton(module), notes=[f"{changed} fp32 tt.dot now {self.precision}"])


@dataclass(frozen=True)
class LoadEviction(KernelPass):
    """Give `tt.load`s without an eviction policy one (`evict_first` for streamed data, `evict_last` for
    data reused by other programs).

    Helps kernels that stream through more data than the cache holds: `evict_first` keeps it from
    pushing out data that is reused. Sound: the eviction policy is a cache hint and does not change
    any value loaded.
    """

    name = "load-eviction"
    level = "ttir"
    policy: str = "evict_first"

    def precondition(self, ctx: PassContext) -> str | None:
        if self.policy not in {p.value for p in EvictionPolicy}:
            return f"policy must be one of {', '.join(p.value for p in EvictionPolicy)}, not {self.policy!r}"
        loads = [op for op in _module(ctx).ops() if isinstance(op, LoadOp)]
        if not loads:
            return "the kernel has no tt.load"
        if all(op.properties.get("evict") is not None for op in loads):
            return "every tt.load already has an eviction policy"
        return None

    def apply(self, ctx: PassContext) -> PassResult:
        module = _module(ctx)
        changed = 0
        for op in module.ops():
            if isinstance(op, LoadOp) and op.properties.get("evict") is None:
                op.properties["evict"] = EvictionPolicyAttr(EvictionPolicy(self.policy))
                changed += 1
        return PassResult(print_triton(module), notes=[f"{changed} tt.load given {self.policy}"])
