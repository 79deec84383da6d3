"""A pass defined outside kstrata: it stamps a comment line into the PTX."""

from __future__ import annotations

from dataclasses import dataclass

from kstrata.passes.base import KernelPass, PassContext, PassResult


@dataclass(frozen=True)
class PtxComment(KernelPass):
    """Append a comment line to the PTX (changes no instruction)."""

    name = "ptx-comment"
    level = "ptx"
    backends = ("cuda",)
    text: str = "hello"

    def apply(self, ctx: PassContext) -> PassResult:
        return PassResult(ctx.text.rstrip("\n") + f"\n// {self.text}\n")
