"""PTX passes: edits of the PTX model (loads' cache operators and state) and ptxas option sets."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from kstrata.backends.ptx import Instruction, PtxModule, parse_ptx
from kstrata.ir.bundle import KernelBundle

from .base import KernelPass, PassContext, PassResult, option

_MEMORY_ORDER = {"volatile", "relaxed", "acquire", "release", "weak", "mmio"}
_LOAD_COPS = ("ca", "cg", "cs", "lu", "cv")
_STORE_COPS = ("wb", "cg", "cs", "wt")


def _param_flow(module: PtxModule) -> tuple[dict[int, set[str]], dict[int, set[str]]]:
    """For every global load and store/atomic (by line index), the kernel parameters its address may
    derive from: a forward dataflow over registers, from `ld.param` through every instruction."""
    derived: dict[str, set[str]] = {}
    loads: dict[int, set[str]] = {}
    writes: dict[int, set[str]] = {}
    instructions = module.instructions()
    # Loops carry derivations around back edges: sweep until nothing changes (the sets only grow, so
    # this ends; a fixed number of sweeps could stop before a long loop-carried chain is seen).
    changed = True
    while changed:
        before = {reg: len(params) for reg, params in derived.items()}
        for index, ins in instructions:
            regs = set(re.findall(r"%[\w]+", " ".join(ins.operands[1:]))) if ins.operands else set()
            sources: set[str] = set()
            if ins.opcode.startswith("ld.param"):
                sources = set(re.findall(r"\[\s*([\w$]+)", ins.operands[-1]))
            for reg in regs:
                sources |= derived.get(reg, set())
            opcode = ins.opcode
            if opcode.startswith(("st.global", "atom.global", "red.global")):
                writes[index] = set().union(*(derived.get(r, set()) for r in re.findall(r"%[\w]+", _address(ins))))
                if opcode.startswith("atom"):
                    writes[index] |= sources
                continue
            if opcode.startswith("ld.global"):
                loads[index] = set().union(*(derived.get(r, set()) for r in re.findall(r"%[\w]+", _address(ins))))
            if ins.operands:
                for dst in re.findall(r"%[\w]+", ins.operands[0]):
                    derived[dst] = derived.get(dst, set()) | sources
        changed = before != {reg: len(params) for reg, params in derived.items()}
    return loads, writes


def _address(ins: Instruction) -> str:
    """The `[address]` operand of a memory instruction. Not simply the last operand: loads and stores
    with an L2 cache policy end with the policy register (`ld.global.L2::cache_hint.b32 %r, [%rd3], %rd2`)."""
    return next((op for op in ins.operands if op.lstrip().startswith("[")), "")


def _is_plain_global_load(ins: Instruction) -> bool:
    mods = ins.modifiers
    return (ins.base_opcode == "ld" and mods[:1] == ("global",) and "nc" not in mods
            and not _MEMORY_ORDER & set(mods))


def _edit(module: PtxModule, index: int, opcode: str) -> None:
    line = module.lines[index]
    assert isinstance(line, Instruction)
    module.lines[index] = replace(line, opcode=opcode)


@dataclass(frozen=True)
class LoadNonCoherent(KernelPass):
    """Turn `ld.global` into `ld.global.nc`: loads through the read-only (texture) data path.

    Helps kernels that re-read inputs across threads (gathers, stencils, matrix operands loaded to
    registers): the read-only cache has its own capacity and bandwidth. Sound only when the memory a
    load reads is not written during the kernel: kstrata checks that no store or atomic of the kernel
    goes through a pointer derived from a parameter that a load reads through, but it cannot know
    whether two *different* parameters point into overlapping buffers, so the pass runs only with
    `assume_noalias=true`.
    """

    name = "ld-nc"
    level = "ptx"
    backends = ("cuda",)
    assume_noalias: bool = False

    def precondition(self, ctx: PassContext) -> str | None:
        module = parse_ptx(ctx.text)
        loads, writes = _param_flow(module)
        plain = [i for i, _ in module.instructions() if _is_plain_global_load(module.lines[i])]  # type: ignore[arg-type]
        if not plain:
            return "no plain ld.global to turn into ld.global.nc"
        # Only pointer parameters name memory; integer parameters (sizes, strides) feed every address.
        pointers = {p.name for p in module.entry().params if ".ptr" in p.attributes or p.type == ".u64"}
        written = set().union(*writes.values()) if writes else set()
        unknown = [module.lines[i].lineno for i in plain if not loads.get(i)]
        if unknown:
            return (f"cannot tell which parameter the load at PTX line {unknown[0]} reads through (its address "
                    "does not derive from a parameter in this analysis)")
        read = set().union(*(loads.get(i, set()) for i in plain))
        both = sorted(read & written & pointers)
        if both:
            return f"the kernel writes through {', '.join(both)}, which it also loads from"
        if not self.assume_noalias:
            return ("ld.global.nc is unsound if an output buffer overlaps an input; pass ld-nc{assume_noalias=true} "
                    "when no launch passes overlapping buffers")
        return None

    def apply(self, ctx: PassContext) -> PassResult:
        module = parse_ptx(ctx.text)
        count = 0
        for index, ins in module.instructions():
            if _is_plain_global_load(ins):
                _edit(module, index, ins.opcode.replace("ld.global", "ld.global.nc", 1))
                count += 1
        return PassResult(str(module), notes=[f"{count} loads now ld.global.nc"])


def _hintable(module: PtxModule) -> list[tuple[int, Instruction]]:
    """Global loads and stores without a cache operator, memory order or eviction priority."""
    out = []
    for index, ins in module.instructions():
        mods = ins.modifiers
        if mods[:1] != ("global",) or _MEMORY_ORDER & set(mods) or set(mods) & {*_LOAD_COPS, *_STORE_COPS}:
            continue
        if any(m.startswith("L1::") or m.startswith("L2::") for m in mods):
            continue  # already carries an eviction priority; cache operators and priorities don't mix
        out.append((index, ins))
    return out


@dataclass(frozen=True)
class CacheHints(KernelPass):
    """Add PTX cache operators to global loads and stores that have none.

    `loads=cs` / `stores=cs` (cache streaming: likely accessed once) keep single-use data from evicting
    reused data in L1/L2 — the usual win for elementwise and reduction kernels over large arrays;
    `loads=cg` bypasses L1; `lu` marks a last use. Always sound: cache operators are performance hints
    and do not change the values a load or store sees within a kernel.
    """

    name = "cache-hints"
    level = "ptx"
    backends = ("cuda",)
    loads: Literal["ca", "cg", "cs", "lu", "cv", "none"] = "cs"
    stores: Literal["wb", "cg", "cs", "wt", "none"] = "cs"

    @classmethod
    def space_values(cls, bundle: KernelBundle) -> dict[str, Sequence[Any]]:
        # streaming (cs) and L1-bypassing (cg) loads, streaming stores; the others rarely win
        return {"loads": ("cs", "cg", "none"), "stores": ("cs", "none")}

    def precondition(self, ctx: PassContext) -> str | None:
        if self.loads == "none" and self.stores == "none":
            return "loads=none and stores=none: nothing to do"
        hintable = _hintable(parse_ptx(ctx.text))
        if not any((ins.base_opcode == "ld" and self.loads != "none" and "nc" not in ins.modifiers)
                   or (ins.base_opcode == "st" and self.stores != "none") for _, ins in hintable):
            return "no global load or store without a cache operator or eviction priority"
        return None

    def apply(self, ctx: PassContext) -> PassResult:
        module = parse_ptx(ctx.text)
        count = 0
        for index, ins in _hintable(module):
            mods = ins.modifiers
            if ins.base_opcode == "ld" and self.loads != "none" and "nc" not in mods:
                _edit(module, index, ins.opcode.replace("ld.global", f"ld.global.{self.loads}", 1))
                count += 1
            elif ins.base_opcode == "st" and self.stores != "none":
                _edit(module, index, ins.opcode.replace("st.global", f"st.global.{self.stores}", 1))
                count += 1
        return PassResult(str(module), notes=[f"{count} loads/stores given a cache operator"])


@dataclass(frozen=True)
class PtxasOptionsPass(KernelPass):
    """Assemble the PTX with another ptxas option set (the PTX text is unchanged).

    `opt_level` sets ptxas's optimization level; `extra` adds flags verbatim (e.g.
    `--allow-expensive-optimizations=true`). Sound: ptxas options do not change the program's semantics.
    Triton passes them as `ptx_options`, which the override's cubin and metadata carry. (ptxas ignores
    `--maxrregcount` for Triton's kernels, whose entries carry `.reqntid`; use `max-registers`.)
    """

    name = "ptxas-options"
    level = "ptx"
    backends = ("cuda",)
    opt_level: Literal[0, 1, 2, 3, 4] = 3
    extra: str = ""

    @classmethod
    def space_values(cls, bundle: KernelBundle) -> dict[str, Sequence[Any]]:
        return {"opt_level": (2, 3), "extra": ("", "--allow-expensive-optimizations=true")}

    def precondition(self, ctx: PassContext) -> str | None:
        if self.opt_level == 3 and not self.extra:
            return "these are ptxas's defaults: nothing would change"
        return None

    def apply(self, ctx: PassContext) -> PassResult:
        flags = [f"-O{self.opt_level}"] + ([self.extra] if self.extra else [])
        existing = ctx.bundle.metadata.get("ptx_options") or ""
        options = " ".join(x for x in (str(existing), *flags) if x)
        return PassResult(ctx.text, {"ptx_options": options}, [f"ptxas options: {options}"])


@dataclass(frozen=True)
class MaxRegisters(KernelPass):
    """Cap the registers per thread with a `.maxnreg` directive on the entry.

    Helps kernels whose occupancy is limited by registers and which tolerate a few spills or a tighter
    schedule (memory-bound kernels with high register counts). Sound: register allocation does not
    change semantics (ptxas spills to local memory if it must). Triton's own `maxnreg` option emits
    the same directive.
    """

    name = "max-registers"
    level = "ptx"
    backends = ("cuda",)
    n: int = option(128, range=(16, 255))

    @classmethod
    def space_values(cls, bundle: KernelBundle) -> dict[str, Sequence[Any]]:
        # caps below what the kernel uses (the precondition drops the others; without a cubin,
        # whose register count says which caps bind, every cap is a guess)
        return {"n": (32, 64, 96, 128, 168)}

    def precondition(self, ctx: PassContext) -> str | None:
        from kstrata.backends.resources import resource_usage

        entry = parse_ptx(ctx.text).entry()
        if entry.maxnreg is not None:
            return f"the entry already has .maxnreg {entry.maxnreg}"
        if "cubin" in ctx.bundle.levels:
            used = resource_usage(ctx.bundle).registers
            if used <= self.n:
                return f"the kernel uses {used} registers, not more than {self.n}"
        return None

    def apply(self, ctx: PassContext) -> PassResult:
        module = parse_ptx(ctx.text)
        entry = module.entry()
        lines = ctx.text.split("\n")
        # the directive goes right before the body's opening brace, after .reqntid/.maxntid
        brace = module.lines[entry.body_start].lineno - 1
        lines.insert(brace, f".maxnreg {self.n}")
        return PassResult("\n".join(lines), notes=[f".maxnreg {self.n}"])
