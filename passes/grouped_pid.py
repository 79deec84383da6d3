"""Grouped program-id ordering (`grouped-pid`): the `GROUP_SIZE_M` swizzle of a 2-D tiled kernel's
1-D grid, as a TTIR/TTGIR rewrite. Written to be copied: a precondition computed on the typed module,
one xDSL `RewritePattern` that inserts ops and rewires uses, options checked from type hints, and a
schedule space.

A kernel launched over a 1-D grid of `tiles_m * tiles_n` programs that splits its program id as
`pid_m = pid / tiles_n, pid_n = pid % tiles_n` runs its tiles row by row: consecutive programs share
one row panel of A but sweep every column panel of B, so B is streamed from DRAM once per tile row.
With `GROUP_SIZE_M = G`, consecutive programs walk G tile rows column by column, and the programs
resident together touch G row panels and a few column panels, which stay in L2.

The rewrite does not touch the kernel's own decomposition: it replaces the program id, everywhere it
is used, by a permutation of it,

    lin(pid) = pid_m' * tiles_n + pid_n'     (pid_m', pid_n' the grouped tile of pid)

so program `pid` now does exactly what program `lin(pid)` did. That is sound whenever the programs
are independent (their order is not observable) and `lin` is a permutation of `0 .. num_programs-1`:

- independence (checked here): no atomics, no volatile loads, no calls or inline assembly with side
  effects, no memory op kstrata cannot trace to a pointer argument, and no pointer argument that is
  both loaded from and stored to (a program could read what another wrote; that is allowed only when
  the accesses are proven disjoint, which this pass does not try). Pointer arguments that alias each
  other are the launch's promise, as for every kernel whose programs may run in any order.
- permutation (guarded at run time): `lin` is one exactly when `tiles_n > 0` and
  `num_programs % tiles_n == 0`; otherwise the inserted code keeps the original program id, so a
  launch whose grid is not a whole number of tile rows runs unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from xdsl.dialects import arith, scf
from xdsl.dialects.builtin import IntegerType
from xdsl.ir import Block, BlockArgument, Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter, RewritePattern, op_type_rewrite_pattern
from xdsl.rewriter import InsertPoint

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.dialects.tt import (
    CallOp,
    FuncOp,
    GetNumProgramsOp,
    GetProgramIdOp,
    PointerType,
    ProgramIDDim,
    ProgramIDDimAttr,
)
from kstrata.ir.triton_ir import TritonModule

from .base import PassContext, RewritePass, Rewrites, option

#: Memory ops whose pointer operand (operand 0) kstrata traces; other ops that touch memory refuse.
_READS = {"tt.load", "tt.descriptor_load", "tt.descriptor_gather", "ttg.async_copy_global_to_local",
          "tt.experimental_descriptor_load"}
_WRITES = {"tt.store", "tt.descriptor_store", "tt.descriptor_scatter"}
_MEMORY_WORDS = ("load", "store", "atomic", "scatter", "gather", "copy", "tma", "prefetch", "reduce_add")


@dataclass(frozen=True)
class Decomposition:
    """Where a kernel splits its program id into a tile row and column: `pid / tiles_n`, `pid % tiles_n`."""

    pid: GetProgramIdOp
    tiles_n: SSAValue
    #: The op after which the remapped program id can be computed (the later of pid and tiles_n).
    anchor: Operation


def _owner_in(block: Block, op: Operation) -> Operation | None:
    """The op of `block` that is or contains `op`."""
    current: Operation | None = op
    while current is not None and current.parent_block() is not block:
        current = current.parent_op()
    return current


def _derivations(func: FuncOp) -> tuple[dict[SSAValue, frozenset[int]], list[str]]:
    """For every value of `func`, the pointer arguments (by index) its value may derive from.

    A forward dataflow: an op's results derive from its operands; an `scf.for`'s iteration arguments
    and results from their initial value and what the body yields for them; other region ops'
    block arguments and results from all their operands and yields. A loaded value derives from
    nothing (it is data, not an address) unless it is itself a pointer, which this analysis refuses.
    Returns the map and the reasons it had to give up.
    """
    body = func.regions[0].blocks.first
    assert body is not None
    derived: dict[SSAValue, frozenset[int]] = {}
    for i, arg in enumerate(body.args):
        derived[arg] = frozenset({i}) if isinstance(arg.type, PointerType) else frozenset()
    problems: list[str] = []

    def of(v: SSAValue) -> frozenset[int]:
        return derived.get(v, frozenset())

    changed = True
    while changed:  # loops carry derivations around back edges; the sets only grow, so this ends
        before = {k: len(v) for k, v in derived.items()}
        for op in func.walk():
            if op is func:
                continue
            if op.name in _READS:
                for r in op.results:
                    if isinstance(r.type, PointerType) or "!tt.ptr" in str(r.type):
                        problems.append(f"`{op.name}` loads a pointer (pointer chasing is not traced)")
                    derived[r] = frozenset()
                continue
            incoming = frozenset().union(*(of(v) for v in op.operands)) if op.operands else frozenset()
            if isinstance(op, scf.ForOp):
                yielded = op.body.block.last_op
                block_args = op.body.block.args[1:]  # after the induction variable
                for i, (init, arg, res) in enumerate(zip(op.iter_args, block_args, op.results, strict=True)):
                    back = of(yielded.operands[i]) if yielded is not None and i < len(yielded.operands) else frozenset()
                    derived[arg] = of(arg) | of(init) | back
                    derived[res] = of(res) | of(init) | back
                continue
            if op.regions:
                terminators = [b.last_op for region in op.regions for b in region.blocks if b.last_op is not None]
                from_yields = frozenset().union(*(of(v) for t in terminators for v in t.operands)) \
                    if terminators else frozenset()
                for region in op.regions:
                    for b in region.blocks:
                        for a in b.args:
                            derived[a] = of(a) | incoming | from_yields
                for res in op.results:
                    derived[res] = of(res) | incoming | from_yields
                continue
            for res in op.results:
                derived[res] = of(res) | incoming
        changed = before != {k: len(v) for k, v in derived.items()}
    return derived, sorted(set(problems))


def _flag(op: Operation, name: str) -> bool:
    """Whether the boolean property or attribute `name` of `op` is set to true."""
    attr = op.properties.get(name, op.attributes.get(name))
    value = getattr(attr, "value", None)
    return bool(getattr(value, "data", False))


def independence(module: TritonModule) -> str | None:
    """`None` when the kernel's programs are independent by the rules above, or why they may not be."""
    funcs = [op for op in module.ops() if isinstance(op, FuncOp)]
    if len(funcs) != 1:
        return f"expected one tt.func, found {len(funcs)}"
    func = funcs[0]
    body = func.regions[0].blocks.first
    assert body is not None
    derived, problems = _derivations(func)
    if problems:
        return problems[0]
    names = module.value_names
    pointer_name = {i: names.get(a, f"argument {i}") for i, a in enumerate(body.args)}
    reads: set[int] = set()
    writes: set[int] = set()
    for op in func.walk():
        name = op.name
        if "atomic" in name:
            return f"the kernel uses `{name}`: programs may communicate through it"
        if isinstance(op, CallOp):
            return "the kernel calls another function, which this pass does not look into"
        if name == "tt.elementwise_inline_asm" and not _flag(op, "pure"):
            return "the kernel runs inline assembly that may have side effects"
        if name == "tt.load" and _flag(op, "isVolatile"):
            return "the kernel has a volatile load (it may wait on another program)"
        if name in _READS or name in _WRITES:
            bases = derived.get(op.operands[0], frozenset())
            if not bases:
                return f"cannot tell which pointer argument `{name}` accesses"
            (reads if name in _READS else writes).update(bases)
        elif any(word in name for word in _MEMORY_WORDS) and ".local_" not in name and "local_" not in name:
            return f"`{name}` touches memory in a way this pass does not trace"
    both = sorted(reads & writes)
    if both:
        return (f"the kernel loads from {', '.join(pointer_name[i] for i in both)}, which it also stores to: a "
                "program could read what another one writes")
    return None


