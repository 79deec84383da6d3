"""LLVM IR passes, run with llvmlite (LLVM 22, the same major version Triton 3.6 uses)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kstrata.ir.tolerance import Tolerance

from .base import KernelPass, PassContext, PassResult


def _kernel_args_span(text: str) -> tuple[int, int] | None:
    """Start and end offsets of the kernel definition's parameter list (parentheses balanced)."""
    m = re.search(r"^define\s+(?:[\w()]+\s+)*?(?:ptx_kernel|amdgpu_kernel)\s+void\s+@[\w.$]+\(", text, re.M)
    if m is None:
        return None
    depth = 1
    for i in range(m.end(), len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return m.end(), i
    return None


_PLAIN_GLOBAL_PTR = re.compile(r"ptr addrspace\(1\) (?!noalias)")


@dataclass(frozen=True)
class NoAliasArgs(KernelPass):
    """Mark the kernel's global pointer parameters `noalias`.

    Helps when loads through one argument are held back by stores through another that the compiler
    must assume may overlap: with `noalias` LLVM and ptxas may reorder, batch and vectorize them.
    Sound only when no two pointer arguments of any launch address overlapping memory; kstrata cannot
    prove that from the kernel alone, so the pass runs only with `assume=true`, a promise the caller
    makes (check it against recorded launches).
    """

    name = "noalias-args"
    level = "llir"
    assume: bool = False

    def precondition(self, ctx: PassContext) -> str | None:
        if not self.assume:
            return ("cannot prove that pointer arguments never overlap; pass noalias-args{assume=true} when no "
                    "launch passes overlapping buffers")
        span = _kernel_args_span(ctx.text)
        if span is None:
            return "no kernel definition found in the LLVM IR"
        if not _PLAIN_GLOBAL_PTR.search(ctx.text[span[0]:span[1]]):
            return "every global pointer parameter is already noalias (or there is none)"
        return None

    def apply(self, ctx: PassContext) -> PassResult:
        text = ctx.text
        span = _kernel_args_span(text)
        assert span is not None
        new_args, count = _PLAIN_GLOBAL_PTR.subn("ptr addrspace(1) noalias ", text[span[0]:span[1]])
        return PassResult(text[:span[0]] + new_args + text[span[1]:], notes=[f"{count} pointer parameters marked noalias"])


@dataclass(frozen=True)
class FlushDenormals(KernelPass):
    """Let fp32 math flush denormals to zero (`"denormal-fp-math-f32"="preserve-sign"` on the kernel).

    Helps fp32 kernels heavy in division, square roots and transcendentals: the code generators then
    use the flush-to-zero forms (`.ftz` on NVIDIA), which are shorter and faster. Not bit-exact:
    results differ when an input, an intermediate or a result is a denormal (magnitude below 2^-126),
    which is flushed to a signed zero; the pass declares that tolerance and is sound for kernels whose
    data and intermediates never reach that range.
    """

    name = "flush-denormals"
    level = "llir"
    tolerance = Tolerance(rtol=1e-6, atol=2.0**-126, why="fp32 denormals flushed to signed zero (|x| < 2^-126)")

    def precondition(self, ctx: PassContext) -> str | None:
        if '"denormal-fp-math-f32"="preserve-sign' in ctx.text:
            return "the kernel already flushes fp32 denormals"
        if _kernel_args_span(ctx.text) is None:
            return "no kernel definition found in the LLVM IR"
        if not re.search(r"\bfloat\b", ctx.text):
            return "the kernel does no fp32 arithmetic"
        return None

    def apply(self, ctx: PassContext) -> PassResult:
        text = ctx.text
        span = _kernel_args_span(text)
        assert span is not None
        line_end = text.index("\n", span[1])
        header = text[span[1]:line_end]
        groups = re.findall(r"#(\d+)", header)
        attr = '"denormal-fp-math-f32"="preserve-sign,preserve-sign"'
        if not groups:  # no attribute group on the kernel: add the attribute inline
            brace = header.rindex("{")
            new_header = header[:brace] + attr + " " + header[brace:]
            return PassResult(text[:span[1]] + new_header + text[line_end:], notes=["kernel flushes fp32 denormals"])
        group = groups[0]
        m = re.search(rf"^attributes #{group} = \{{(?P<body>[^\n]*)\}}", text, re.M)
        if m is None:
            raise ValueError(f"attribute group #{group} of the kernel is not defined")
        body = re.sub(r'\s*"denormal-fp-math-f32"="[^"]*"', "", m.group("body"))
        new_body = body.rstrip() + f" {attr} "
        return PassResult(text[:m.start("body")] + new_body + text[m.end("body"):],
                          notes=[f"attribute group #{group}: {attr}"])
