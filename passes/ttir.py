"""TTIR passes, written as xDSL rewrite patterns on the typed dialects (`kstrata.ir.dialects`).

Each pass gives its patterns (`RewritePass.patterns`); the pipeline parses the level once per level
group and the walker rewrites that module in place. Printing an unchanged module gives Triton's text
back byte for byte (`kstrata ir roundtrip`), so the only differences in the output are the ones a pass
makes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from xdsl.pattern_rewriter import PatternRewriter, RewritePattern, op_type_rewrite_pattern

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.dialects.tt import (
    DotOp,
    EvictionPolicy,
    EvictionPolicyAttr,
    InputPrecision,
    InputPrecisionAttr,
    LoadOp,
)
from kstrata.ir.tolerance import Tolerance
from kstrata.ir.triton_ir import TritonModule

from .base import PassContext, RewritePass, Rewrites

__all__ = ["DotPrecision", "LoadEviction"]

#: What Triton 3.6 accepts for `tt.dot` on fp32 operands, per backend.
_PRECISIONS = {"cuda": ("tf32", "tf32x3", "ieee", "bf16x3", "bf16x6"), "hip": ("ieee", "tf32", "bf16x3", "bf16x6")}

Precision = Literal["tf32", "tf32x3", "ieee", "bf16x3", "bf16x6"]
Policy = Literal["evict_first", "evict_last", "evict_normal"]


def _element_type(value_type: object) -> str:
    element = getattr(value_type, "element_type", None)
    return str(element) if element is not None else ""


def _is_fp32_dot(op: DotOp) -> bool:
    return _element_type(op.a.type) == "f32" and _element_type(op.b.type) == "f32"


def _fp32_dots(module: TritonModule) -> list[DotOp]:
    return [op for op in module.ops() if isinstance(op, DotOp) and _is_fp32_dot(op)]


def _precision(op: DotOp) -> str:
    attr = op.properties.get("inputPrecision")
    if attr is None:
        return "ieee"  # MLIR omits the default, IEEE
    assert isinstance(attr, InputPrecisionAttr)
    return str(attr.data)


@dataclass(frozen=True)
class _SetDotPrecision(RewritePattern):
    precision: str
    rewrites: Rewrites

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: DotOp, rewriter: PatternRewriter) -> None:
        if not _is_fp32_dot(op) or _precision(op) == self.precision:
            return
        if self.precision == "ieee":
            op.properties.pop("inputPrecision", None)
        else:
            op.properties["inputPrecision"] = InputPrecisionAttr(InputPrecision(self.precision))
        rewriter.notify_op_modified(op)
        self.rewrites.add(f"fp32 tt.dot now {self.precision}")


@dataclass(frozen=True)
class DotPrecision(RewritePass):
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
    precision: Precision = "tf32x3"

    def declared_tolerance(self) -> Tolerance:
        # A TF32 operand keeps 10 mantissa bits, so a dot's error is at most 2^-10 * sum|a_k*b_k|
        # (about 0.06 for unit-normal inputs and K = 100 in the worst case, sqrt(K) smaller typically);
        # the 3-pass splits keep about 2^-20 of it. Going back to ieee from tf32 moves results by
        # the TF32 error, so that direction declares the loose bound too. Larger K or larger inputs
        # need a looser tolerance than this declaration: verify then rejects, as it should.
        if self.precision in ("tf32x3", "bf16x3", "bf16x6"):
            return Tolerance(rtol=1e-4, atol=1e-4, why=f"dot products at {self.precision} instead of their precision")
        return Tolerance(rtol=1e-2, atol=1e-1, why=f"dot products at {self.precision} instead of their precision")

    @classmethod
    def space_values(cls, bundle: KernelBundle) -> dict[str, Sequence[Any]]:
        # the precisions the target accepts; the precondition drops the one the dots already use
        return {"precision": _PRECISIONS[bundle.target.backend]}

    def precondition(self, ctx: PassContext) -> str | None:
        allowed = _PRECISIONS[ctx.bundle.target.backend]
        if self.precision not in allowed:
            return f"{ctx.bundle.target} does not support input precision {self.precision} (allowed: {', '.join(allowed)})"
        dots = _fp32_dots(ctx.module)
        if not dots:
            return "the kernel has no tt.dot on fp32 operands"
        if all(_precision(op) == self.precision for op in dots):
            return f"every fp32 tt.dot already uses {self.precision}"
        return None

    def patterns(self, ctx: PassContext, rewrites: Rewrites) -> Sequence[RewritePattern]:
        return [_SetDotPrecision(self.precision, rewrites)]


@dataclass(frozen=True)
class _GiveEvictionPolicy(RewritePattern):
    policy: str
    rewrites: Rewrites

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: LoadOp, rewriter: PatternRewriter) -> None:
        if op.properties.get("evict") is not None:
            return
        op.properties["evict"] = EvictionPolicyAttr(EvictionPolicy(self.policy))
        rewriter.notify_op_modified(op)
        self.rewrites.add(f"tt.load given {self.policy}")


@dataclass(frozen=True)
class LoadEviction(RewritePass):
    """Give `tt.load`s without an eviction policy one (`evict_first` for streamed data, `evict_last` for
    data reused by other programs).

    Helps kernels that stream through more data than the cache holds: `evict_first` keeps it from
    pushing out data that is reused. Sound: the eviction policy is a cache hint and does not change
    any value loaded.
    """

    name = "load-eviction"
    level = "ttir"
    policy: Policy = "evict_first"

    @classmethod
    def space_values(cls, bundle: KernelBundle) -> dict[str, Sequence[Any]]:
        return {"policy": ("evict_first", "evict_last")}  # evict_normal is what a load without one does

    def precondition(self, ctx: PassContext) -> str | None:
        loads = [op for op in ctx.module.ops() if isinstance(op, LoadOp)]
        if not loads:
            return "the kernel has no tt.load"
        if all(op.properties.get("evict") is not None for op in loads):
            return "every tt.load already has an eviction policy"
        return None

    def patterns(self, ctx: PassContext, rewrites: Rewrites) -> Sequence[RewritePattern]:
        return [_GiveEvictionPolicy(self.policy, rewrites)]


