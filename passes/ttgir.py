"""TTGIR passes that re-lower TTIR with different launch options, through Triton's own TTGIR pipeline.

The number of warps and of software-pipelining stages decide a kernel's layouts, its shared-memory
buffers and its occupancy; Triton fixes them at compile time (autotuning picks among a few). These
passes produce the TTGIR Triton would have produced with other values, so that a search can try them
on a compiled kernel without its Python source.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kstrata.backends.rebuild import compile_options
from kstrata.ir.bundle import KernelBundle
from kstrata.ir.tolerance import Tolerance

from .base import KernelPass, PassContext, PassResult, option


def relower_ttgir(ctx: PassContext, overrides: dict[str, Any]) -> str:
    """Triton's TTIR -> TTGIR stage on the bundle's TTIR, with `overrides` applied to its options."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import Language
    from triton.compiler.compiler import make_backend

    bundle = ctx.bundle
    backend = make_backend(bundle.target.to_triton())
    options = backend.parse_options(compile_options(bundle, overrides))
    stages: dict[str, Any] = {}
    backend.add_stages(stages, options, Language.TRITON)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    with tempfile.TemporaryDirectory(prefix="kstrata-ttgir-") as tmp:
        path = Path(tmp) / f"{bundle.name}.ttir"
        path.write_text(bundle.text("ttir"))
        module = ir.parse_mlir_module(str(path), context)
        module.context = context
        metadata: dict[str, Any] = dict(bundle.metadata)
        return str(stages["ttgir"](module, metadata))


def _needs_ttir(ctx: PassContext, name: str, option_name: str) -> str | None:
    if "ttir" in ctx.bundle.levels:
        return None
    given = "a bare .ttgir file" if ctx.bundle.origin and ctx.bundle.origin.endswith(".ttgir") else "this kernel"
    return (f"{name} is a re-lowering option: it re-runs Triton's TTIR -> TTGIR stage with {option_name} changed, "
            f"so it needs the kernel's TTIR and metadata (a cache or dump entry, or a .ttir file), which {given} "
            "does not have; nothing was changed")


def _metadata_note(ctx: PassContext) -> list[str]:
    if any(k in ctx.bundle.metadata for k in ("num_warps", "num_stages")):
        return []
    return ["the input carries no Triton metadata: the other compile options are Triton's defaults"]


@dataclass(frozen=True)
class _Relowering(KernelPass):
    @classmethod
    def relowers(cls) -> bool:
        return True


@dataclass(frozen=True)
class NumWarps(_Relowering):
    """Re-lower the kernel with `n` warps per program (layouts, reductions and MMA tiling follow).

    Helps when a kernel is latency bound at its current warp count (more warps hide more latency) or
    register/occupancy bound (fewer warps, more programs per SM). Sound for every kernel up to the
    order of floating-point reductions: the reduction tree across threads follows the warp count, so
    `tl.sum`/`tl.max`-style results may differ in the last bits (measured on the H200: layernorm and
    rmsnorm outputs not bit-identical, within the kernels' tolerances). Launches must use the new block
    size (the override's metadata carries it).
    """

    name = "num-warps"
    level = "ttgir"
    tolerance = Tolerance(ulp=4, rtol=1e-5, atol=1e-6,
                          why="floating-point reductions reassociated (the reduction tree follows the warp count)")
    n: Literal[1, 2, 4, 8, 16, 32] = 8

    @classmethod
    def space_values(cls, bundle: KernelBundle) -> dict[str, Sequence[Any]]:
        return {"n": (2, 4, 8, 16)}  # the precondition drops the current count

    def precondition(self, ctx: PassContext) -> str | None:
        if (why := _needs_ttir(ctx, self.name, "num_warps")) is not None:
            return why
        if ctx.bundle.num_warps == self.n:
            return f"the kernel already uses {self.n} warps"
        return None

    def apply(self, ctx: PassContext) -> PassResult:
        return PassResult(relower_ttgir(ctx, {"num_warps": self.n}), {"num_warps": self.n},
                          [f"num_warps {ctx.bundle.num_warps or 'unknown (default 4)'} -> {self.n}", *_metadata_note(ctx)])


@dataclass(frozen=True)
class NumStages(_Relowering):
    """Re-lower the kernel with `n` software-pipelining stages for its loops.

    Helps loops that wait on global memory (matmul K loops, attention over K/V): more stages keep more
    loads in flight, at the cost of shared memory (which can lower occupancy or not fit). Sound for
    every kernel: pipelining reorders loads across iterations with the waits Triton inserts. Kernels
    without loops are unchanged.
    """

    name = "num-stages"
    level = "ttgir"
    n: int = option(4, range=(1, 8))

    @classmethod
    def space_values(cls, bundle: KernelBundle) -> dict[str, Sequence[Any]]:
        return {"n": (2, 3, 4, 5)}  # the precondition drops the current depth and loop-free kernels

    def precondition(self, ctx: PassContext) -> str | None:
        if (why := _needs_ttir(ctx, self.name, "num_stages")) is not None:
            return why
        if "scf.for" not in ctx.bundle.text("ttir"):
            return "the kernel has no scf.for loop to pipeline"
        if ctx.bundle.num_stages == self.n:
            return f"the kernel already uses {self.n} stages"
        return None

    def apply(self, ctx: PassContext) -> PassResult:
        return PassResult(relower_ttgir(ctx, {"num_stages": self.n}), {"num_stages": self.n},
                          [f"num_stages {ctx.bundle.num_stages or 'unknown (default 3)'} -> {self.n}", *_metadata_note(ctx)])
