"""Interleaved program ids (`interleaved-pid`): a 1-D grid run as `slices` equal slices side by side, so that
the programs in flight at one time are at the same position of every slice.

Where it pays: a kernel whose loads repeat with the program id. Inductor's pointwise kernel of a LayerNorm
over (64, 256, 256) with 16 rows (`triton_poi_fused_native_layer_norm_2`, gap task 01) loads the weight and
bias at `xindex % 4194304`: each 16 MB row of the output reads the same 32 MB of weight and bias. In program
order the grid sweeps row after row, and by the time the next row reaches a position the weights it needs have
left L2 (64 MB of traffic later), so by this reasoning they come from DRAM 16 times, about 1.05 GB for 570 MB
of data (the traffic was not profiled). On an H100 (2026-12-07, `compiled-bench-2026-12-07-gaps`) the kernel
ran at 57% of the bandwidth its buffers need.
Interleaved by 16, consecutive programs take the same 2 KB of every row, and the weights are read once: the
compiled-kernel search timed it 1.627x faster, 350 -> 215 us, on that H100 (`compiled-search-2026-12-07-gaps01`).

The rewrite replaces `tt.get_program_id x`, everywhere it is used, by

    lin(pid) = (pid % slices) * (programs / slices) + pid / slices

so program `pid` does exactly what program `lin(pid)` did. `lin` is a permutation of `0 .. programs-1` when
`programs % slices == 0` (the slice is `pid % slices`, the position `pid / slices`, and `slice * C + position`
takes each value below `slices * C = programs` once); on any other grid the inserted code keeps the original
program id. `slices` is a constant at least 2, so nothing divides by zero, and `lin(pid) < programs`, so
nothing overflows. Axes y and z are untouched: the permutation of x within each (y, z) is one of the whole grid.

Sound when the programs are independent (their order is not observable): the rules of `grouped-pid`
(`grouped_pid.independence`) are checked, and the pass refuses otherwise. Distinct pointer arguments are taken
to be distinct buffers; the compiled-kernel search offers it only where the launch records show that no
written buffer overlaps another argument (`agents.compiled.spaces.NEEDS_NOALIAS`), since the differential
run's replays give each argument its own buffer and would not show an overlap. Bit-exact: each program computes
the same ops in the same order. It is offered only where a load's address depends on the program id through a
remainder by a value the program id does not change (`i % K`, a row-major GEMM's `pid % tiles_n`): a kernel
whose programs share nothing gains nothing from their order. A GEMM that already groups its program ids
(GROUP_SIZE_M, Inductor's `triton_mm`) is refused: its order is the one made for L2.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from xdsl.dialects import arith
from xdsl.dialects.builtin import IntegerType
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter, RewritePattern, op_type_rewrite_pattern

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.dialects.tt import FuncOp, GetNumProgramsOp, GetProgramIdOp, ProgramIDDim, ProgramIDDimAttr
from kstrata.ir.triton_ir import TritonModule

from .base import PassContext, RewritePass, Rewrites, option
from .grouped_pid import _READS, find_decomposition, independence, renumber_program_id

_REMAINDERS = (arith.RemSIOp, arith.RemUIOp)


def _forward(func: FuncOp, seeds: set[SSAValue]) -> set[SSAValue]:
    """The values of `func` computed from `seeds`: an op's results (and the block arguments of its regions) when
    one of its operands is, and the results and iteration arguments of a region op whose regions yield one."""
    reached = set(seeds)
    changed = True
    while changed:  # values reach around loops' back edges; the set only grows, so this ends
        changed = False
        for op in func.walk():
            if op is func:
                continue
            hit = any(v in reached for v in op.operands)
            if not hit and op.regions:
                hit = any(v in reached for region in op.regions for b in region.blocks
                          if b.last_op is not None for v in b.last_op.operands)
            if not hit:
                continue
            new = [r for r in op.results if r not in reached]
            new += [a for region in op.regions for b in region.blocks for a in b.args if a not in reached]
            if new:
                reached.update(new)
                changed = True
    return reached


def periodic_load(module: TritonModule) -> str | None:
    """`None` when some load's address depends on the program id through a remainder by a constant (the load
    repeats as the program id grows), or why no load does."""
    funcs = [op for op in module.ops() if isinstance(op, FuncOp)]
    if len(funcs) != 1:
        return f"expected one tt.func, found {len(funcs)}"
    pids = [op for op in funcs[0].walk() if isinstance(op, GetProgramIdOp) and op.axis.data == ProgramIDDim.X]
    if not pids:
        return "the kernel does not read tt.get_program_id x"
    if len(pids) > 1:
        return f"the kernel reads tt.get_program_id x {len(pids)} times"
    from_pid = _forward(funcs[0], {pids[0].result})
    # a remainder of a program-id index by a value the program id does not change: `i % K`, or a GEMM's
    # `pid % tiles_n`
    wraps: set[SSAValue] = {op.results[0] for op in funcs[0].walk()
                             if isinstance(op, _REMAINDERS) and op.operands[0] in from_pid
                             and op.operands[1] not in from_pid}
    if not wraps:
        return "no index computed from the program id wraps around (no `% n`): no load repeats"
    repeating = _forward(funcs[0], wraps)
    if not any(op.name in _READS and op.operands[0] in repeating for op in funcs[0].walk()):
        return "an index wraps around (`% n`), but no load's address uses it: no load repeats"
    return None


def _interleaved_ops(pid: SSAValue, slices: int) -> tuple[list[Operation], SSAValue]:
    """The ops computing `lin(pid)` (the module docstring), and its value."""
    i32 = IntegerType(32)
    ops: list[Operation] = []

    def add(op: Operation) -> SSAValue:
        ops.append(op)
        return op.results[0]

    zero = add(arith.ConstantOp.from_int_and_width(0, i32))
    s = add(arith.ConstantOp.from_int_and_width(slices, i32))
    programs = add(GetNumProgramsOp.create(properties={"axis": ProgramIDDimAttr(ProgramIDDim.X)},
                                           result_types=[i32]))
    per_slice = add(arith.DivSIOp(programs, s))
    whole = add(arith.CmpiOp(add(arith.RemSIOp(programs, s)), zero, "eq"))
    start = add(arith.MuliOp(add(arith.RemSIOp(pid, s)), per_slice))  # < slices * per_slice = programs
    linear = add(arith.AddiOp(start, add(arith.DivSIOp(pid, s))))
    remapped = add(arith.SelectOp(whole, linear, pid))
    return ops, remapped


@dataclass(frozen=True)
class _Interleave(RewritePattern):
    slices: int
    rewrites: Rewrites = field(compare=False)

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: GetProgramIdOp, rewriter: PatternRewriter) -> None:
        if op.axis.data != ProgramIDDim.X:
            return
        pid = op.result
        uses = len(list(pid.uses))
        ops, remapped = _interleaved_ops(pid, self.slices)
        renumber_program_id(rewriter, pid, ops, remapped, op)
        self.rewrites.add(f"tt.get_program_id x interleaved over {self.slices} slices ({uses} uses)")


@dataclass(frozen=True)
class InterleavedProgramIds(RewritePass):
    """Run a 1-D grid as `slices` slices side by side (program `pid` does what `(pid % slices) * (programs /
    slices) + pid / slices` did), so that data the slices share is read while it is in L2.

    Helps a kernel whose loads repeat with the program id (an operand broadcast along the grid, such as a
    LayerNorm's weight over its rows) when the repeated data is larger than L2 can hold across one period.
    Sound when the programs are independent (checked as `grouped-pid` checks it); bit-exact; a grid that is
    not a whole number of slices runs in its original order.
    """

    name = "interleaved-pid"
    level = "ttir"
    also_at = ("ttgir",)  # the ops it matches and inserts are scalar: no layouts involved
    slices: int = option(16, range=(2, 1024), doc="slices of the grid run side by side")

    @classmethod
    def space_values(cls, bundle: KernelBundle) -> dict[str, Sequence[Any]]:
        # 16: a batch of 16 or more rows (the gap task has 16); 4 and 64 for fewer and for many
        return {"slices": (16, 4, 64)}

    def precondition(self, ctx: PassContext) -> str | None:
        grouped = find_decomposition(ctx.module)
        if isinstance(grouped, str) and grouped.startswith("the kernel already groups"):
            # a GEMM that already walks its tiles GROUP_SIZE_M rows at a time (Inductor's `triton_mm`): its own
            # order is the one made for L2, and interleaving would undo it
            return grouped
        return periodic_load(ctx.module) or independence(ctx.module)

    def patterns(self, ctx: PassContext, rewrites: Rewrites) -> Sequence[RewritePattern]:
        return [_Interleave(self.slices, rewrites)]