def find_decomposition(module: TritonModule) -> Decomposition | str:
    """The kernel's `pid / tiles_n`, `pid % tiles_n` split of `tt.get_program_id x`, or why there is none."""
    pids = [op for op in module.ops() if isinstance(op, GetProgramIdOp) and op.axis.data == ProgramIDDim.X]
    if not pids:
        return "the kernel does not read tt.get_program_id x"
    if len(pids) > 1:
        return f"the kernel reads tt.get_program_id x {len(pids)} times"
    pid_op = pids[0]
    pid = pid_op.result
    divisors: dict[SSAValue, set[str]] = {}
    quotients: list[Operation] = []
    for use in pid.uses:
        op = use.operation
        if isinstance(op, arith.DivSIOp | arith.DivUIOp | arith.RemSIOp | arith.RemUIOp) and use.index == 0:
            kind = "div" if isinstance(op, arith.DivSIOp | arith.DivUIOp) else "rem"
            divisors.setdefault(op.operands[1], set()).add(kind)
            quotients.append(op)
    split = [d for d, kinds in divisors.items() if kinds == {"div", "rem"}]
    if not split:
        return ("the program id is not split into a tile row and column (pid / n and pid % n by one value n): "
                "nothing to group")
    if len(split) > 1:
        return "the program id is split by more than one value"
    tiles_n = split[0]
    for q in quotients:
        if q.operands[1] is not tiles_n:
            continue
        for use in q.results[0].uses:
            if isinstance(use.operation, arith.DivSIOp | arith.DivUIOp | arith.RemSIOp | arith.RemUIOp):
                return ("the kernel already groups its program ids (the row/column it splits off is split again, "
                        "as GROUP_SIZE_M ordering does)")
    block = pid_op.parent_block()
    assert block is not None
    anchor: Operation = pid_op
    if isinstance(tiles_n, BlockArgument):
        if not isinstance(tiles_n.block.parent_op(), FuncOp):
            return "the tile count the program id is divided by is a loop or region argument"
    else:
        owner = tiles_n.owner
        assert isinstance(owner, Operation)
        if owner.parent_block() is not block:
            return "the tile count the program id is divided by is computed in another region"
        if block.get_operation_index(owner) > block.get_operation_index(pid_op):
            anchor = owner  # the renumbering needs the tile count: it goes after both
    at = block.get_operation_index(anchor)
    for use in pid.uses:
        owner_op = _owner_in(block, use.operation)
        if owner_op is None or block.get_operation_index(owner_op) <= at:
            return "the program id is used before the tile count it is divided by is known"
    return Decomposition(pid_op, tiles_n, anchor)


