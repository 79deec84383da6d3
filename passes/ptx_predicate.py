"""If-conversion of short forward branches in PTX (`ptx-predicate`).

The shape it converts:

    @%p bra TARGET;          // or @!%p
    <1..max_instructions instructions, comments, .loc>
    TARGET:

becomes the block's instructions guarded by the negated predicate (`@!%p`), without the branch. Sound
when, and only when (each checked; otherwise that branch is left alone):

- nothing else is between the branch and its target: no label (a block another branch could enter), no
  brace scope, no directive other than `.loc`;
- every instruction of the block is one the dependency model understands (`ptx_sched.ptx_effects`:
  arithmetic, conversions, moves, loads, stores, `cp.async.{ca,cg}`) and is not already guarded — no
  barrier, fence, atomic, branch, call or collective is put under a predicate;
- no instruction of the block writes the predicate: every guard then reads the value the branch read.

With the guard true the branch skipped the block and now every instruction is guarded off (a guarded-off
instruction does nothing: no register or memory write, no fault); with it false both run the block. The
result is the same on every thread; only divergence and issue change. ptxas often if-converts such
branches itself, in which case the cubin's code is unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from kstrata.backends.ptx import Blank, Comment, Directive, Instruction, Label, PtxModule, parse_ptx
from kstrata.ir.bundle import KernelBundle

from .base import KernelPass, PassContext, PassError, PassResult, ScheduleSpace, ScopeWindow, option
from .ptx_sched import ptx_effects
from .window import scope_lines, scope_option


@dataclass(frozen=True)
class Conversion:
    text: str
    converted: tuple[tuple[int, int], ...]  # (PTX line of the branch, instructions guarded)
    refused: tuple[tuple[int, str], ...]  # (PTX line of the branch, why not)


def _negate(guard: str) -> str:
    return guard.replace("@!", "@", 1) if guard.startswith("@!") else guard.replace("@", "@!", 1)


def _block(module: PtxModule, branch: int, limit: int) -> tuple[list[int], str | None]:
    """The instruction line indices between the branch at `branch` and its target, or why not convertible."""
    ins = module.lines[branch]
    assert isinstance(ins, Instruction) and ins.predicate
    target = ins.operands[0].strip() if ins.operands else ""
    guard = ins.predicate.lstrip("@!")
    block: list[int] = []
    for j in range(branch + 1, len(module.lines)):
        line = module.lines[j]
        if isinstance(line, Label):
            if line.name != target:
                return [], f"a label ({line.name}) inside the block"
            if not block:
                return [], "an empty block"
            return block, None
        if isinstance(line, (Blank, Comment)) or (isinstance(line, Directive) and line.name == ".loc"):
            continue
        if not isinstance(line, Instruction):
            return [], f"PTX line {line.lineno} is not an instruction the block may hold"
        effects = ptx_effects(line)
        if effects is None or line.predicate:
            return [], f"`{line.opcode}` (PTX line {line.lineno}) is a barrier, not understood, or already guarded"
        if guard in effects.defs:
            return [], f"`{line.opcode}` (PTX line {line.lineno}) writes the branch's predicate {guard}"
        block.append(j)
        if len(block) > limit:
            return [], f"more than {limit} instructions"
    return [], f"the target {target} does not follow the branch"


@functools.lru_cache(maxsize=32)
def if_convert(text: str, max_instructions: int, first_line: int = 1, last_line: int = 1 << 30) -> Conversion:
    module = parse_ptx(text)
    converted: list[tuple[int, int]] = []
    refused: list[tuple[int, str]] = []
    drop: list[int] = []
    for entry in module.entries:
        for index, ins in module.instructions(entry.name):
            if ins.base_opcode != "bra" or not ins.predicate or not first_line <= ins.lineno <= last_line:
                continue
            block, why = _block(module, index, max_instructions)
            if why is None and any(module.lines[j].lineno > last_line for j in block):
                why = f"its block runs past line {last_line}, the window's last"  # edit nothing outside the window
            if why is not None:
                refused.append((ins.lineno, why))
                continue
            guard = _negate(ins.predicate)
            for j in block:
                line = module.lines[j]
                assert isinstance(line, Instruction)
                module.lines[j] = replace(line, predicate=guard, pred_sep=" ")
            drop.append(index)
            converted.append((ins.lineno, len(block)))
    for index in sorted(drop, reverse=True):
        del module.lines[index]
    return Conversion(str(module), tuple(converted), tuple(refused))


@dataclass(frozen=True)
class PtxPredicate(KernelPass):
    """If-convert short forward branches: the instructions a predicated `bra` jumps over are guarded by
    the negated predicate instead, and the branch goes (`passes/ptx_predicate.py` lists when that is sound).

    Helps divergent short conditionals (an `if` over a few instructions, the branches of a piecewise
    approximation such as GELU's erf) by removing the branch and its reconvergence. `scope=hot` converts
    branches inside the hot window only, `scope=all` every one, `scope=lines:A-B[@DIGEST]` those within
    the PTX lines (a sampled window; refused when they are not the window's lines: `passes/window.py`). Sound by construction; checked on a GPU
    by the differential run like any PTX edit.
    """

    name = "ptx-predicate"
    level = "ptx"
    backends = ("cuda",)
    max_instructions: int = option(8, range=(1, 64))
    scope: str = scope_option("all")

    @classmethod
    def space_values(cls, bundle: KernelBundle) -> dict[str, Sequence[Any]]:
        return {"max_instructions": (4, 8, 16), "scope": ("all",)}

    @classmethod
    def windowed_values(cls, values: dict[str, Sequence[Any]], window: ScopeWindow) -> dict[str, Sequence[Any]]:
        """The sampled window beside `all`: converting the branches of the hot part only keeps the cold
        ones' branches (a branch that skips its block costs less than running it guarded off), and
        `schedule_space` drops the window's instance when it converts the same branches as `all`."""
        return {**values, "scope": (*values["scope"], window.spelling())}

    @classmethod
    def schedule_space(cls, bundle: KernelBundle, window: ScopeWindow | None = None) -> ScheduleSpace:
        """The limits worth trying: a larger `max_instructions` only when it converts more branches (and
        a window's instance only when it converts other branches than `all`)."""
        space = super().schedule_space(bundle, window)
        kept: list[KernelPass] = []
        seen: set[tuple[tuple[int, int], ...]] = set()
        for instance in space:
            assert isinstance(instance, PtxPredicate)
            converted = instance._converted(bundle.text("ptx")).converted
            if converted not in seen:
                seen.add(converted)
                kept.append(instance)
        return ScheduleSpace(tuple(kept), space.reason)

    def _convert(self, text: str) -> Conversion | str:
        """The conversion within the scope, or why the scope names no lines of `text`."""
        lines = scope_lines(self.scope, text, "ptx")
        return lines if isinstance(lines, str) else if_convert(text, self.max_instructions, *lines)

    def _converted(self, text: str) -> Conversion:
        result = self._convert(text)
        if isinstance(result, str):  # apply without its precondition: refuse, never edit other lines
            raise PassError(f"ptx-predicate: {result}")
        return result

    def precondition(self, ctx: PassContext) -> str | None:
        result = self._convert(ctx.text)
        if isinstance(result, str):
            return result
        if not result.converted:
            why = f" (first: PTX line {result.refused[0][0]}: {result.refused[0][1]})" if result.refused else ""
            return f"no short forward branch to if-convert{why}"
        return None

    def apply(self, ctx: PassContext) -> PassResult:
        result = self._converted(ctx.text)
        return PassResult(result.text, notes=[f"{len(result.converted)} branches if-converted "
                                              f"({sum(n for _, n in result.converted)} instructions guarded); "
                                              f"{len(result.refused)} left"])