def _grouped_ops(pid: SSAValue, tiles_n: SSAValue, group: int) -> tuple[list[Operation], SSAValue]:
    """The ops computing the permuted program id (see the module docstring), and its value.

    Every divisor is at least 1 on every path, so no division can fault, including on a grid the
    guard sends back to the original program id.
    """
    i32 = IntegerType(32)
    ops: list[Operation] = []

    def add(op: Operation) -> SSAValue:
        ops.append(op)
        return op.results[0]

    zero = add(arith.ConstantOp.from_int_and_width(0, i32))
    one = add(arith.ConstantOp.from_int_and_width(1, i32))
    g = add(arith.ConstantOp.from_int_and_width(group, i32))
    programs = add(GetNumProgramsOp.create(properties={"axis": ProgramIDDimAttr(ProgramIDDim.X)},
                                           result_types=[i32]))
    n_ok = add(arith.CmpiOp(tiles_n, zero, "sgt"))
    n = add(arith.SelectOp(n_ok, tiles_n, one))
    tiles_m = add(arith.DivSIOp(programs, n))
    whole = add(arith.CmpiOp(add(arith.RemSIOp(programs, n)), zero, "eq"))
    ok = add(arith.AndIOp(n_ok, whole))
    rows_cap = add(arith.MaxSIOp(add(arith.MinSIOp(g, tiles_m)), one))  # G, or fewer rows if the grid has fewer
    per_group = add(arith.MuliOp(rows_cap, n))                          # <= tiles_m * n = programs: no overflow
    group_id = add(arith.DivSIOp(pid, per_group))
    first_m = add(arith.MuliOp(group_id, rows_cap))
    rows = add(arith.MaxSIOp(add(arith.MinSIOp(add(arith.SubiOp(tiles_m, first_m)), rows_cap)), one))
    inner = add(arith.RemSIOp(pid, per_group))
    pid_m = add(arith.AddiOp(first_m, add(arith.RemSIOp(inner, rows))))
    pid_n = add(arith.DivSIOp(inner, rows))
    linear = add(arith.AddiOp(add(arith.MuliOp(pid_m, n)), pid_n))
    remapped = add(arith.SelectOp(ok, linear, pid))
    return ops, remapped


def renumber_program_id(rewriter: PatternRewriter, pid: SSAValue, ops: list[Operation], remapped: SSAValue,
                        after: Operation) -> None:
    """Insert `ops` (computing `remapped` from `pid`) after `after`, and make every other use of `pid` read
    `remapped`: the renumbering `grouped-pid` and `interleaved-pid` share."""
    rewriter.insert(ops, InsertPoint.after(after))
    created = set(ops)
    rewriter.replace_uses_with_if(pid, remapped, lambda use: use.operation not in created)


@dataclass(frozen=True)
class _GroupProgramIds(RewritePattern):
    target: Decomposition
    group: int
    rewrites: Rewrites = field(compare=False)

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: GetProgramIdOp, rewriter: PatternRewriter) -> None:
        if op is not self.target.pid:
            return
        pid = op.result
        users = [u.operation for u in pid.uses]
        ops, remapped = _grouped_ops(pid, self.target.tiles_n, self.group)
        renumber_program_id(rewriter, pid, ops, remapped, self.target.anchor)
        self.rewrites.add(f"tt.get_program_id x renumbered GROUP_SIZE_M={self.group} ({len(users)} uses)")


@dataclass(frozen=True)
class GroupedProgramIds(RewritePass):
    """Walk a 2-D tiled kernel's tiles `group` rows at a time (GROUP_SIZE_M program-id ordering) for L2 reuse.

    Helps matmul-like kernels launched over a 1-D grid that split the program id row-major
    (`pid // tiles_n`, `pid % tiles_n`) when the operands are larger than L2: grouped, the programs
    resident at one time share a few row and column panels instead of streaming all of B per tile
    row. Sound when the kernel's programs are independent — no atomics, no volatile loads, no load
    from a pointer argument it also stores to (checked; the pass refuses otherwise) — because the
    rewrite only renumbers programs: program p does what program lin(p) did, and the inserted code
    falls back to the original numbering at run time unless the grid is a whole number of tile rows.
    Bit-exact: every tile is computed by the same ops in the same order. Unsound (refused) for kernels
    whose programs communicate (split-K with atomics or locks, stream-K, in-place updates).
    """

    name = "grouped-pid"
    level = "ttir"
    also_at = ("ttgir",)  # the ops it matches and inserts are scalar: no layouts involved
    group: int = option(8, range=(2, 64), doc="tile rows per group (Triton's GROUP_SIZE_M)")

    @classmethod
    def space_values(cls, bundle: KernelBundle) -> dict[str, Sequence[Any]]:
        return {"group": (4, 8, 16)}

    def precondition(self, ctx: PassContext) -> str | None:
        found = find_decomposition(ctx.module)
        if isinstance(found, str):
            return found
        return independence(ctx.module)

    def patterns(self, ctx: PassContext, rewrites: Rewrites) -> Sequence[RewritePattern]:
        found = find_decomposition(ctx.module)
        assert not isinstance(found, str), found
        return [_GroupProgramIds(found, self.group, rewrites)]
